"""Lesson 06 section 7's KL placements (``minigrpo_course.experiments.kl_placement``): the exact identities, in float64,
against autograd on the exact divergences."""

import pytest
import torch

from minigrpo_course.experiments.kl_placement import (PLACEMENTS, TabularLM, categorical_placements, distance_sweep,
                                                      exact_kl_gradients, monte_carlo, per_sample_gradients,
                                                      placement_table, sequence_placements)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _policy(seed=0, V=5, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(V, generator=g, dtype=torch.float64)
    return ref + scale * torch.randn(V, generator=g, dtype=torch.float64), ref


def _expected(theta, ref, name):
    return torch.softmax(theta, -1) @ per_sample_gradients(theta, ref, name)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_categorical_identities(seed):
    theta, ref = _policy(seed)
    exact = exact_kl_gradients(theta, ref)
    fwd, rev = exact["KL(π‖ref)"], exact["KL(ref‖π)"]
    # closed forms for softmax logits: ∇KL(ref‖π) = π − π_ref; ∇KL(π‖ref) = π ⊙ (log π/π_ref − KL)
    pi, pr = torch.softmax(theta, -1), torch.softmax(ref, -1)
    log_ratio = pi.log() - pr.log()
    torch.testing.assert_close(rev, pi - pr, rtol=0, atol=1e-12)
    torch.testing.assert_close(fwd, pi * (log_ratio - (pi * log_ratio).sum()), rtol=0, atol=1e-12)
    torch.testing.assert_close(_expected(theta, ref, "k1 in loss"), torch.zeros(5, dtype=torch.float64),
                               rtol=0, atol=1e-12)  # E[∇ log π] = 0: k1 in the loss does nothing on average
    for name in ("k1 as reward (PPO-RLHF)", "k2 in loss", "k3·ρ in loss (TRL 1.16)"):
        torch.testing.assert_close(_expected(theta, ref, name), fwd, rtol=0, atol=1e-12)
    torch.testing.assert_close(_expected(theta, ref, "k3 in loss (GRPO)"), rev, rtol=0, atol=1e-12)
    # one token: k2 in loss, k3·ρ in loss and k1 as reward are the same estimator sample by sample
    g = per_sample_gradients(theta, ref, "k1 as reward (PPO-RLHF)")
    for name in ("k2 in loss", "k3·ρ in loss (TRL 1.16)"):
        torch.testing.assert_close(per_sample_gradients(theta, ref, name), g, rtol=0, atol=1e-12)


def test_table_names_the_divergence_and_k2_reward_is_biased():
    rows = {r["placement"]: r for r in categorical_placements(*_policy(3))}
    assert set(rows) == set(PLACEMENTS)
    assert rows["k1 in loss"]["equals"] == "0" and rows["k3 in loss (GRPO)"]["equals"] == "KL(ref‖π)"
    assert rows["k1 as reward (PPO-RLHF)"]["equals"] == "KL(π‖ref)"
    assert rows["k2 as reward"]["equals"] == "none" and rows["k2 as reward"]["cos"] < 0.99
    assert "KL(ref‖π)" in placement_table(list(rows.values()))


def test_k3_in_loss_agrees_near_the_reference_and_drifts_away_from_it():
    theta, ref = _policy(0)
    sweep = distance_sweep(ref, theta - ref, [0.05, 2.0], names=["k3 in loss (GRPO)"])
    cos, ratio = sweep["k3 in loss (GRPO)/cos"], sweep["k3 in loss (GRPO)/norm_ratio"]
    assert sweep["kl"][0] < sweep["kl"][1]
    assert cos[0] > 0.999 and abs(ratio[0] - 1) < 0.05  # the two directions agree to second order
    assert cos[1] < 0.95


def test_monte_carlo_error_matches_bias_and_variance():
    theta, ref = _policy(0)
    rows = monte_carlo(theta, ref, sample_counts=(1, 16), repeats=4000, seed=0,
                       names=["k1 in loss", "k3 in loss (GRPO)", "k1 as reward (PPO-RLHF)"])
    for r in rows:  # 4000 repeats: the measured MSE is within ~10% of bias² + variance / N
        assert r["mse"] == pytest.approx(r["predicted"], rel=0.15)
    unbiased = [r for r in rows if r["placement"] == "k1 as reward (PPO-RLHF)"]
    assert all(r["bias2"] < 1e-20 for r in unbiased)


def test_sequence_level_only_the_return_reaches_the_sequence_kl():
    lm = TabularLM(vocab=3, length=3)
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(lm.num_contexts, 3, generator=g, dtype=torch.float64)
    theta = ref + 0.7 * torch.randn(lm.num_contexts, 3, generator=g, dtype=torch.float64)
    rows = {r["placement"]: r for r in sequence_placements(lm, theta, ref)}
    assert rows["k1 as reward, reward-to-go (PPO)"]["equals"] == "seq KL(π‖ref)"
    assert rows["k1 as reward, sequence sum (RLOO)"]["equals"] == "seq KL(π‖ref)"
    assert rows["k1 in loss"]["equals"] == "0"
    for name in ("k2 in loss", "k3·ρ in loss (TRL 1.16)", "k1 as reward, own token only"):
        assert rows[name]["equals"] == "per-position KL(π‖ref), sg(prefix)" and rows[name]["cos"] < 0.999
    assert rows["k3 in loss (GRPO)"]["equals"] == "per-position KL(ref‖π), sg(prefix)"
    # the true gradient by autograd on the enumerated sequence KL
    t = theta.clone().requires_grad_(True)
    lp, lr = lm.token_logprobs(t).sum(-1), lm.token_logprobs(ref).sum(-1)
    assert lp.exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    true = torch.autograd.grad((lp.exp() * (lp - lr)).sum(), t)[0].flatten()
    torch.testing.assert_close(rows["k1 as reward, reward-to-go (PPO)"]["mean"], true, rtol=0, atol=1e-12)


def test_bad_input_is_named():
    theta, ref = _policy(0)
    with pytest.raises(TypeError, match="float64"):
        exact_kl_gradients(theta.float(), ref.float())
    with pytest.raises(ValueError, match="theta and ref_logits"):
        exact_kl_gradients(theta, ref[:3])
    with pytest.raises(ValueError, match="repeats"):
        monte_carlo(theta, ref, repeats=1)
    with pytest.raises(ValueError, match="theta must be"):
        TabularLM(3, 2).token_logprobs(torch.zeros(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="vocab"):
        TabularLM(1, 3)


def test_sequence_kl_is_the_enumerated_sum():
    lm = TabularLM(vocab=2, length=2)  # contexts: "", "0", "1"
    ref = torch.zeros(3, 2, dtype=torch.float64)  # uniform: every sequence 1/4
    theta = torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    p1 = torch.softmax(theta[0], -1)
    probs = torch.stack([p1[0] * torch.softmax(theta[1], -1), p1[1] * torch.softmax(theta[2], -1)]).flatten()
    assert lm.sequence_kl(theta, ref) == pytest.approx(float((probs * (probs / 0.25).log()).sum()), abs=1e-12)
