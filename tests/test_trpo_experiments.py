"""Lesson 03's experiment plumbing (minigrpo_course.experiments.trpo): the on-policy batch, the step-length sweep,
the functional view of an actor used for exact Fisher matrices, and the tables and plots of TRPO runs."""

import gymnasium as gym
import matplotlib
import numpy as np
import pytest
import torch

from minigrpo.control import ActorCritic
from minigrpo_course.experiments.trpo import (band, delta_sweep, first_solved, functional_view, kl_summary, plot_cg_vs_sd,
                                              plot_trpo_runs, policy_batch, print_solved_table, print_step_sweep,
                                              sampled_return, show_delta_sweep, step_length_sweep)
from minigrpo.trust_region import flat_params, set_flat_params

matplotlib.use("Agg")


def cartpole_agent(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    env = gym.make("CartPole-v1")
    return ActorCritic(env.observation_space, env.action_space, (16,))


def test_policy_batch_is_flat_and_normalised():
    batch = policy_batch(cartpole_agent(), seed=0, num_envs=2, num_steps=16)
    assert batch["obs"].shape == (32, 4)
    assert batch["actions"].shape == batch["old_logp"].shape == batch["adv"].shape == (32,)
    assert abs(batch["adv"].mean().item()) < 1e-6 and abs(batch["adv"].std().item() - 1) < 1e-4


def test_sampled_return_uses_common_random_numbers():
    agent = cartpole_agent()
    assert sampled_return(agent, 3) == sampled_return(agent, 3)


def test_step_length_sweep_measures_from_theta_old_and_restores_it():
    agent = cartpole_agent()
    obs = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    params = list(agent.actor_parameters())
    theta_old = flat_params(params)
    with torch.no_grad():
        old_logits = agent.actor(obs)
    adv = torch.randn(64, generator=torch.Generator().manual_seed(1))

    def surrogate():                                      # ratio of action 0's probability, times A
        return (agent.actor(obs).log_softmax(-1)[:, 0].exp() / old_logits.log_softmax(-1)[:, 0].exp() * adv).mean()

    def mean_kl():
        lo, ln = old_logits.log_softmax(-1), agent.actor(obs).log_softmax(-1)
        return (lo.exp() * (lo - ln)).sum(-1).mean()

    direction = torch.randn(theta_old.numel(), generator=torch.Generator().manual_seed(2))
    curves = step_length_sweep(agent, params, theta_old, {"d": direction / direction.norm()}, [0.0, 0.1, 1.0],
                               mean_kl, surrogate, baseline=adv.mean().item(), n_eval=2)
    kl, gain, ret = curves["d"].T
    assert curves["d"].shape == (3, 3)
    assert abs(kl[0]) < 1e-7 and abs(gain[0]) < 1e-6      # η = 0: the old policy, ratio 1
    assert kl[0] < kl[1] < kl[2] and (ret >= 8).all()     # CartPole lasts at least 8 steps
    assert torch.equal(flat_params(params), theta_old)


def test_functional_view_matches_the_module():
    actor = cartpole_agent().actor.double()
    theta0, f = functional_view(actor)
    x = torch.randn(5, 4, dtype=torch.float64)
    assert torch.equal(theta0, flat_params(list(actor.parameters())))
    assert torch.allclose(f(theta0, x), actor(x))
    theta1 = theta0 + 0.1
    expected = f(theta1, x)
    set_flat_params(list(actor.parameters()), theta1)
    assert torch.allclose(expected, actor(x))
    with pytest.raises(ValueError, match="theta"):
        f(theta0[:-1], x)


def test_first_solved_band_and_kl_summary():
    h = {"eval_step": [10, 20, 30], "eval_return": [100.0, 480.0, 300.0]}
    assert first_solved(h) == 20 and first_solved(h, target=500) is None
    h2 = {"eval_step": [10, 30], "eval_return": [0.0, 100.0]}
    grid, mean, lo, hi = band([h, h2], "eval_step", "eval_return")
    assert np.allclose(grid, [10, 20, 30]) and np.allclose(lo, [0, 50, 100]) and np.allclose(mean, [50, 265, 200])
    hists = [{"kl": [0.002, 0.008], "step_fraction": [1.0, 0.5]}, {"kl": [0.004, 0.009], "step_fraction": [1.0, 0.0]}]
    assert kl_summary(hists, 0.01) == ("4 TRPO updates: KL min 0.0020, median 0.0060, max 0.0090 (δ = 0.01); "
                                       "full step accepted in 50%, backtracked in 25%, rejected in 25%")


def test_tables_print_what_they_say(capsys):
    etas = [0.1, 1.0]
    curves = {"plain gradient g": np.array([[1e-3, 0.0, 100.0], [1.0, 0.0, 10.0]]),
              "natural gradient F⁻¹g": np.array([[2e-4, 0.0, 110.0], [0.5, 0.0, 200.0]])}
    print_step_sweep(etas, curves)
    h = {"eval_step": [10, 20], "eval_return": [480.0, 500.0]}
    print_solved_table([0], {"TRPO": [h], "A2C": [{**h, "eval_return": [10.0, 20.0]}]})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{'|Δθ|':>7} | {'plain: KL':>10} {'return':>7} | {'natural: KL':>11} {'return':>7}"
    assert out[2] == "  1.000 |   1.00e+00      10 |    5.00e-01     200"
    assert "TRPO: first eval ≥ 475" in out[3] and "A2C: first eval ≥ 475" in out[3]
    assert out[4].split() == ["0", "|", "10", "500", "|", "not", "yet", "20"]


def test_sweep_and_plots_run_on_small_histories(capsys):
    calls = []

    class Result:
        def __init__(self, delta, seed):
            self.history = {"kl": [0.5 * delta, 0.9 * delta], "step_fraction": [1.0, 0.5], "env_steps": [1, 2],
                            "train_return": [10.0, 20.0 + seed], "iteration": [0, 1],
                            "eval_step": [1, 2], "eval_return": [10.0, 480.0]}

    def train(cfg, progress):
        calls.append(cfg)
        return Result(*cfg)

    runs = delta_sweep(train, lambda delta, seed: (delta, seed), [0.01, 0.1], [0, 1])
    assert calls == [(0.01, 0), (0.01, 1), (0.1, 0), (0.1, 1)]
    show_delta_sweep(runs)
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row == ["0.100", "|", "0.70", "0.90", "|", "50%", "0%", "|", "20"]     # final returns 20 and 21
    plot_trpo_runs({"TRPO": runs[0.01], "A2C": runs[0.1]}, [0, 1], max_kl=0.01)
    plot_cg_vs_sd(torch.tensor([1e-3, 0.5]), {0.1: ([1.0, 1e-3], [1.0, 0.5]), 0.01: ([1.0, 1e-2], [1.0, 0.9])})
