import pytest
import torch

from minigrpo.control import MLPPolicy
from minigrpo.trust_region import (
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    flat_params,
    set_flat_params,
    trust_region_step,
)


@pytest.mark.parametrize("n", [3, 10, 25])
def test_conjugate_gradient_matches_a_direct_solve(n):
    g = torch.Generator().manual_seed(n)
    M = torch.randn(n, n, generator=g, dtype=torch.float64)
    A = M @ M.T + 0.5 * torch.eye(n, dtype=torch.float64)
    b = torch.randn(n, generator=g, dtype=torch.float64)
    x = conjugate_gradient(lambda v: A @ v, b, iters=4 * n, tol=1e-13)
    torch.testing.assert_close(x, torch.linalg.solve(A, b), rtol=1e-8, atol=1e-8)


def test_conjugate_gradient_exact_in_n_steps_on_a_diagonal():
    A = torch.diag(torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64))
    b = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(conjugate_gradient(lambda v: A @ v, b, iters=3), torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64))


def test_conjugate_gradient_refuses_an_indefinite_matrix():
    A = torch.diag(torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="positive definite"):
        conjugate_gradient(lambda v: A @ v, torch.tensor([0.0, 1.0]))


def _relative_residual(A, b, x):
    return ((b - A @ x).norm() / b.norm()).item()


