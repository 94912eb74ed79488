"""Exercise 03 — TRPO: conjugate gradient, Fisher-vector products, the step to the trust-region boundary, the
backtracking line search."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.distributions import Categorical, Independent, Normal, kl_divergence

from minigrpo_course.grading.core import IN_PLACE_HINT, Call, Case, Item, Made, Spread, WrongAnswer, f64, randn
from minigrpo.trust_region import conjugate_gradient, fisher_vector_product, flat_grad, flat_params, set_flat_params

TITLE = "TRPO"

# --------------------------------------------------------------------------- shared inputs (fresh each call)


def random_spd(n: int, seed: int, cond: float | None = None) -> torch.Tensor:
    """A random symmetric positive-definite float64 matrix (eigenvalues log-spread up to ``cond``)."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    if cond is None:
        m = torch.randn(n, n, generator=g, dtype=torch.float64)
        return m @ m.T / n + 0.5 * torch.eye(n, dtype=torch.float64)
    eig = torch.logspace(0, math.log10(cond), n, dtype=torch.float64)
    return (q * eig) @ q.T


def matvec(A: torch.Tensor):
    """v ↦ A v, the only access to A that conjugate gradient needs."""
    return lambda v: A @ v


def random_vec(n: int, seed: int, norm: float | None = None) -> torch.Tensor:
    """A random float64 vector (scaled to ``norm`` when given)."""
    v = randn(n, seed=seed)
    return v if norm is None else norm * v / v.norm()


# --------------------------------------------------------------------------- 03.1 conjugate_gradient


def _cg_skeleton(Avp, b, iters=10, tol=1e-5, *, x0_is_b=False, update_r=True, r_sign=-1.0, beta="fr", conjugate=True,
                 stop="relative"):
    """CG with a switch for each typical mistake. The input check is kept, so that each wrong answer
    differs from the reference by its one mistake only."""
    if b.ndim != 1:
        raise ValueError("b must be 1-D")
    x = b.clone() if x0_is_b else torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r @ r
    # the stopping rule: r·r ≤ tol²·(b·b) (the reference), or one of two typical mistakes
    threshold = {"relative": tol * tol * rr, "absolute": tol * tol, "tol_not_squared": tol * rr}.get(stop)
    for _ in range(iters):
        if threshold is not None and rr <= threshold:
            break
        Ap = Avp(p)
        alpha = rr / (p @ Ap)
        x = x + alpha * p
        if update_r:
            r = r + r_sign * alpha * Ap
        rr_new = r @ r
        if not conjugate:
            p = r.clone()
        else:
            p = r + ((rr_new / rr) if beta == "fr" else (rr / rr_new)) * p
        rr = rr_new
    return x


_STOP_HINT = ("stop at the top of an iteration once ‖r‖ ≤ tol·‖b‖, i.e. r·r ≤ tol²·(b·b), with b·b computed "
              "once from the b you were given")

_DIAG = Made(matvec, Made(torch.diag, f64([1.0, 2.0, 4.0])))

