"""Grading tests for exercise 04 (PPO).

By default they grade solutions/04_ppo.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex04.py --grade-source exercises
The items' cases run in test_items.py; the properties below test random batches against what the clipped objective must satisfy.
"""

import pytest
import torch


EXERCISE = "04"


def _batch(seed, n=200, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(n, generator=g, dtype=torch.float64)
    logp = old + spread * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return logp, old, adv


CASES = [(seed, eps) for seed in range(4) for eps in (0.1, 0.2, 0.3)]


@pytest.mark.parametrize("seed,eps", CASES)
def test_gradient_is_zero_exactly_where_the_clip_acts(learner_fn, seed, eps):
    """d loss / d logp_i = 0 when (A > 0, r > 1 + ε) or (A < 0, r < 1 − ε), else −r_i·A_i / N."""
    logp, old, adv = _batch(seed)
    logp.requires_grad_()
    learner_fn(EXERCISE, "clipped_surrogate_loss")(logp, old, adv, eps).backward()
    assert logp.grad is not None, "no gradient reached logp"
    r = torch.exp(logp.detach() - old)
    clipped = ((adv > 0) & (r > 1 + eps)) | ((adv < 0) & (r < 1 - eps))
    assert clipped.any() and (~clipped).any()  # the batch exercises both kinds of samples
    expected = torch.where(clipped, torch.zeros_like(r), -r * adv / len(r))
    assert torch.all(logp.grad[clipped] == 0), "a clipped sample still has a gradient"
    torch.testing.assert_close(logp.grad, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed,eps", CASES)
def test_loss_is_a_pessimistic_bound(learner_fn, seed, eps):
    """min(rA, clip(r)A) ≤ rA per sample, so the loss is ≥ the unclipped surrogate loss −mean(rA);
    and it equals it when every ratio lies inside the clip range."""
    loss_fn = learner_fn(EXERCISE, "clipped_surrogate_loss")
    logp, old, adv = _batch(seed)
    unclipped = -(torch.exp(logp - old) * adv).mean()
    assert float(loss_fn(logp, old, adv, eps)) >= float(unclipped) - 1e-12
    inside_logp = old + torch.log1p(0.9 * eps * (2 * torch.rand(len(old), dtype=torch.float64) - 1))
    torch.testing.assert_close(torch.as_tensor(loss_fn(inside_logp, old, adv, eps), dtype=torch.float64),
                               -(torch.exp(inside_logp - old) * adv).mean(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_clip_fraction_is_the_share_of_zero_gradients(learner_fn, seed):
    """The clip fraction counts exactly the samples whose loss gradient is zero (A ≠ 0 here)."""
    logp, old, adv = _batch(seed)
    logp.requires_grad_()
    learner_fn(EXERCISE, "clipped_surrogate_loss")(logp, old, adv, 0.2).backward()
    zero_share = (logp.grad == 0).double().mean()
    got = learner_fn(EXERCISE, "ppo_clip_fraction")(logp.detach(), old, adv, 0.2)
    assert abs(float(got) - float(zero_share)) < 1e-6  # a share of 200 samples: steps of 0.005


def test_clip_fraction_grows_as_the_policy_moves(learner_fn):
    clip_fraction = learner_fn(EXERCISE, "ppo_clip_fraction")
    fracs = [float(clip_fraction(*_batch(0, 2000, spread), 0.2)) for spread in (0.0, 0.1, 0.3, 1.0)]
    assert fracs[0] == 0.0 and fracs == sorted(fracs) and 0.0 <= fracs[-1] <= 0.5


@pytest.mark.parametrize("seed", range(3))
def test_k3_is_nonnegative_and_matches_the_exact_kl(learner_fn, seed):
    """Actions drawn from π_old: the k3 average estimates KL(π_old ‖ π_θ) of two categoricals."""
    approx_kl = learner_fn(EXERCISE, "approx_kl")
    g = torch.Generator().manual_seed(seed)
    old_logits, new_logits = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    old_logits, new_logits = old_logits.log_softmax(0), (old_logits + 0.5 * new_logits).log_softmax(0)
    exact = float((old_logits.exp() * (old_logits - new_logits)).sum())
    actions = torch.multinomial(old_logits.exp(), 200_000, replacement=True, generator=g)
    est = float(approx_kl(new_logits[actions], old_logits[actions]))
    assert est >= 0
    assert abs(est - exact) < 0.1 * exact + 2e-3, (est, exact)
    for i in range(6):  # every single-sample estimate is >= 0
        assert float(approx_kl(new_logits[i:i + 1], old_logits[i:i + 1])) >= -1e-15