def test_conjugate_gradient_stops_on_a_residual_relative_to_b():
    """‖b − A x‖ ≤ tol·‖b‖: the same iteration, and the same direction, at every scale of b. On this
    30×30 system (condition number 10) the relative residual is 1.49e-5 after 16 iterations and 5.3e-6
    after 17, so the default tol = 1e-5 stops after 17 products whether ‖b‖ is 1e-8, 1 or 1e4. An absolute
    threshold (the former rᵀr ≤ 1e-10) returned x = 0 for ‖b‖ = 1e-8: the TRPO step vanished."""
    from minigrpo_course.grading.ex03 import random_spd

    A = random_spd(30, seed=11, cond=10.0)
    b = torch.randn(30, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    b = b / b.norm()
    solutions = {}
    for scale in (1.0, 1e-8, 1e4):
        calls = []

        def Avp(v):
            calls.append(1)
            return A @ v

        x = conjugate_gradient(Avp, scale * b, iters=100)
        assert len(calls) == 17, (scale, len(calls))
        assert _relative_residual(A, scale * b, x) <= 1e-5
        solutions[scale] = x / scale
    assert _relative_residual(A, b, conjugate_gradient(lambda v: A @ v, b, iters=16)) > 1e-5  # not one sooner
    for scale in (1e-8, 1e4):
        torch.testing.assert_close(solutions[scale], solutions[1.0], rtol=1e-10, atol=0)


def test_a_tiny_policy_gradient_gets_the_same_natural_gradient_direction():
    """float32, as in the trainer: the Fisher system of a small policy with g scaled by 1e-8 (‖g‖ ~ 1e-9)
    gives the direction of the unscaled g; the solution scales by 1e-8 (to float32 rounding)."""
    torch.manual_seed(0)
    policy = MLPPolicy(4, 2, (16,))
    params = list(policy.parameters())
    obs = torch.randn(64, 4)
    actions = torch.randint(0, 2, (64,))
    adv = torch.randn(64)
    with torch.no_grad():
        old_logits = policy(obs)

    def mean_kl():
        old = torch.distributions.Categorical(logits=old_logits)
        return torch.distributions.kl_divergence(old, policy.dist(obs)).mean()

    g = flat_grad((policy.log_prob(obs, actions) * adv).mean(), params)
    fvp = fisher_vector_product(mean_kl, params, damping=0.1)
    x = conjugate_gradient(fvp, g, iters=10)
    x_tiny = conjugate_gradient(fvp, 1e-8 * g, iters=10)
    assert x_tiny.norm() > 0, "CG returned x = 0 for a small gradient"
    cos = (x @ x_tiny / (x.norm() * x_tiny.norm())).item()
    assert cos > 1 - 1e-5, cos
    torch.testing.assert_close(x_tiny / 1e-8, x, rtol=1e-3, atol=1e-6 * x.abs().max().item())


def test_conjugate_gradient_refuses_a_negative_tolerance_and_a_non_finite_b():
    A = torch.eye(2)
    with pytest.raises(ValueError, match="tol must be >= 0"):
        conjugate_gradient(lambda v: A @ v, torch.ones(2), tol=-1e-5)
    with pytest.raises(ValueError, match="NaN or inf"):
        conjugate_gradient(lambda v: A @ v, torch.tensor([1.0, float("nan")]))


def test_fisher_vector_product_matches_an_explicit_fisher_matrix():
    """F = E_s Σ_a π(a|s) ∇log π(a|s) ∇log π(a|s)ᵀ, built explicitly for a tiny policy."""
    torch.manual_seed(0)
    policy = MLPPolicy(3, 3, (4,)).double()
    params = list(policy.parameters())
    obs = torch.randn(5, 3, dtype=torch.float64)
    with torch.no_grad():
        old_logits = policy(obs)

    def mean_kl():
        old = torch.distributions.Categorical(logits=old_logits)
        return torch.distributions.kl_divergence(old, policy.dist(obs)).mean()

    n = sum(p.numel() for p in params)
    F = torch.zeros(n, n, dtype=torch.float64)
    probs = torch.softmax(old_logits, -1)
    for i in range(5):
        for a in range(3):
            g = flat_grad(policy.log_prob(obs[i], torch.tensor(a)), params)
            F += probs[i, a] * torch.outer(g, g) / 5
    damping = 0.1
    fvp = fisher_vector_product(mean_kl, params, damping)
    for seed in range(3):
        v = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        torch.testing.assert_close(fvp(v), F @ v + damping * v, rtol=1e-7, atol=1e-9)


def test_flat_params_roundtrip():
    policy = MLPPolicy(2, 2, (3,))
    params = list(policy.parameters())
    flat = flat_params(params)
    set_flat_params(params, flat * 2)
    torch.testing.assert_close(flat_params(params), flat * 2)
    with pytest.raises(ValueError):
        set_flat_params(params, torch.zeros(flat.numel() + 1))


def test_line_search_backtracks_until_the_kl_constraint_holds():
    x = torch.nn.Parameter(torch.zeros(1))
    surrogate = lambda: float(x.item())  # improves as x grows  # noqa: E731
    kl = lambda: float(x.item() ** 2)  # noqa: E731
    ok, frac = backtracking_line_search(surrogate, kl, [x], torch.tensor([4.0]), expected_improvement=4.0, max_kl=1.0)
    assert ok and frac == 0.25 and x.item() == 1.0  # 4 -> 2 -> 1


def test_line_search_restores_the_parameters_when_nothing_improves():
    x = torch.nn.Parameter(torch.tensor([0.5]))
    ok, frac = backtracking_line_search(lambda: -float(x.item()), lambda: 0.0, [x], torch.tensor([1.0]), 1.0, 1.0)
    assert not ok and frac == 0.0 and x.item() == 0.5


def test_conjugate_gradient_stops_on_an_exact_solve_with_zero_tolerance():
    A = torch.eye(3, dtype=torch.float64)
    b = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(conjugate_gradient(lambda v: A @ v, b, iters=10, tol=0.0), b)


@pytest.mark.parametrize("scale", [1.0, 1e-4, 1e-8])
def test_trust_region_step_lands_on_the_boundary_at_any_gradient_scale(scale):
    """½ sᵀFs = δ exactly under the quadratic model, and the direction is F⁻¹g, for ‖g‖ from 1 down to
    1e-8 (a floor on xᵀFx, as the trainer once had, shrank the step of a tiny gradient: at 1e-8 by 10⁴×)."""
    gen = torch.Generator().manual_seed(0)
    M = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    F = M @ M.T / 6 + 0.1 * torch.eye(6, dtype=torch.float64)
    g = torch.randn(6, generator=gen, dtype=torch.float64) * scale
    s = trust_region_step(lambda v: F @ v, conjugate_gradient(lambda v: F @ v, g, iters=20), max_kl=0.01)
    assert (0.5 * s @ F @ s).item() == pytest.approx(0.01, rel=1e-9)
    direction = torch.linalg.solve(F, g)
    torch.testing.assert_close(s / s.norm(), direction / direction.norm(), rtol=0, atol=1e-9)
    zero = torch.zeros(6, dtype=torch.float64)
    assert torch.equal(trust_region_step(lambda v: F @ v, zero, 0.01), zero)