CG_CASES = [
    Case("diagonal 3×3: exact after 3 iterations", (_DIAG, f64([1.0, 1.0, 1.0]), 3)),
    Case("a 2×2 SPD matrix, solved in 2 iterations (x = [1/11, 7/11])",
         (Made(matvec, f64([[4.0, 1.0], [1.0, 3.0]])), f64([1.0, 2.0]), 2)),
    Case("fewer iterations than unknowns: the CG iterate after 2 steps",
         (Made(matvec, Made(random_spd, 6, seed=3)), Made(random_vec, 6, seed=4), 2), rtol=1e-7, atol=1e-10),
    Case("b = 0 gives x = 0 (the loop must stop: ‖r‖ = 0 ≤ tol·‖b‖ = 0)", (_DIAG, f64([0.0, 0.0, 0.0]), 3),
         hint="with b = 0 the residual is 0 from the start: " + _STOP_HINT + " (≤, not <: here both sides are 0), "
              "before dividing by pᵀAp = 0."),
    Case("a tiny b (‖b‖ ≈ 1.7e-8, tol left at its default 1e-5) gets the same solution, scaled: x = 1e-8·[1, 0.5, 0.25]",
         (_DIAG, f64([1e-8, 1e-8, 1e-8]), 3), rtol=1e-7, atol=1e-20,
         hint="the stop must be relative to b: " + _STOP_HINT + ". A small policy gradient is a small b, and "
              "it still needs its natural-gradient direction."),
    Case("stops as soon as ‖r‖ ≤ tol·‖b‖ = 0.1: after 11 iterations (‖r‖/‖b‖ = 1.9e-3 after 10, 8.5e-4 after 11)",
         (Made(matvec, Made(random_spd, 30, seed=11, cond=10.0)), Made(random_vec, 30, seed=12, norm=100.0), 100),
         {"tol": 1e-3}, rtol=1e-9, atol=1e-12, hint=_STOP_HINT + "; here that is ‖r‖ ≤ 0.1."),
    Case("b must be a flat vector: shape (3, 1) is refused with a ValueError",
         (Made(matvec, Made(torch.eye, 3, dtype=torch.float64)), torch.ones(3, 1, dtype=torch.float64), 3),
         hint="check `b.ndim == 1` first and raise ValueError otherwise (CG works on flat parameter vectors)."),
    Case("random SPD 20×20 (condition number 1e3), run to convergence",
         (Made(matvec, Made(random_spd, 20, seed=5, cond=1e3)), Made(random_vec, 20, seed=6), 200), {"tol": 1e-12},
         quick=False, rtol=1e-6, atol=1e-9),
    Case("random SPD 40×40, exactly 40 iterations",
         (Made(matvec, Made(random_spd, 40, seed=7)), Made(random_vec, 40, seed=8), 40), {"tol": 1e-12},
         quick=False, rtol=1e-6, atol=1e-9),
]

CONJUGATE_GRADIENT = Item(
    exercise="03", number=1, function="conjugate_gradient", title="conjugate gradient from matrix-vector products",
    reference=conjugate_gradient, cases=CG_CASES,
    wrong_answers=[
        WrongAnswer("no stopping test", partial(_cg_skeleton, stop=None),
                    "the result is NaN when b = 0: " + _STOP_HINT + " — with ≤, not < (0 ≤ 0) — before computing "
                    "α = r·r / pᵀAp, which would be 0/0."),
        WrongAnswer("absolute tolerance", partial(_cg_skeleton, stop="absolute"),
                    "the stop is absolute: r·r ≤ tol² does not depend on b, so a tiny b (a small policy gradient) "
                    "stops at once with x = 0, and a large one iterates too long. Make it relative: r·r ≤ tol²·(b·b)."),
        WrongAnswer("tol not squared", partial(_cg_skeleton, stop="tol_not_squared"),
                    "tol bounds the norm ratio ‖r‖/‖b‖, so compare squared norms with tol²: r·r ≤ tol²·(b·b) "
                    "(r·r ≤ tol·(b·b) stops at ‖r‖ ≤ √tol·‖b‖, far too early)."),
        WrongAnswer("residual not updated", partial(_cg_skeleton, update_r=False),
                    "the residual r = b − A x must follow x: after x ← x + α p, update r ← r − α A p."),
        WrongAnswer("residual sign", partial(_cg_skeleton, r_sign=+1.0),
                    "sign error in the residual update: x ← x + α p changes b − A x by −α A p, so r ← r − α A p."),
        WrongAnswer("β inverted", partial(_cg_skeleton, beta="inverted"),
                    "β is inverted: the new direction is p ← r_new + (r_newᵀr_new / r_oldᵀr_old) p (new over old)."),
        WrongAnswer("steepest descent", partial(_cg_skeleton, conjugate=False),
                    "this is steepest descent (p ← r): CG keeps the directions A-conjugate with "
                    "p ← r + β p, β = r_newᵀr_new / r_oldᵀr_old, which makes it exact in n steps."),
        WrongAnswer("starts at x = b", partial(_cg_skeleton, x0_is_b=True),
                    "start from x = 0, so that the first residual b − A x is b itself (you started at x = b but "
                    "kept r = b)."),
    ],
)

