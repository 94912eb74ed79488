import pytest
import torch

from minigrpo.control import CategoricalMLPPolicy
from minigrpo.trust_region import (
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    flat_params,
    set_flat_params,
)


@pytest.mark.parametrize("n", [3, 10, 25])
def test_conjugate_gradient_matches_a_direct_solve(n):
    g = torch.Generator().manual_seed(n)
    M = torch.randn(n, n, generator=g, dtype=torch.float64)
    A = M @ M.T + 0.5 * torch.eye(n, dtype=torch.float64)
    b = torch.randn(n, generator=g, dtype=torch.float64)
    x = conjugate_gradient(lambda v: A @ v, b, iters=4 * n, tol=1e-24)
    torch.testing.assert_close(x, torch.linalg.solve(A, b), rtol=1e-8, atol=1e-8)


def test_conjugate_gradient_exact_in_n_steps_on_a_diagonal():
    A = torch.diag(torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64))
    b = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(conjugate_gradient(lambda v: A @ v, b, iters=3), torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64))


def test_conjugate_gradient_refuses_an_indefinite_matrix():
    A = torch.diag(torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="positive definite"):
        conjugate_gradient(lambda v: A @ v, torch.tensor([0.0, 1.0]))


def test_fisher_vector_product_matches_an_explicit_fisher_matrix():
    """F = E_s Σ_a π(a|s) ∇log π(a|s) ∇log π(a|s)ᵀ, built explicitly for a tiny policy."""
    torch.manual_seed(0)
    policy = CategoricalMLPPolicy(3, 3, (4,)).double()
    params = list(policy.parameters())
    obs = torch.randn(5, 3, dtype=torch.float64)
    with torch.no_grad():
        old_logits = policy.logits_net(obs)

    def mean_kl():
        old = torch.distributions.Categorical(logits=old_logits)
        return torch.distributions.kl_divergence(old, policy(obs)).mean()

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
    policy = CategoricalMLPPolicy(2, 2, (3,))
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
