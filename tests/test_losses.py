import math
import pytest
import torch

from minigrpo.losses import reinforce_loss


def test_value_hand_computed():
    loss = reinforce_loss(torch.tensor([-0.5, -1.0, -2.0]), torch.tensor([1.0, 2.0, -1.0]))
    assert loss.item() == pytest.approx(-(-0.5 - 2.0 + 2.0) / 3)


def test_gradient_is_the_policy_gradient_estimate():
    """d loss / d theta = -(1/N) Σ ∇log π · w, checked through a real categorical policy with autograd."""
    torch.manual_seed(0)
    logits = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    actions = torch.tensor([0, 2, 1, 1, 0])
    w = torch.randn(5, dtype=torch.float64)
    logp = torch.log_softmax(logits, -1)[torch.arange(5), actions]
    (grad,) = torch.autograd.grad(reinforce_loss(logp, w), logits)
    # hand formula: ∇_logits log softmax(a) = onehot(a) - softmax
    probs = torch.softmax(logits.detach(), -1)
    onehot = torch.nn.functional.one_hot(actions, 3).double()
    expected = -((onehot - probs) * w[:, None]) / 5
    torch.testing.assert_close(grad, expected)


def test_weights_are_detached():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    w = torch.tensor([1.0, 3.0], requires_grad=True)
    reinforce_loss(logp, w).backward()
    assert w.grad is None
    torch.testing.assert_close(logp.grad, torch.tensor([-0.5, -1.5]))


def test_shape_mismatch_is_an_error_not_a_broadcast():
    with pytest.raises(ValueError, match=r"same shape, got \(3,\) and \(3, 1\)"):
        reinforce_loss(torch.zeros(3), torch.zeros(3, 1))


def test_nan_weights_and_empty_batches_are_errors():
    with pytest.raises(ValueError, match="NaN"):
        reinforce_loss(torch.zeros(2), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="empty"):
        reinforce_loss(torch.zeros(0), torch.zeros(0))


# ----------------------------------------------------------------------------- clipped surrogate

from minigrpo.losses import aggregate, clipped_surrogate_loss, kl_estimate, value_loss  # noqa: E402


def _grad_at(ratio: float, adv: float, eps=0.2, eps_high=None) -> float:
    logp = torch.tensor([float(np.log(ratio))], dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_surrogate_loss(logp, torch.zeros(1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64),
                                     eps, eps_high)
    (g,) = torch.autograd.grad(loss, logp)
    return g.item()


import numpy as np  # noqa: E402


@pytest.mark.parametrize("ratio,adv", [(1.3, 1.0), (2.0, 0.5), (0.7, -1.0), (0.1, -2.0)])
def test_gradient_is_exactly_zero_in_the_clipped_regions(ratio, adv):
    assert _grad_at(ratio, adv) == 0.0


@pytest.mark.parametrize("ratio,adv", [(1.3, -1.0), (0.7, 1.0), (1.1, 1.0), (0.9, -1.0), (3.0, -1.0), (0.05, 2.0)])
def test_gradient_is_nonzero_where_the_clip_does_not_apply(ratio, adv):
    # d(−ratio·A)/d logp = −ratio·A: moves that make things worse are never clipped
    assert _grad_at(ratio, adv) == pytest.approx(-ratio * adv)


def test_asymmetric_clip_range():
    assert _grad_at(1.25, 1.0, eps=0.2, eps_high=0.28) == pytest.approx(-1.25)  # inside the raised upper clip
    assert _grad_at(1.3, 1.0, eps=0.2, eps_high=0.28) == 0.0
    assert _grad_at(0.85, -1.0, eps=0.2, eps_high=0.28) == pytest.approx(0.85)  # low side keeps 0.2
    assert _grad_at(0.75, -1.0, eps=0.2, eps_high=0.28) == 0.0


def test_at_ratio_one_the_gradient_is_the_policy_gradient():
    torch.manual_seed(0)
    logits = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(0, 3, (6,))
    adv = torch.randn(6, dtype=torch.float64)
    logp = torch.log_softmax(logits, -1)[torch.arange(6), actions]
    loss, stats = clipped_surrogate_loss(logp, logp.detach(), adv, 0.2)
    (g_clip,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g_pg,) = torch.autograd.grad(reinforce_loss(logp, adv), logits)
    torch.testing.assert_close(g_clip, g_pg)
    assert stats["ratio_min"] == stats["ratio_max"] == 1.0 and stats["clip_frac"] == 0.0
    assert loss.item() == pytest.approx(-adv.mean().item())


def test_clip_statistics_hand_computed():
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.0])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0])
    loss, stats = clipped_surrogate_loss(ratio.log(), torch.zeros(5), adv, 0.2)
    assert stats["clip_frac_high"] == pytest.approx(0.2) and stats["clip_frac_low"] == pytest.approx(0.2)
    assert stats["clip_frac"] == pytest.approx(0.4)
    assert stats["ratio_min"] == pytest.approx(0.5) and stats["ratio_max"] == pytest.approx(1.5)
    # per element: -min(1.5, 1.2), -min(-0.5, -0.8), -min(-1.5, -1.2), -min(0.5, 0.8), -min(1, 1)
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 1.5 - 0.5 - 1.0) / 5)
    expected_kl = ((ratio - 1) - ratio.log()).mean().item()
    assert stats["approx_kl"] == pytest.approx(expected_kl)