# --------------------------------------------------------------------------- 03.2 fisher_vector_product


def tiny_categorical_problem(seed: int = 0, obs_dim: int = 3, n_actions: int = 3, hidden: tuple = (4,),
                             n_states: int = 5):
    """A small float64 softmax policy, a few states, and ``mean_kl()`` = mean KL(π_old ‖ π_θ) with π_old frozen.

    Returns (net, params, obs, mean_kl). The last layer is scaled up so the policy is far from uniform.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layers, n_in = [], obs_dim
        for h in hidden:
            layers += [torch.nn.Linear(n_in, h), torch.nn.Tanh()]
            n_in = h
        layers.append(torch.nn.Linear(n_in, n_actions))
        net = torch.nn.Sequential(*layers).double()
        with torch.no_grad():
            net[-1].weight.mul_(4.0)
        obs = torch.randn(n_states, obs_dim, dtype=torch.float64)
    params = list(net.parameters())
    with torch.no_grad():
        old_logits = net(obs)

    def mean_kl() -> torch.Tensor:
        return kl_divergence(Categorical(logits=old_logits), Categorical(logits=net(obs))).mean()

    return net, params, obs, mean_kl


def tiny_gaussian_problem(seed: int = 0, obs_dim: int = 3, act_dim: int = 2, n_states: int = 6):
    """A float64 diagonal-Gaussian policy (linear mean, learned log std) and its frozen-old ``mean_kl``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        mean_net = torch.nn.Linear(obs_dim, act_dim).double()
        log_std = torch.nn.Parameter(0.3 * torch.randn(act_dim, dtype=torch.float64))
        obs = torch.randn(n_states, obs_dim, dtype=torch.float64)
    params = [*mean_net.parameters(), log_std]

    def dist():
        mu = mean_net(obs)
        return Independent(Normal(mu, log_std.exp().expand_as(mu)), 1)

    with torch.no_grad():
        old_mu, old_std = mean_net(obs), log_std.exp().expand(n_states, act_dim).clone()

    def mean_kl() -> torch.Tensor:
        return kl_divergence(Independent(Normal(old_mu, old_std), 1), dist()).mean()

    return params, mean_kl


def softmax_policy_kl(seed: int = 0, hidden: tuple = (4,), n_actions: int = 3):
    """(mean_kl, params) of :func:`tiny_categorical_problem`."""
    _, params, _, mean_kl = tiny_categorical_problem(seed, hidden=hidden, n_actions=n_actions)
    return mean_kl, params


def gaussian_policy_kl(seed: int = 0):
    """(mean_kl, params) of :func:`tiny_gaussian_problem`."""
    params, mean_kl = tiny_gaussian_problem(seed)
    return mean_kl, params


def products(*seeds: int) -> Call:
    """Take ``fvp = fn(mean_kl, params, damping)``, then apply it to one random vector per seed."""
    def run(fn, inputs):
        fvp = inputs(fn)
        n = sum(p.numel() for p in inputs["params"])
        out = [fvp(random_vec(n, seed)) for seed in seeds]
        return out[0] if len(seeds) == 1 else torch.stack(out)

    return Call(run, f"then fvp(random_vec(n_params, s)) for s in {list(seeds)}; compared: the products")


def _fvp_first_derivative(mean_kl, params, damping=0.1):
    params = list(params)

    def fvp(v):
        return flat_grad(mean_kl(), params) + damping * v  # ∇KL, which is 0 at θ_old

    return fvp


def _fvp_no_retain(mean_kl, params, damping=0.1):
    params = list(params)
    grad = flat_grad(mean_kl(), params, create_graph=True)
    return lambda v: flat_grad(grad @ v, params) + damping * v


