"""Grading tests for exercise 03 (TRPO).

By default they grade solutions/03_trpo.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex03.py --grade-source exercises
The items' cases run in test_items.py; the tests below compare your functions with independent oracles: a direct linear solve, a Fisher matrix built
explicitly from score outer products, the line search's definition on random problems, and the package's own
in-place line search (the one train_trpo runs) on real TRPO steps.
"""

import pytest
import torch

from minigrpo_course.grading.ex03 import line_problem, random_spd, tiny_categorical_problem
from minigrpo.trust_region import (backtracking_line_search, conjugate_gradient, fisher_vector_product, flat_grad,
                                   flat_params, set_flat_params, trust_region_step)

EXERCISE = "03"


def explicit_fisher(net: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """F = (1/N) Σ_s Σ_a π(a|s) ∇log π(a|s) ∇log π(a|s)ᵀ, built one score at a time (small nets only)."""
    params = list(net.parameters())
    n = sum(p.numel() for p in params)
    F = torch.zeros(n, n, dtype=torch.float64)
    with torch.no_grad():
        probs = torch.softmax(net(obs), -1)
    for i in range(len(obs)):
        logp = torch.log_softmax(net(obs[i]), -1)
        for a in range(logp.numel()):
            g = flat_grad(logp[a], params, retain_graph=True)
            F += probs[i, a] * torch.outer(g, g) / len(obs)
    return F


# ----------------------------------------------------------------------------- 03.1 conjugate_gradient

@pytest.mark.parametrize("n,cond", [(2, None), (5, None), (12, 1e2), (30, None), (60, 1e4)])
def test_cg_matches_a_direct_solve(learner_fn, n, cond):
    cg = learner_fn(EXERCISE, "conjugate_gradient")
    A = random_spd(n, seed=n, cond=cond)
    b = torch.randn(n, generator=torch.Generator().manual_seed(1000 + n), dtype=torch.float64)
    x = cg(lambda v: A @ v, b.clone(), 10 * n, 1e-13)
    torch.testing.assert_close(x, torch.linalg.solve(A, b), rtol=1e-6, atol=1e-8)


def test_cg_is_exact_in_n_steps_on_distinct_eigenvalues(learner_fn):
    """In exact arithmetic CG needs at most n iterations; steepest descent does not get there."""
    cg = learner_fn(EXERCISE, "conjugate_gradient")
    A = random_spd(6, seed=42, cond=10.0)
    b = torch.ones(6, dtype=torch.float64)
    x = cg(lambda v: A @ v, b, 6, 1e-15)
    torch.testing.assert_close(A @ x, b, rtol=1e-8, atol=1e-8)


def test_cg_needs_only_as_many_iterations_as_distinct_eigenvalues(learner_fn):
    """With two distinct eigenvalues, two iterations solve a 50×50 system."""
    cg = learner_fn(EXERCISE, "conjugate_gradient")
    q, _ = torch.linalg.qr(torch.randn(50, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    eig = torch.cat([torch.full((25,), 1.0), torch.full((25,), 7.0)]).double()
    A = (q * eig) @ q.T
    b = torch.randn(50, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x = cg(lambda v: A @ v, b, 2, 1e-15)
    torch.testing.assert_close(x, torch.linalg.solve(A, b), rtol=1e-8, atol=1e-8)


def test_cg_uses_one_product_per_iteration_and_respects_iters(learner_fn):
    cg = learner_fn(EXERCISE, "conjugate_gradient")
    A = random_spd(10, seed=3)
    calls = []

    def Avp(v):
        calls.append(1)
        return A @ v

    cg(Avp, torch.ones(10, dtype=torch.float64), 4, 1e-15)
    assert len(calls) <= 5, f"{len(calls)} products for 4 iterations: one per iteration is enough"


def test_cg_does_not_modify_b(learner_fn):
    b = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    learner_fn(EXERCISE, "conjugate_gradient")(lambda v: 2 * v, b, 3)
    assert b.tolist() == [1.0, 2.0, 3.0], "conjugate_gradient changed the vector b it was given"


def test_cg_stops_relative_to_b_at_every_scale(learner_fn):
    """‖r‖ ≤ tol·‖b‖: b scaled by 1e-8, 1 or 1e4 takes the same number of products and gives the same direction.
    On this system (condition number 10) ‖r‖/‖b‖ is 1.5e-5 after 16 iterations and 5.3e-6 after 17, so the
    default tol = 1e-5 stops after 17, far from the boundary; an absolute threshold stops at once for 1e-8·b."""
    cg = learner_fn(EXERCISE, "conjugate_gradient")
    A = random_spd(30, seed=11, cond=10.0)
    b = torch.randn(30, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    b = b / b.norm()
    solutions, products = {}, {}
    for scale in (1.0, 1e-8, 1e4):
        calls = []

        def Avp(v):
            calls.append(1)
            return A @ v

        solutions[scale] = cg(Avp, scale * b, 100) / scale
        products[scale] = len(calls)
    assert products[1e-8] == products[1.0] == products[1e4], f"products at ‖b‖ = 1e-8, 1, 1e4: {products}"
    assert 17 <= products[1.0] <= 18, f"{products[1.0]} products: stop once ‖r‖ ≤ 1e-5·‖b‖ (after 17 iterations)"
    for scale in (1e-8, 1e4):
        torch.testing.assert_close(solutions[scale], solutions[1.0], rtol=1e-9, atol=0)


# ----------------------------------------------------------------------------- 03.2 fisher_vector_product

@pytest.mark.parametrize("seed,hidden,n_actions", [(0, (4,), 3), (1, (5, 3), 2), (2, (6,), 5)])
def test_fvp_matches_an_explicit_fisher_matrix(learner_fn, seed, hidden, n_actions):
    fvp_fn = learner_fn(EXERCISE, "fisher_vector_product")
    net, params, obs, mean_kl = tiny_categorical_problem(seed, hidden=hidden, n_actions=n_actions, n_states=7)
    F = explicit_fisher(net, obs)
    damping = 0.07
    fvp = fvp_fn(mean_kl, params, damping)
    g = torch.Generator().manual_seed(seed)
    for _ in range(3):
        v = torch.randn(F.shape[0], generator=g, dtype=torch.float64)
        got = fvp(v)
        assert got.shape == (F.shape[0],), f"expected a flat vector of {F.shape[0]} entries, got shape {tuple(got.shape)}"
        torch.testing.assert_close(got, F @ v + damping * v, rtol=1e-7, atol=1e-10)


def test_fvp_is_symmetric(learner_fn):
    """F is symmetric, so uᵀ(F v) = vᵀ(F u) for any u, v."""
    _, params, _, mean_kl = tiny_categorical_problem(5, hidden=(8, 8), n_actions=4, n_states=9)
    fvp = learner_fn(EXERCISE, "fisher_vector_product")(mean_kl, params, 0.1)
    n = sum(p.numel() for p in params)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        u, v = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
        torch.testing.assert_close(u @ fvp(v), v @ fvp(u), rtol=1e-9, atol=1e-12)


def test_fvp_is_positive_definite_with_damping(learner_fn):
    _, params, _, mean_kl = tiny_categorical_problem(6, hidden=(6,), n_actions=3)
    damping = 0.1
    fvp = learner_fn(EXERCISE, "fisher_vector_product")(mean_kl, params, damping)
    n = sum(p.numel() for p in params)
    g = torch.Generator().manual_seed(6)
    for _ in range(5):
        v = torch.randn(n, generator=g, dtype=torch.float64)
        assert v @ fvp(v) >= damping * (v @ v) * (1 - 1e-9), "vᵀ(F + damping·I)v must be at least damping·|v|²"


def test_fvp_does_not_change_the_parameters(learner_fn):
    _, params, _, mean_kl = tiny_categorical_problem(7)
    before = [p.detach().clone() for p in params]
    fvp = learner_fn(EXERCISE, "fisher_vector_product")(mean_kl, params, 0.1)
    fvp(torch.ones(sum(p.numel() for p in params), dtype=torch.float64))
    for p, q in zip(params, before):
        assert torch.equal(p.detach(), q), "fisher_vector_product modified the policy's parameters"


def test_cg_with_fvp_gives_the_natural_gradient(learner_fn):
    """Learner's CG on learner's FVP solves (F + λI) x = g, against a direct solve with the explicit F."""
    cg = learner_fn(EXERCISE, "conjugate_gradient")
    fvp_fn = learner_fn(EXERCISE, "fisher_vector_product")
    net, params, obs, mean_kl = tiny_categorical_problem(8, hidden=(4,), n_actions=3, n_states=6)
    F = explicit_fisher(net, obs)
    damping = 0.1
    g = torch.randn(F.shape[0], generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    x = cg(fvp_fn(mean_kl, params, damping), g, 4 * F.shape[0], 1e-26)
    expected = torch.linalg.solve(F + damping * torch.eye(F.shape[0], dtype=torch.float64), g)
    torch.testing.assert_close(x, expected, rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------- 03.3 trpo_full_step

@pytest.mark.parametrize("seed", range(5))
def test_full_step_lands_on_the_boundary_along_x(learner_fn, seed):
    step = learner_fn(EXERCISE, "trpo_full_step")
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 40, (1,), generator=g))
    F = random_spd(n, seed=seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    max_kl = float(10 ** torch.empty(1).uniform_(-4, 0, generator=g))
    s = step(x, F @ x, max_kl)
    torch.testing.assert_close(0.5 * s @ F @ s, torch.tensor(max_kl, dtype=torch.float64), rtol=1e-9, atol=1e-14)
    cos = (s @ x) / (s.norm() * x.norm())
    assert cos > 1 - 1e-12, "the full step must point along the search direction x (a positive multiple of it)"


def test_full_step_scales_with_the_square_root_of_delta(learner_fn):
    step = learner_fn(EXERCISE, "trpo_full_step")
    x, Fx = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, 1.0], dtype=torch.float64)
    ratio = step(x, Fx, 0.04).norm() / step(x, Fx, 0.01).norm()
    assert abs(float(ratio) - 2.0) < 1e-12, f"quadrupling δ should double the step, it multiplied it by {float(ratio):.4g}"


# ----------------------------------------------------------------------------- 03.4 line_search

def _first_acceptable(gain, curvature, kl, predicted, max_kl, max_backtracks, shrink, accept_ratio):
    """By the definition, on a line problem: the first k whose fraction passes both tests (None if none)."""
    for k in range(max_backtracks):
        f = shrink**k
        improvement = gain * f - curvature * f * f
        if kl * f * f <= max_kl and improvement > 0 and improvement >= accept_ratio * f * predicted:
            return k
    return None


@pytest.mark.parametrize("seed", range(8))
def test_line_search_returns_the_first_acceptable_fraction(learner_fn, seed):
    """Random line problems (improvement, KL and prediction known along the step), random knobs: the result is
    old_params + shrink^k · full_step for the first k that passes both tests, or old_params itself and None."""
    search = learner_fn(EXERCISE, "line_search")
    g = torch.Generator().manual_seed(seed)
    u = lambda lo, hi: float(lo + (hi - lo) * torch.rand(1, generator=g))  # noqa: E731
    gain, curvature, kl = u(0.1, 2.0), u(0.0, 4.0), 10 ** u(-3, 2)
    predicted, max_kl = gain * u(0.5, 3.0), 10 ** u(-3, -1)
    max_backtracks, shrink, accept_ratio = int(u(1, 12)), u(0.3, 0.9), u(0.0, 0.5)
    surrogate, mean_kl, theta0, step, _ = line_problem(gain, curvature, kl, n=5, seed=seed)
    before = theta0.clone()
    params, k = search(surrogate, mean_kl, theta0, step, predicted, max_kl, max_backtracks, shrink, accept_ratio)
    expected = _first_acceptable(gain, curvature, kl, predicted, max_kl, max_backtracks, shrink, accept_ratio)
    assert torch.equal(theta0, before), "line_search changed old_params in place"
    assert k == expected, f"backtracks: got {k}, the first acceptable fraction is shrink^{expected}"
    if expected is None:
        assert torch.equal(params, before), "with no step accepted, the old parameters must come back unchanged"
    else:
        torch.testing.assert_close(params, before + shrink**expected * step, rtol=1e-12, atol=1e-12)


def _trpo_batch(seed):
    """A tiny softmax policy, random actions and advantages, its surrogate and KL (zero-argument, on the live
    parameters, as the trainer's) and the natural-gradient full step to δ = 0.01."""
    net, params, obs, mean_kl = tiny_categorical_problem(seed, n_states=8)
    g = torch.Generator().manual_seed(seed)
    actions = torch.randint(0, 3, (len(obs),), generator=g)
    adv = torch.randn(len(obs), generator=g, dtype=torch.float64)
    with torch.no_grad():
        old_logp = torch.log_softmax(net(obs), -1).gather(1, actions[:, None]).squeeze(1)

    def surrogate():
        logp = torch.log_softmax(net(obs), -1).gather(1, actions[:, None]).squeeze(1)
        return (torch.exp(logp - old_logp) * adv).mean()

    grad = flat_grad(surrogate(), params)
    fvp = fisher_vector_product(mean_kl, params, 0.1)
    step = trust_region_step(fvp, conjugate_gradient(fvp, grad, 10), 0.01)
    return params, surrogate, mean_kl, step, float(grad @ step)


@pytest.mark.parametrize("seed,stretch", [(0, 1.0), (1, 3.0), (2, 10.0), (3, 40.0), (4, 1000.0)])
def test_line_search_matches_the_trainers_search_on_real_trpo_steps(learner_fn, seed, stretch):
    """On real TRPO steps (stretched so that 0 to all 10 halvings are needed), the learner's pure search takes the
    same decision as the package's in-place trust_region.backtracking_line_search that train_trpo uses."""
    search = learner_fn(EXERCISE, "line_search")
    params, surrogate, mean_kl, step, expected_improvement = _trpo_batch(seed)
    theta0 = flat_params(params)
    with torch.no_grad():
        accepted, fraction = backtracking_line_search(lambda: surrogate().item(), lambda: mean_kl().item(), params,
                                                      stretch * step, stretch * expected_improvement, 0.01)
    package_params = flat_params(params)
    set_flat_params(params, theta0)

    def at(fn):
        def value(theta):
            set_flat_params(params, theta)
            with torch.no_grad():
                return fn().item()
        return value

    mine, k = search(at(surrogate), at(mean_kl), theta0, stretch * step, stretch * expected_improvement, 0.01)
    assert (k is not None) == accepted, f"accepted: package {accepted}, yours {k is not None}"
    if accepted:
        assert 0.5**k == fraction, f"package took fraction {fraction}, you took 0.5^{k}"
    torch.testing.assert_close(mine, package_params, rtol=1e-12, atol=1e-12)