def test_masked_token_losses_and_per_row_advantages():
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -2.0])  # one advantage per sequence, broadcast over its tokens
    loss, _ = clipped_surrogate_loss(logp, logp, adv, 0.2, mask=mask)
    assert loss.item() == pytest.approx(-(1 + 1 - 2) / 3)
    loss, _ = clipped_surrogate_loss(logp, logp, adv, 0.2, mask=mask, agg="seq_mean")
    assert loss.item() == pytest.approx(-(1 + -2) / 2)
    loss, _ = clipped_surrogate_loss(logp, logp, adv, 0.2, mask=mask, agg="sum_norm", norm=6)
    assert loss.item() == pytest.approx(-(1 + 1 - 2) / 6)


def test_clipped_loss_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        clipped_surrogate_loss(torch.zeros(3), torch.zeros(4), torch.zeros(3))
    with pytest.raises(ValueError, match="NaN"):
        clipped_surrogate_loss(torch.zeros(2), torch.zeros(2), torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="no element"):
        aggregate(torch.zeros(3), torch.zeros(3, dtype=torch.bool))


def test_value_loss_clipping():
    v, old, ret = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([3.0])
    assert value_loss(v, ret).item() == pytest.approx(0.5)
    # clipped prediction 0.2 is further from the target: the max keeps its error
    assert value_loss(v, ret, old, clip_eps=0.2).item() == pytest.approx(0.5 * 2.8**2)


def test_kl_estimators_on_an_enumerable_categorical():
    """E_π[k1] = E_π[k3] = KL(π‖π_ref) exactly; k3 >= 0 everywhere; all vanish when π = π_ref."""
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(5, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(5, dtype=torch.float64), 0)
    exact = (p * (p / q).log()).sum()
    for kind in ("k1", "k3"):
        assert (p * kl_estimate(p.log(), q.log(), kind)).sum().item() == pytest.approx(exact.item(), rel=1e-12)
    assert (kl_estimate(p.log(), q.log(), "k3") >= 0).all()
    assert (kl_estimate(p.log(), q.log(), "k2") >= 0).all()
    for kind in ("k1", "k2", "k3"):
        assert kl_estimate(p.log(), p.log(), kind).abs().max().item() == 0.0
    with pytest.raises(ValueError, match="kind"):
        kl_estimate(p, q, "k4")


# ----------------------------------------------------------------------------- token log-probs

from minigrpo.losses import token_logprobs  # noqa: E402


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_alignment_against_a_loop(temperature):
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    ids = torch.randint(0, 7, (2, 5))
    out = token_logprobs(logits, ids, temperature)
    assert out.shape == (2, 4)
    for b in range(2):
        for t in range(4):
            expected = torch.log_softmax(logits[b, t] / temperature, -1)[ids[b, t + 1]]
            assert out[b, t].item() == pytest.approx(expected.item(), abs=1e-12)


def test_token_logprobs_bad_input():
    with pytest.raises(ValueError, match=r"logits \[B, T, V\]"):
        token_logprobs(torch.zeros(2, 5, 7), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(1, 3, 4), torch.zeros(1, 3, dtype=torch.long), temperature=0)


# ------------------------------------------------------------------ grpo_loss: GRPO's one objective
from minigrpo.losses import LOSS_TYPES, grpo_loss  # noqa: E402

#: two completions, 2 and 1 valid tokens; advantages +1 and −2 per row
_MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
_ADV = torch.tensor([1.0, -2.0], dtype=torch.float64)


def _at_ratio_one(loss_type, **kw):
    logp = torch.tensor([[-1.0, -0.5, -3.0], [-0.2, -2.0, -1.0]], dtype=torch.float64, requires_grad=True)
    loss, stats = grpo_loss(logp, logp.detach(), _ADV, _MASK, loss_type, 0.2, **kw)
    loss.backward()
    return loss.item(), logp.grad, stats