def _fvp_no_create_graph(mean_kl, params, damping=0.1):
    params = list(params)
    grad = flat_grad(mean_kl(), params)  # a plain tensor: no graph to differentiate again
    return lambda v: flat_grad(grad @ v, params, retain_graph=True) + damping * v


FVP_CASES = [
    Case("tiny softmax policy (3 obs → 4 tanh → 3 actions, 31 parameters, 5 states), damping 0.1: (F + 0.1·I) v",
         (Spread(softmax_policy_kl, seed=0), 0.1), call=products(100), rtol=1e-7, atol=1e-10),
    Case("damping 0: the plain Fisher-vector product F v", (Spread(softmax_policy_kl, seed=0), 0.0),
         call=products(50), rtol=1e-7, atol=1e-10),
    Case("the product can be taken many times (CG calls it once per iteration)",
         (Spread(softmax_policy_kl, seed=0), 0.1), call=products(100, 101, 102), rtol=1e-7, atol=1e-10),
    Case("two hidden layers, 4 actions, damping 0.05",
         (Spread(softmax_policy_kl, seed=3, hidden=(4, 4), n_actions=4), 0.05), call=products(100, 101),
         quick=False, rtol=1e-7, atol=1e-10),
    Case("a diagonal-Gaussian policy with a learned log std (continuous actions; linear mean 3 → 2, 6 states)",
         (Spread(gaussian_policy_kl, seed=1), 0.05), call=products(200, 201), quick=False, rtol=1e-7, atol=1e-10),
]

FISHER_VECTOR_PRODUCT = Item(
    exercise="03", number=2, function="fisher_vector_product", title="Fisher-vector products by double backprop",
    reference=fisher_vector_product, cases=FVP_CASES,
    wrong_answers=[
        WrongAnswer("damping forgotten", lambda mean_kl, params, damping: fisher_vector_product(mean_kl, params, 0.0),
                    "you returned F v: add the damping term, (F + damping·I) v = F v + damping * v."),
        WrongAnswer("damping multiplied", lambda mean_kl, params, damping: (
                    lambda v: damping * fisher_vector_product(mean_kl, params, 0.0)(v)),
                    "damping is added, not multiplied: return F v + damping * v (it shifts every eigenvalue "
                    "of F up by `damping`)."),
        WrongAnswer("first derivative only", _fvp_first_derivative,
                    "the gradient of the KL is 0 at θ_old (the KL is at its minimum there), so you got just "
                    "damping * v. Differentiate once more: F v = ∇θ (∇θKL · v), with the first gradient taken "
                    "with create_graph=True."),
        WrongAnswer("graph not retained", _fvp_no_retain,
                    "the second call failed: the second backward pass frees the graph of ∇KL. Pass "
                    "retain_graph=True to it so that fvp can be called again and again."),
        WrongAnswer("no create_graph", _fvp_no_create_graph,
                    "the first gradient must stay differentiable: torch.autograd.grad(kl, params, "
                    "create_graph=True), otherwise ∇KL · v has no graph to differentiate a second time."),
    ],
)

# --------------------------------------------------------------------------- 03.3 trpo_full_step


def trpo_full_step(x: torch.Tensor, Fx: torch.Tensor, max_kl: float) -> torch.Tensor:
    """The reference: scale the search direction x to the boundary ½ sᵀF s = max_kl."""
    if x.ndim != 1 or x.shape != Fx.shape:
        raise ValueError(f"x and Fx must be flat vectors of the same shape, got {tuple(x.shape)} and {tuple(Fx.shape)}")
    xFx = x @ Fx
    if not xFx > 0:
        raise ValueError(f"xᵀFx must be positive (F is positive definite), got {float(xFx):.3g}")
    return torch.sqrt(2 * max_kl / xFx) * x


def _checked(scale):
    """A wrong answer: the reference's input checks, then ``scale(xᵀx, xᵀFx, δ) · x`` (the one mistake)."""
    def step(x, Fx, max_kl):
        trpo_full_step(x, Fx, max_kl)  # same refusals as the reference
        return scale(x @ x, x @ Fx, max_kl) * x

    return step


