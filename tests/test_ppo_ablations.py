"""PPO-Penalty's adaptive β, lesson 04's clip-side split and lesson 05's length-bias toy."""

import math

import numpy as np
import pytest
import torch

from minigrpo.control.ppo_penalty import (PPOPenaltyConfig, adaptive_kl_coef, penalty_loss,
                                          train_ppo_penalty)
from minigrpo.experiments.length_bias import expected_length, sample_group, train_lengths
from minigrpo.experiments.ppo_ablations import clip_sides, slopes_by_side, surrogate_terms


@pytest.mark.parametrize("beta, kl, expected", [
    (1.0, 0.005, 0.5),      # 0.005 < 0.01 / 1.5 = 0.00667: halve
    (1.0, 0.02, 2.0),       # 0.02 > 1.5 · 0.01 = 0.015: double
    (1.0, 0.012, 1.0),      # inside [0.00667, 0.015]: keep
    (0.25, 0.0, 0.125),     # no movement at all: halve
    (3.0, 0.015, 3.0),      # exactly 1.5 · target: keep (the paper's rule is strict)
    (3.0, 0.0151, 6.0),
])
def test_adaptive_kl_coef_follows_the_papers_rule(beta, kl, expected):
    assert adaptive_kl_coef(beta, kl, 0.01) == expected


def test_adaptive_kl_coef_refuses_a_bad_kl():
    with pytest.raises(ValueError, match="kl"):
        adaptive_kl_coef(1.0, float("nan"), 0.01)
    with pytest.raises(ValueError, match="kl"):
        adaptive_kl_coef(1.0, -0.1, 0.01)


def test_penalty_config_names_a_bad_field():
    with pytest.raises(ValueError, match="kl_target"):
        PPOPenaltyConfig(kl_target=0.0)


def test_penalty_loss_matches_a_hand_computation():
    """At the sampling policy (ratio 1) the k3 KL is 0 and its gradient too: the loss is −mean(A) + vf + ent."""
    from minigrpo.control import ActorCritic, make_vec_env

    envs = make_vec_env("CartPole-v1", 1)
    torch.manual_seed(0)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space)
    envs.close()
    obs = torch.randn(6, 4)
    with torch.no_grad():
        dist = agent.dist(obs)
        actions = dist.sample()
        old_logp = dist.log_prob(actions)
        values = agent.value(obs)
    adv = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, -1.0])
    ret = torch.randn(6)
    cfg = PPOPenaltyConfig(norm_adv=False, vf_coef=0.5, ent_coef=0.01, clip_vloss=False)
    loss, m = penalty_loss(cfg, agent, [obs, actions, old_logp, adv, ret, values], kl_coef=5.0, clip=0.2)
    expected = -adv.mean() + 0.5 * 0.5 * (values - ret).pow(2).mean() - 0.01 * dist.entropy().mean()
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_ppo_penalty_adapts_beta_from_the_logged_kl():
    cfg = PPOPenaltyConfig(num_envs=2, num_steps=32, num_minibatches=2, update_epochs=2, total_timesteps=256,
                           kl_coef=1.0, kl_target=0.001, eval_every_steps=0)
    h = train_ppo_penalty(cfg, progress=False).history
    assert h["kl_coef"][0] == 1.0 and len(h["kl_coef"]) == 4
    for i in range(3):
        assert h["kl_coef"][i + 1] == adaptive_kl_coef(h["kl_coef"][i], h["kl"][i], cfg.kl_target)


def test_clip_sides_label_the_six_cases_of_lesson_04():
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1, 0.9, 1.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0, -2.0, 1.0])
    assert clip_sides(ratio, adv, 0.2).tolist() == [1, 2, 2, 1, 0, 0, 0]


def test_side_slopes_add_up_to_the_slope_of_the_clipped_objective():
    torch.manual_seed(0)
    old = torch.randn(50)
    adv = torch.randn(50)
    direction = torch.randn(50)
    alphas = np.linspace(0, 1, 11)
    terms, labels = zip(*(surrogate_terms(old + a * direction, old, adv, 0.2) for a in alphas))
    terms, labels = torch.stack(terms).numpy(), torch.stack(labels).numpy()
    slopes = slopes_by_side(alphas, terms, labels)
    assert np.allclose(slopes.sum(1), np.diff(terms.mean(1)) / np.diff(alphas), atol=1e-6)
    assert (slopes[:, 2] <= 1e-7).all()          # the wrong-way samples only ever lower the objective


def test_expected_length_is_the_truncated_geometric_mean():
    q, L = 0.9, 64
    assert expected_length(math.log(q / (1 - q)), L).item() == pytest.approx((1 - q ** L) / (1 - q), rel=1e-9)


def test_sample_group_log_probs_are_those_of_the_lengths():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([0.5, 2.0])
    right, logp, mask = sample_group(logits, 200, 8, gen)
    length = mask[:, 1:].sum(1)
    q = torch.sigmoid(logits)[(1 - right).long()]
    by_hand = math.log(0.5) + (length - 1) * q.log() + torch.where(length < 8, (1 - q).log(), torch.zeros_like(q))
    assert torch.allclose((logp * mask).sum(1), by_hand, atol=1e-5)
    assert length.min() >= 1 and length.max() <= 8


def test_seq_mean_lengthens_wrong_answers_and_shortens_right_ones():
    """Length is irrelevant to the reward, so only the aggregation can move it. Measured over seeds 0–2 after
    40 steps: seq_mean gives right/wrong expected lengths of 5.0–5.1 / 19.0–19.6 (from 10 / 10); sum_norm
    stays within 9.8–12.7 for both. Asserted: seq_mean's wrong answers ≥ 1.5× its right ones, on each of 2 seeds."""
    for seed in (0, 1):
        right, wrong = train_lengths("seq_mean", seed, steps=40)[-1]
        assert wrong >= 1.5 * right, (seed, right, wrong)
