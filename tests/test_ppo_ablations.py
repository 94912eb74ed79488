"""PPO-Penalty's adaptive β, lesson 04's clip-side split, its drift and staleness probes and result tables,
and lesson 05's length-bias toy."""

import math

import numpy as np
import pytest
import torch

from minigrpo.control.ppo_penalty import (PPOPenaltyConfig, adaptive_kl_coef, penalty_loss,
                                          train_ppo_penalty)
from minigrpo_course.experiments.length_bias import expected_length, sample_group, train_lengths
from minigrpo_course.experiments.ppo_ablations import clip_sides, slopes_by_side, surrogate_terms
from minigrpo_course.experiments.ppo_drift import (epoch_drift, make_stale_update, on_arrival, print_drift_table,
                                                   print_stale_summary, probe_mean, run_stale, scan_gradient_direction)
from minigrpo_course.experiments.ppo_reports import plot_seed_bands, print_final_runs, print_solve_table


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


# --- lesson 04's drift and staleness experiments (minigrpo_course.experiments.ppo_drift) ---

def _cartpole_batch(seed=0, steps=32):
    """A fresh CartPole ActorCritic and one rollout of 4 envs × ``steps`` from it, flattened, with GAE advantages."""
    from types import SimpleNamespace

    from minigrpo.advantages import gae
    from minigrpo.control import ActorCritic, make_vec_env
    from minigrpo.control.onpolicy import RolloutCollector

    torch.manual_seed(seed)
    envs = make_vec_env("CartPole-v1", 4)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space)
    ro = RolloutCollector(envs, seed=seed).collect(agent, steps)
    envs.close()
    adv = gae(ro.rewards, ro.values, ro.next_values, ro.terminated, ro.truncated, 0.99, 0.95).flatten()
    return agent, SimpleNamespace(obs=ro.obs.flatten(0, 1), actions=ro.actions.flatten(), logp=ro.logp.flatten(),
                                  adv=adv)


def test_gradient_scan_starts_at_the_policy_gradient_and_stays_below_the_surrogate():
    """At α = 0: L^IS = L^CLIP = mean(A), KL = 0; dL^IS/dα there is the gradient's norm (d is its unit vector,
    checked by a central difference against autograd); L^CLIP ≤ L^IS at every α; the agent is not moved."""
    agent, b = _cartpole_batch()
    adv = (b.adv - b.adv.mean()) / (b.adv.std() + 1e-8)
    before = [p.detach().clone() for p in agent.parameters()]
    h = 1e-3
    L_is, L_clip, kl, terms, sides = scan_gradient_direction(agent, b.obs, b.actions, b.logp, adv,
                                                             torch.tensor([-h, 0.0, h, 0.5]))
    params = list(agent.actor.parameters())
    surr = (torch.exp(agent.dist(b.obs).log_prob(b.actions) - b.logp) * adv).mean()
    norm = torch.nn.utils.parameters_to_vector(torch.autograd.grad(surr, params)).norm().item()
    assert L_is[1] == pytest.approx(adv.mean().item(), abs=1e-6) and L_clip[1] == pytest.approx(L_is[1], abs=1e-7)
    assert kl[1] == pytest.approx(0.0, abs=1e-7)
    assert (L_is[2] - L_is[0]) / (2 * h) == pytest.approx(norm, rel=1e-2)
    assert all(c <= i + 1e-7 for c, i in zip(L_clip, L_is)) and kl[3] > 0
    assert len(terms) == len(sides) == 4 and terms[0].shape == (len(b.obs),)
    assert all(torch.equal(p, q) for p, q in zip(before, agent.parameters()))


def test_epoch_drift_does_not_move_with_a_zero_learning_rate():
    agent, b = _cartpole_batch()
    rows = epoch_drift(agent, b.obs, b.actions, b.logp, b.adv, 0.2, epochs=2, lr=0.0)
    assert [r["epoch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["clip_frac"] == 0 and r["approx_kl"] == pytest.approx(0.0, abs=1e-7)
        assert r["max_abs_log_r"] == pytest.approx(0.0, abs=1e-6) and r["log_r"].shape == (len(b.obs),)
    with pytest.raises(ValueError, match="epochs"):
        epoch_drift(agent, b.obs, b.actions, b.logp, b.adv, 0.2, epochs=0)


def test_epoch_drift_runs_away_without_the_clip():
    """Lesson 04, section 4, on a smaller batch (4 envs × 64 steps). Measured after 10 epochs, seeds 0–4: approx
    KL 0.0010–0.0026 with ε = 0.1, 0.13–0.51 without the clip (86× to 196×). Asserted: ≥ 20× on each of seeds 0
    and 1, and the agent passed in is left as it was."""
    for seed in (0, 1):
        agent, b = _cartpole_batch(seed, steps=64)
        before = [p.detach().clone() for p in agent.parameters()]
        clipped = epoch_drift(agent, b.obs, b.actions, b.logp, b.adv, 0.1, epochs=10, seed=seed)[-1]["approx_kl"]
        free = epoch_drift(agent, b.obs, b.actions, b.logp, b.adv, None, epochs=10, seed=seed)[-1]["approx_kl"]
        assert free >= 20 * clipped, (seed, clipped, free)
        assert all(torch.equal(p, q) for p, q in zip(before, agent.parameters()))


def test_print_drift_table_shows_the_chosen_epochs(capsys):
    rows = [{"epoch": e, "clip_frac": 0.1 * e, "approx_kl": 0.01 * e, "max_abs_log_r": 0.5 * e} for e in (1, 2, 3)]
    print_drift_table({"ε = 0.2": rows}, [1, 3])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["clip", "fraction", "epoch", "1", "epoch", "3"]
    assert out[1].split() == ["ε", "=", "0.2", "0.100", "0.300"]
    assert out[4].split()[-2:] == ["0.0100", "0.0300"] and out[7].split()[-2:] == ["0.50", "1.50"]


def test_on_arrival_counts_the_samples_the_clip_has_already_switched_off():
    """Ratios set by hand: the clipped share at ε is that of clip_sides' label 1, and mean |log r| is exact."""
    from types import SimpleNamespace

    agent, b = _cartpole_batch()
    obs, actions = b.obs[:6], b.actions[:6]
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1, 0.9])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0, -2.0])
    with torch.no_grad():
        logp = agent.dist(obs).log_prob(actions)
    ro = SimpleNamespace(obs=obs, actions=actions, logp=logp - ratio.log())
    mean_abs, dead = on_arrival(agent, ro, adv, (0.2, 0.6))
    assert mean_abs == pytest.approx(ratio.log().abs().mean().item(), rel=1e-5)
    assert dead[0.2] == pytest.approx(2 / 6) and dead[0.2] == pytest.approx((clip_sides(ratio, adv, 0.2) == 1).float().mean().item())
    assert dead[0.6] == 0.0