@pytest.mark.parametrize("loss_type,value,row_weights", [
    ("grpo", (-1 + 2) / 2, [[1 / 4, 1 / 4, 0], [1 / 2, 0, 0]]),       # row means (−1, 2), then their mean
    ("dapo", (-1 - 1 + 2) / 3, [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0]]),   # one mean over the 3 tokens
    ("bnpo", (-1 - 1 + 2) / 3, [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0]]),   # the same without accumulation
    ("dr_grpo", (-1 - 1 + 2) / 6, [[1 / 6, 1 / 6, 0], [1 / 6, 0, 0]]),  # constant 2 rows × 3 columns
])
def test_grpo_loss_reductions_hand_computed(loss_type, value, row_weights):
    """At ρ = 1 each token's loss is −A and its gradient −A·(its weight): the reductions by hand."""
    loss, grad, stats = _at_ratio_one(loss_type)
    assert loss == pytest.approx(value, abs=1e-12)
    expected = -_ADV[:, None] * torch.tensor(row_weights, dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    assert stats["clip_ratio/region_mean"] == 0 and stats["ratio_min"] == stats["ratio_max"] == 1


def test_dapo_is_exact_under_accumulation_and_bnpo_is_not():
    """Two micro-batches with 2 and 1 tokens: "dapo" (normaliser counted over the whole batch) adds up to the full
    batch's loss; TRL's "bnpo" takes each micro-batch's own token mean over 2: (−1 + 2) / 2 = 0.5, not 0."""
    logp = torch.tensor([[-1.0, -0.5, -3.0], [-0.2, -2.0, -1.0]], dtype=torch.float64)
    full = grpo_loss(logp, logp, _ADV, _MASK, "dapo")[0].item()
    parts = {lt: sum(grpo_loss(logp[i:i + 1], logp[i:i + 1], _ADV[i:i + 1], _MASK[i:i + 1], lt, num_sequences=2,
                               num_tokens=3, max_completion_length=3, gradient_accumulation_steps=2)[0].item()
                     for i in range(2)) for lt in LOSS_TYPES}
    assert parts["dapo"] == pytest.approx(full, abs=1e-12) and full == pytest.approx(0.0, abs=1e-12)
    assert parts["grpo"] == pytest.approx(0.5, abs=1e-12) and parts["dr_grpo"] == pytest.approx(0.0, abs=1e-12)
    assert parts["bnpo"] == pytest.approx(0.5, abs=1e-12)


def test_grpo_loss_kl_and_importance_weights():
    """ℓ = −w·A·ρ + β·k3 per token: w weights the surrogate only; the KL statistic is the masked mean of k3."""
    logp = torch.tensor([[-1.0, -0.5, -3.0], [-0.2, -2.0, -1.0]], dtype=torch.float64, requires_grad=True)
    ref = logp.detach() + torch.tensor([[0.3, -0.1, 5.0], [0.2, 7.0, 7.0]], dtype=torch.float64)
    w = torch.tensor([[2.0, 1.0, 9.0], [0.5, 9.0, 9.0]], dtype=torch.float64)
    loss, stats = grpo_loss(logp, logp.detach(), _ADV, _MASK, "dapo", ref_logp=ref, beta=0.1, importance_weights=w)
    k3 = lambda d: math.exp(d) - 1 - d  # noqa: E731  (log ρ_ref = d)
    tokens = [-2.0 * 1 + 0.1 * k3(0.3), -1.0 * 1 + 0.1 * k3(-0.1), 0.5 * 2 + 0.1 * k3(0.2)]
    assert loss.item() == pytest.approx(sum(tokens) / 3, abs=1e-12)
    assert stats["kl"] == pytest.approx((k3(0.3) + k3(-0.1) + k3(0.2)) / 3, abs=1e-12)
    kl_only = grpo_loss(logp, logp.detach(), torch.zeros(2, dtype=torch.float64), _MASK, "dapo", ref_logp=ref,
                        beta=0.1, kl_estimator="k1")[0]
    assert kl_only.item() == pytest.approx(0.1 * (-0.3 + 0.1 - 0.2) / 3, abs=1e-12)


def test_grpo_loss_clip_statistics_hand_computed():
    """ρ = (0.5, 1.5, 1.1, 0.5) with A = (−1, +1, +1, +1), ε = 0.2: one token clipped below (ρ < 0.8, A < 0), one
    above (ρ > 1.2, A > 0); ρ = 0.5 with A > 0 is not clipped (the min keeps the worse, unclipped term)."""
    ratio = torch.tensor([0.5, 1.5, 1.1, 0.5], dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    logp = torch.log(ratio).requires_grad_(True)
    loss, stats = grpo_loss(logp, torch.zeros(4, dtype=torch.float64), adv, None, "bnpo", 0.2)
    assert stats["clip_ratio/low_mean"] == 0.25 and stats["clip_ratio/high_mean"] == 0.25
    assert stats["clip_ratio/region_mean"] == 0.5
    assert loss.item() == pytest.approx((0.8 - 1.2 - 1.1 - 0.5) / 4, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, -1.1 / 4, -0.5 / 4], dtype=torch.float64))


def test_grpo_loss_bad_input():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(logp, logp, torch.zeros(2), loss_type="ppo")
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(logp, logp, torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="epsilon"):
        grpo_loss(logp, logp, torch.zeros(2), epsilon=1.5)
    with pytest.raises(ValueError, match="mask"):
        grpo_loss(logp, logp, torch.zeros(2), mask=torch.ones(2, 2))