_step_no_two = _checked(lambda xx, xFx, d: torch.sqrt(d / xFx))
_step_no_sqrt = _checked(lambda xx, xFx, d: 2 * d / xFx)
_step_euclidean = _checked(lambda xx, xFx, d: torch.sqrt(2 * d / xx))
_step_inverted = _checked(lambda xx, xFx, d: torch.sqrt(2 * d * xFx))


def direction(n: int, seed: int):
    """(x, Fx): a random direction x (seed + 1) and F x for F = random_spd(n, seed)."""
    x = random_vec(n, seed + 1)
    return x, random_spd(n, seed) @ x


def _with_kl(fn, inputs):
    s, x, Fx = inputs(fn), inputs["x"], inputs["Fx"]
    beta = (s @ x) / (x @ x)  # the step is s = β·x, so ½ sᵀF s = ½ β² xᵀF x
    return {"step": s, "½ sᵀF s": 0.5 * beta**2 * (x @ Fx)}


WITH_KL = Call(_with_kl, "compared: the step s and ½ sᵀF s (= ½ β² xᵀFx for s = β·x)")

_NEG_HINT = "compute xFx = x @ Fx and raise ValueError unless it is > 0 (F is positive definite; 0 would divide by 0)."

STEP_CASES = [
    Case("hand-checkable: xᵀFx = 2, δ = 0.01 gives β = 0.1", (f64([1.0, 0.0]), f64([2.0, 0.0]), 0.01)),
    Case("the full step lands on the trust-region boundary: ½ sᵀF s = δ", (Spread(direction, 6, seed=1), 0.02),
         call=WITH_KL, rtol=1e-9, atol=1e-12),
    Case("no positive curvature along x is refused with a ValueError", (f64([1.0, 0.0]), f64([0.0, 1.0]), 0.01),
         hint=_NEG_HINT),
    Case("x and Fx of different shapes are refused with a ValueError", (f64([1.0, 1.0, 1.0]), f64([1.0, 1.0]), 0.01),
         hint="check that x is 1-D and x.shape == Fx.shape, and raise ValueError otherwise."),
    Case("a 200-dimensional problem, δ = 0.05", (Spread(direction, 200, seed=10), 0.05), call=WITH_KL,
         quick=False, rtol=1e-9, atol=1e-12),
]

TRPO_FULL_STEP = Item(
    exercise="03", number=3, function="trpo_full_step", title="the step to the trust-region boundary",
    reference=trpo_full_step, cases=STEP_CASES,
    wrong_answers=[
        WrongAnswer("missing factor 2", _step_no_two,
                    "the quadratic model of the KL is ½ sᵀF s: setting ½ β² xᵀFx = δ gives β = sqrt(2δ / xᵀFx) "
                    "(the ½ is where the 2 comes from)."),
        WrongAnswer("no square root", _step_no_sqrt,
                    "the KL grows with the square of the step: solve ½ β² xᵀFx = δ for β, which needs a square root."),
        WrongAnswer("Euclidean length", _step_euclidean,
                    "you used xᵀx: the trust region is measured by the KL, i.e. by F, so use xᵀFx = x @ Fx."),
        WrongAnswer("inverted", _step_inverted,
                    "the ratio is upside down: a direction of high curvature (large xᵀFx) must get a *smaller* "
                    "step, β = sqrt(2δ / xᵀFx)."),
    ],
)


# --------------------------------------------------------------------------- 03.4 line_search