def _tiny_ppo(**change):
    return dict(env_id="CartPole-v1", num_envs=2, num_steps=16, num_minibatches=2, update_epochs=2,
                total_timesteps=160, eval_every_steps=0, seed=0, **change)


def test_stale_update_with_k_0_is_train_ppos_update():
    from minigrpo.control import PPOConfig, train_ppo

    runs = run_stale(_tiny_ppo(), [0], [0], probe_ks=(), eps_grid=())
    ref = train_ppo(PPOConfig(**_tiny_ppo()), progress=False)
    for key in ("train_return", "approx_kl", "clip_frac", "policy_loss"):
        assert runs[0, 0].history[key] == ref.history[key], key


def test_stale_probes_wait_for_the_rollout_and_stale_runs_differ():
    runs = run_stale(_tiny_ppo(), [0, 2], [0], probe_ks=(1, 3), eps_grid=(0.2,))
    h = runs[0, 0].history
    assert len(h["probe_logr_1"]) == 5
    assert np.isnan(h["probe_logr_1"][0]) and not np.isnan(h["probe_logr_1"][1])
    assert np.isnan(h["probe_clip_3_0.2"][2]) and 0 <= h["probe_clip_3_0.2"][3] <= 1
    assert "probe_logr_1" not in runs[2, 0].history                    # only the k = 0 runs probe
    assert runs[2, 0].history["approx_kl"] != h["approx_kl"]
    assert probe_mean([h], "probe_logr_1") == pytest.approx(np.mean(h["probe_logr_1"][1:]))
    with pytest.raises(ValueError, match="k"):
        make_stale_update(None, -1)


def test_print_stale_summary_prints_final_returns_and_probes(capsys):
    from types import SimpleNamespace

    hist = {"train_return": [10.0, 30.0], "probe_logr_1": [np.nan, 0.5], "probe_clip_1_0.2": [np.nan, 0.25]}
    runs = {(0, 0): SimpleNamespace(history=hist), (2, 0): SimpleNamespace(history={"train_return": [5.0, 7.0]})}
    print_stale_summary(runs, [0, 2], [0], [1], [0.2])
    out = capsys.readouterr().out
    assert "k =  0:    30   (mean 30)" in out and "k =  2:     7   (mean 7)" in out
    assert out.splitlines()[-1].split() == ["1", "0.500", "0.250"]


# --- lesson 04's result tables (minigrpo_course.experiments.ppo_reports) ---

def _result(step, seconds, sps, **history):
    from types import SimpleNamespace

    return SimpleNamespace(solved_at_step=step, solved_at_seconds=seconds, history={"sps": sps, **history})


def test_solve_table_gives_per_seed_figures_and_medians(capsys):
    runs = {"PPO": [_result(5000, 5.0, [100.0]), _result(10000, 9.0, [300.0]), _result(None, None, [200.0])],
            "TRPO": [_result(None, None, [1.0])] * 3}
    print_solve_table(runs, [0, 1, 2], smoke=True)
    out = capsys.readouterr().out.splitlines()
    assert out[2].split() == ["0", "|", "5000", "5.0", "|", "—", "—"]
    assert out[5] == "PPO: solved 2/3 seeds; median 7500 steps, 7.0 s; 200 env steps/s during training"
    assert out[6] == "TRPO: not solved within the budget (smoke mode)"
    with pytest.raises(ValueError, match="runs"):
        print_solve_table({"PPO": []}, [0])


def test_final_runs_and_seed_bands():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from types import SimpleNamespace

    agent = SimpleNamespace(log_std=torch.tensor(math.log(0.5)))
    rs = [SimpleNamespace(agent=agent, history={"eval_return": [-900.0, y], "eval_step": [10, 20],
                                                 "explained_variance": [0.5, 0.9, 1.0]}) for y in (-150.0, -170.0)]
    print_final_runs({"scaled": rs})
    fig, ax = plt.subplots()
    plot_seed_bands({"scaled": rs, "smoke": [SimpleNamespace(history={"eval_return": []})]}, ax)
    (line,) = ax.get_lines()
    assert line.get_ydata().tolist() == [-900.0, -160.0] and line.get_label() == "scaled"
    plt.close(fig)
