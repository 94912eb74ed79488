"""Exercise 03 — TRPO: conjugate gradient, Fisher-vector products, the step to the trust-region boundary."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.distributions import Categorical, Independent, Normal, kl_divergence

from minigrpo.course.grading.core import Call, Case, Item, Made, Spread, WrongAnswer, f64, randn
from minigrpo.trust_region import conjugate_gradient, fisher_vector_product, flat_grad

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

ITEMS = [CONJUGATE_GRADIENT, FISHER_VECTOR_PRODUCT, TRPO_FULL_STEP]