def line_search(surrogate, mean_kl, old_params: torch.Tensor, full_step: torch.Tensor, expected_improvement: float,
                max_kl: float, max_backtracks: int = 10, shrink: float = 0.5, accept_ratio: float = 0.1):
    """The reference: try old_params + shrink^k · full_step for k = 0, …, max_backtracks − 1 and return the first
    whose measured KL is ≤ max_kl and whose surrogate improvement is > 0 and ≥ accept_ratio · shrink^k ·
    expected_improvement, with k; when none qualifies, (old_params, None). ``surrogate(θ)`` and ``mean_kl(θ)`` take
    a flat parameter vector and return Python floats. Pure: nothing is written in place (the package's
    ``trust_region.backtracking_line_search`` is the same search on the live parameters of a module)."""
    if old_params.ndim != 1 or full_step.shape != old_params.shape:
        raise ValueError(f"old_params and full_step must be flat vectors of the same shape, got "
                         f"{tuple(old_params.shape)} and {tuple(full_step.shape)}")
    base = float(surrogate(old_params))
    for k in range(max_backtracks):
        fraction = shrink**k
        params = old_params + fraction * full_step
        improvement = float(surrogate(params)) - base
        if float(mean_kl(params)) <= max_kl and improvement > 0 and \
                improvement >= accept_ratio * fraction * expected_improvement:
            return params, k
    return old_params, None


def _ls_variant(surrogate, mean_kl, old_params, full_step, expected_improvement, max_kl, max_backtracks=10,
                shrink=0.5, accept_ratio=0.1, *, check_kl=True, check_gain=True, ratio="scaled", on_failure="old",
                extra_tries=0, first=0, count_shift=0, fixed_shrink=None, in_place=False):
    """The search with one typical mistake switched on (each wrong answer below switches one knob); the input
    check is the reference's, so a wrong answer differs from it by its one mistake only."""
    if old_params.ndim != 1 or full_step.shape != old_params.shape:
        raise ValueError("old_params and full_step must be flat vectors of the same shape")
    base = float(surrogate(old_params))
    params = old_params
    for k in range(max_backtracks + extra_tries):
        fraction = (fixed_shrink or shrink) ** (k + first)
        if in_place:
            old_params += fraction * full_step  # every try moves the caller's tensor further
            params = old_params
        else:
            params = old_params + fraction * full_step
        improvement = float(surrogate(params)) - base
        needed = accept_ratio * (fraction if ratio == "scaled" else 1.0) * expected_improvement
        gain_ok = improvement > 0 and (ratio == "none" or improvement >= needed)
        if (float(mean_kl(params)) <= max_kl or not check_kl) and (gain_ok or not check_gain):
            return params, k + count_shift
    return (params if on_failure == "last" else old_params), None


def line_problem(gain: float, curvature: float, kl: float, predicted: float | None = None, n: int = 3, seed: int = 0,
                 step_n: int | None = None):
    """(surrogate, mean_kl, old_params, full_step, expected_improvement) for a search whose numbers are known along
    the line θ = old_params + f · full_step: improvement(f) = gain·f − curvature·f², KL(f) = kl·f², and the predicted
    improvement of the full step ``predicted`` (default: gain, the slope at f = 0). float64, n parameters (a
    full_step of ``step_n`` entries instead, to test the refusal of mismatched shapes)."""
    theta0, step = random_vec(n, seed), random_vec(step_n or n, seed + 1)

    def fraction(theta: torch.Tensor) -> float:  # f for a θ on the line
        return float((theta - theta0) @ step / (step @ step))

    def surrogate(theta: torch.Tensor) -> float:
        f = fraction(theta)
        return 0.5 + gain * f - curvature * f * f

    def mean_kl(theta: torch.Tensor) -> float:
        return kl * fraction(theta) ** 2

    return surrogate, mean_kl, theta0.clone(), step, gain if predicted is None else predicted


