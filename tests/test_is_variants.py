"""Sequence-level and masked importance sampling (``losses.sequence_importance_weights``) and lesson 07's study of
them (``minigrpo_course.debugging.is_study``): hand-computed values, and exact expectations by enumeration."""

import math

import pytest
import torch

from minigrpo_course.debugging.is_study import moe_routing_flips, retokenisation_demo, sequence_is_bias
from minigrpo.losses import sequence_importance_weights

TRAINER = torch.tensor([[0.0, -1.0, -2.0], [-0.5, 0.0, 0.0], [-1.0, -1.0, -1.0]])
SAMPLER = torch.tensor([[0.5, -1.0, -1.0], [0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the third row has no token


def test_sum_and_mean_log_ratio_by_hand():
    w, log_w = sequence_importance_weights(TRAINER, SAMPLER, MASK, "sum")
    assert torch.allclose(log_w, torch.tensor([-0.5, -0.5, 0.0]))  # (0 − 0.5) + (−1 + 1); the masked −1 is ignored
    assert torch.allclose(w, torch.exp(torch.tensor([-0.5, -0.5, 0.0])))
    _, log_w = sequence_importance_weights(TRAINER, SAMPLER, MASK, "mean")
    assert torch.allclose(log_w, torch.tensor([-0.25, -0.5, 0.0]))  # ÷ 2 tokens, ÷ 1 token, empty row: 0


def test_truncation_and_band():
    trainer = torch.tensor([[2.0], [0.0], [-2.0]])
    sampler = torch.zeros(3, 1)
    mask = torch.ones(3, 1)
    w, _ = sequence_importance_weights(trainer, sampler, mask, clip_max=3.0)
    assert torch.allclose(w, torch.tensor([3.0, 1.0, math.exp(-2.0)]))
    w, _ = sequence_importance_weights(trainer, sampler, mask, band=(0.5, 2.0))
    assert torch.equal(w, torch.tensor([0.0, 1.0, 0.0]))  # e^2 and e^-2 leave the band: masked, not capped


def test_weights_are_detached():
    trainer = TRAINER.clone().requires_grad_(True)
    w, log_w = sequence_importance_weights(trainer, SAMPLER, MASK)
    assert not w.requires_grad and not log_w.requires_grad


@pytest.mark.parametrize("kwargs, word", [({"level": "max"}, "level"), ({"clip_max": 0.0}, "clip_max"),
                                          ({"band": (2.0, 1.0)}, "band")])
def test_bad_arguments_are_refused(kwargs, word):
    with pytest.raises(ValueError, match=word):
        sequence_importance_weights(TRAINER, SAMPLER, MASK, **kwargs)
    with pytest.raises(ValueError):
        sequence_importance_weights(TRAINER, SAMPLER[:, :2], MASK[:, :2])


def test_exact_expectations_sequence_is_exact_token_tis_biased():
    """Exact by enumeration (vocab 6, 4 tokens, seed 0): at τ = 1 every estimator is exact; the summed sequence
    ratio is exact at every τ (its weights are the true ones); per-token TIS is biased (rel. error 0.40 at τ = 0.7
    as measured; asserted > 0.1), and the summed ratio's second moment explodes at τ = 0.5 (45 as measured)."""
    rows = {(r["tau"], r["estimator"]): r for r in sequence_is_bias(taus=(1.0, 0.7, 0.5))}
    assert all(r["rel_error"] < 1e-10 for (tau, _), r in rows.items() if tau == 1.0)
    assert all(rows[(t, "sequence IS (sum)")]["rel_error"] < 1e-10 for t in (0.7, 0.5))
    assert rows[(0.7, "token TIS")]["rel_error"] > 0.1
    assert rows[(0.5, "sequence IS (sum)")]["second_moment"] > 10
    assert rows[(0.5, "sequence TIS (sum)")]["second_moment"] <= 3.0**2
    assert rows[(0.5, "masked sequence IS (sum)")]["masked"] > 0.1


def test_retokenisation_changes_the_tokens():
    sampled, again, tok = retokenisation_demo()
    assert tok.decode(sampled).replace(" ", "") == tok.decode(again).replace(" ", "")  # the same text
    assert sampled != again and len(again) < len(sampled)  # BPE merges the pieces the sampler emitted one by one


def test_moe_routing_flips_are_discrete_jumps():
    """Measured (seed 0): 0.3% of tokens change experts; their outputs move by up to 0.91 of their norm, the
    others by at most 0.006."""
    r = moe_routing_flips(tokens=2048)
    assert 0 < r["flipped"] < 0.1
    assert r["rel_change_flipped"] > 10 * r["rel_change_same_route"]