def policy_problem(seed: int = 0, max_kl: float = 0.01, stretch: float = 1.0):
    """(surrogate, mean_kl, old_params, full_step, expected_improvement) of a real TRPO step: the tiny softmax policy
    of 03.2, random actions and advantages, the natural-gradient step to the KL boundary (package CG), times
    ``stretch``. The two functions load θ into the policy, then evaluate (as a trainer would)."""
    net, params, obs, mean_kl_now = tiny_categorical_problem(seed, n_states=8)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        old_logp_all = torch.log_softmax(net(obs), -1)
    actions = torch.randint(0, old_logp_all.shape[-1], (len(obs),), generator=g)
    adv = torch.randn(len(obs), generator=g, dtype=torch.float64)
    old_logp = old_logp_all.gather(1, actions[:, None]).squeeze(1)

    def surrogate_now() -> torch.Tensor:
        logp = torch.log_softmax(net(obs), -1).gather(1, actions[:, None]).squeeze(1)
        return (torch.exp(logp - old_logp) * adv).mean()

    grad = flat_grad(surrogate_now(), params)
    fvp = fisher_vector_product(mean_kl_now, params, 0.1)
    x = conjugate_gradient(fvp, grad, 10)
    step = stretch * torch.sqrt(2 * max_kl / (x @ fvp(x))) * x
    theta0 = flat_params(params)

    def at(fn):
        def evaluate(theta: torch.Tensor) -> float:
            set_flat_params(params, theta)
            with torch.no_grad():
                return fn().item()
        return evaluate

    return at(surrogate_now), at(mean_kl_now), theta0, step.detach(), float(grad @ step)


def _accepted(fn, inputs):
    out = inputs(fn)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"line_search must return a pair (params, backtracks), got {type(out).__name__}")
    return {"params": out[0], "backtracks": out[1]}


ACCEPTED = Call(_accepted, "compared: the parameters returned and the number of backtracks (None: no step accepted)")

_KL_ONLY = "accept a step only if BOTH hold: the measured KL ≤ max_kl AND the surrogate improved (by > 0 and by at " \
           "least accept_ratio · fraction · expected_improvement)."
_NONE_HINT = ("when no fraction qualifies, return the OLD parameters (as given, not the last step you tried) and None: "
              "TRPO then skips this update rather than take a step that broke the trust region.")

LS_CASES = [
    Case("the full step is accepted: improvement(f) = f − 0.2f², KL(f) = 0.005f² ≤ δ = 0.01 at f = 1 (0 backtracks)",
         (Spread(line_problem, 1.0, 0.2, 0.005), 0.01), call=ACCEPTED, rtol=1e-9, atol=1e-12),
    Case("KL(f) = 0.5f² breaks δ = 0.01 until f = 1/8 (3 backtracks); the surrogate improves at every f",
         (Spread(line_problem, 1.0, 0.2, 0.5), 0.01), call=ACCEPTED, rtol=1e-9, atol=1e-12),
    Case("the surrogate overshoots, improvement(f) = f − 3f² (< 0 at f = 1 and 1/2), KL is fine: 2 backtracks",
         (Spread(line_problem, 1.0, 3.0, 0.005), 0.01), call=ACCEPTED, rtol=1e-9, atol=1e-12),
    Case("improvement(f) = f − 0.95f² is positive at f = 1 (0.05) but below 10% of the predicted 1.0: 1 backtrack",
         (Spread(line_problem, 1.0, 0.95, 0.005), 0.01), call=ACCEPTED, rtol=1e-9, atol=1e-12),
    Case("the bar scales with the step: improvement 0.3f vs predicted 1.0f clears 10% at every f; KL(f) = 0.5f² "
         "gives 3 backtracks", (Spread(line_problem, 0.3, 0.0, 0.5, predicted=1.0), 0.01), call=ACCEPTED,
         rtol=1e-9, atol=1e-12,
         hint="the bar is a share of the improvement predicted for the step actually tried: accept_ratio · fraction "
              "· expected_improvement (expected_improvement is the full step's)."),
    Case("KL(f) = 100f² needs f ≤ 0.01: nothing is accepted in max_backtracks = 4 tries → (old_params, None)",
         (Spread(line_problem, 1.0, 0.2, 100.0), 0.01, 4), call=ACCEPTED, rtol=1e-9, atol=1e-12, hint=_NONE_HINT),
    Case("KL(f) = 100f² first fits at f = 1/128, the 8th fraction; max_backtracks = 7 tries stop at 1/64 → None",
         (Spread(line_problem, 1.0, 0.2, 100.0), 0.01, 7), call=ACCEPTED, rtol=1e-9, atol=1e-12,
         hint="max_backtracks is the number of fractions tried, the full step included: f = shrink^k for "
              "k = 0, …, max_backtracks − 1."),
    Case("shrink = 0.8 and accept_ratio = 0: KL(f) = 0.02f² ≤ 0.01 first at f = 0.64 (2 backtracks)",
         (Spread(line_problem, 1.0, 0.2, 0.02), 0.01), {"shrink": 0.8, "accept_ratio": 0.0}, call=ACCEPTED,
         rtol=1e-9, atol=1e-12, hint="use the arguments shrink and accept_ratio, not 0.5 and 0.1 written in."),
    Case("old_params (3 entries) and full_step (4 entries) of different shapes are refused with a ValueError",
         (Spread(line_problem, 1.0, 0.2, 0.005, step_n=4), 0.01), call=ACCEPTED,
         hint="check that old_params is 1-D and full_step.shape == old_params.shape; raise ValueError otherwise."),
    Case("a real TRPO step of a softmax policy (03.2's), δ = 0.01", (Spread(policy_problem, seed=0), 0.01),
         call=ACCEPTED, quick=False, rtol=1e-7, atol=1e-10),
    Case("the same policy with a step 8× too long: backtracks needed", (Spread(policy_problem, seed=1, stretch=8.0), 0.01),
         call=ACCEPTED, quick=False, rtol=1e-7, atol=1e-10),
]

LINE_SEARCH = Item(
    exercise="03", number=4, function="line_search", title="the backtracking line search",
    reference=line_search, cases=LS_CASES,
    wrong_answers=[
        WrongAnswer("only the KL checked", partial(_ls_variant, check_gain=False),
                    "you checked only the KL: the quadratic model can also overshoot the *surrogate* (it may get "
                    "worse along a long step). " + _KL_ONLY),
        WrongAnswer("only the improvement checked", partial(_ls_variant, check_kl=False),
                    "you checked only the improvement: the step must also stay inside the trust region as measured, "
                    "mean_kl(θ) ≤ max_kl (the quadratic model of the KL is only an approximation). " + _KL_ONLY),
        WrongAnswer("improvement > 0 only", partial(_ls_variant, ratio="none"),
                    "an improvement that is positive but far below the prediction means the model is wrong there: "
                    "also require improvement ≥ accept_ratio · fraction · expected_improvement."),
        WrongAnswer("bar not scaled by the fraction", partial(_ls_variant, ratio="unscaled"),
                    "the bar must shrink with the step: a step of fraction f is predicted to gain f · "
                    "expected_improvement, so require improvement ≥ accept_ratio · f · expected_improvement."),
        WrongAnswer("the last try returned on failure", partial(_ls_variant, on_failure="last"), _NONE_HINT),
        WrongAnswer("one try too many", partial(_ls_variant, extra_tries=1),
                    "off by one: try max_backtracks fractions in all, shrink^0 = 1 (the full step) to "
                    "shrink^(max_backtracks − 1): `for k in range(max_backtracks)`."),
        WrongAnswer("full step never tried", partial(_ls_variant, first=1),
                    "off by one: the first try is the full step itself (fraction shrink^0 = 1); shrink only after a "
                    "rejected try."),
        WrongAnswer("tries counted, not backtracks", partial(_ls_variant, count_shift=1),
                    "return the number of backtracks, k for the fraction shrink^k: 0 when the full step is accepted "
                    "(you returned the number of tries)."),
        WrongAnswer("shrink fixed at 0.5", partial(_ls_variant, fixed_shrink=0.5),
                    "use the argument shrink, not 0.5 written in: fraction = shrink ** k."),
        WrongAnswer("old_params moved in place", partial(_ls_variant, in_place=True), IN_PLACE_HINT),
    ],
)

ITEMS = [CONJUGATE_GRADIENT, FISHER_VECTOR_PRODUCT, TRPO_FULL_STEP, LINE_SEARCH]
