"""Lesson 02's experiment plumbing (minigrpo_course.experiments.actor_critic): the batched CartPole physics against
gymnasium, the on-the-fly GAE estimates of the continuations against their closed forms, the bias/variance
bookkeeping against a hand computation, and the sweep and table helpers."""

import gymnasium as gym
import matplotlib
import numpy as np
import pytest
import torch

from minigrpo_course.experiments.actor_critic import (bias_variance, cartpole_step, check_batched_physics, continuations,
                                                      lambda_sweep, mean_se, plot_bias_variance, plot_lambda_curves,
                                                      policy_episodes, print_bias_variance, print_lambda_table, smooth)

matplotlib.use("Agg")


class FixedAgent:
    """A CartPole policy with fixed action probabilities (``p_right`` for action 1), whatever the state."""

    def __init__(self, p_right: float):
        self.p_right = p_right

    def dist(self, obs):
        p = torch.tensor([1 - self.p_right, self.p_right], dtype=torch.float64)
        return torch.distributions.Categorical(probs=p.expand(len(obs), 2))


def test_cartpole_step_matches_gymnasium_on_random_states():
    rng = np.random.default_rng(0)
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    states = rng.uniform(-0.2, 0.2, size=(64, 4))
    states[:8, 2:] = 0.205, 0.5                 # next angle 0.215 > 12° (0.2094 rad): these terminate
    actions = rng.integers(0, 2, size=64)
    nxt, term = cartpole_step(torch.tensor(states), torch.tensor(actions))
    for i in range(64):
        env.unwrapped.state, env.unwrapped.steps_beyond_terminated = states[i].copy(), None
        _, _, terminated, _, _ = env.step(int(actions[i]))
        assert np.allclose(nxt[i].numpy(), env.unwrapped.state, rtol=0, atol=1e-12)
        assert bool(term[i]) == terminated
    assert term.any() and not term.all()


def test_cartpole_step_names_a_bad_state_shape():
    with pytest.raises(ValueError, match="state"):
        cartpole_step(torch.zeros(4), torch.zeros(1))


def test_policy_episodes_and_the_physics_check():
    torch.manual_seed(0)
    episodes = policy_episodes(FixedAgent(0.5), 3, seed=7)
    assert len(episodes) == 3
    for states, actions, rewards in episodes:
        assert states.shape == (len(actions), 4) and rewards.shape == actions.shape and (rewards == 1).all()
    torch.manual_seed(0)                        # the same sampled actions: the same episodes
    max_diff, n_checked, same_ends = check_batched_physics(FixedAgent(0.5), 3, seed=7)
    assert n_checked == sum(len(e[1]) for e in episodes)
    assert max_diff < 1e-12 and same_ends


def test_continuations_match_closed_forms_with_a_constant_critic():
    """Always pushing right is deterministic: every continuation has the same length T. With V ≡ c:
    λ = 0 gives δ_0 = 1 + γc − c, λ = 1 gives the discounted return minus c (no bootstrap at the fall)."""
    gamma, c = 0.9, 2.0
    s0 = torch.zeros(2, 4, dtype=torch.float64)
    a0 = torch.tensor([1, 0])
    critic = lambda s: torch.full((len(s),), c)   # noqa: E731
    ret, est, v0, n_cut = continuations(FixedAgent(1.0), [critic], s0, a0, 3, [0.0, 1.0], gamma, horizon=500)
    assert ret.shape == (2, 3) and est.shape == (1, 2, 2, 3) and v0.shape == (1, 2) and n_cut == 0
    assert torch.allclose(v0, torch.full((1, 2), c, dtype=torch.float64))
    assert torch.allclose(est[0, 0], torch.full((2, 3), 1 + gamma * c - c, dtype=torch.float64))
    assert torch.allclose(est[0, 1], ret - c, atol=1e-12)
    for i in range(2):                          # the return against a step-by-step count in gymnasium
        env = gym.make("CartPole-v1")
        env.reset(seed=0)
        env.unwrapped.state = np.zeros(4)
        T, a = 0, int(a0[i])
        while True:
            _, _, terminated, _, _ = env.step(a)
            T, a = T + 1, 1
            if terminated:
                break
        assert torch.allclose(ret[i], torch.full((3,), (1 - gamma**T) / (1 - gamma), dtype=torch.float64))


def test_continuations_bootstrap_at_the_horizon():
    """Cut after 3 steps from the upright state (it cannot fall that fast): return 1 + γ + γ² + γ³·V."""
    gamma = 0.5
    critic = lambda s: torch.full((len(s),), 4.0)   # noqa: E731
    ret, _, _, n_cut = continuations(FixedAgent(0.5), [critic], torch.zeros(1, 4, dtype=torch.float64),
                                     torch.tensor([1]), 2, [0.5], gamma, horizon=3)
    assert n_cut == 2
    assert torch.allclose(ret, torch.full((1, 2), 1 + 0.5 + 0.25 + 0.125 * 4.0, dtype=torch.float64))


def test_continuations_names_mismatched_pairs():
    with pytest.raises(ValueError, match="s0 and a0"):
        continuations(FixedAgent(0.5), [], torch.zeros(2, 4), torch.zeros(3), 1, [0.0], 0.9, 10)


def test_bias_variance_matches_a_hand_computation():
    # One pair: truth = mean(10, 12) − V = 11 − 1 = 10; estimates 8, 12, 13 (mean 11, var 7).
    returns = torch.tensor([[10.0, 12.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    estimates = torch.tensor([[[99.0, 99.0, 8.0, 12.0, 13.0]]], dtype=torch.float64)   # [L=1, S=1, n=5]
    bias2, var, floor = bias_variance(returns, estimates, torch.tensor([1.0], dtype=torch.float64), m=2)
    assert torch.allclose(bias2, torch.tensor([1.0], dtype=torch.float64))
    assert torch.allclose(var, torch.tensor([7.0], dtype=torch.float64))
    assert torch.allclose(floor, torch.tensor([7.0 / 3 + 2.0 / 2], dtype=torch.float64))


def test_bias_variance_names_a_bad_m():
    with pytest.raises(ValueError, match="m"):
        bias_variance(torch.zeros(1, 4), torch.zeros(1, 1, 4), torch.zeros(1), m=3)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NaN-only slices of the first iterations
def test_tables_and_plots(capsys):
    b = torch.tensor([1.0, 0.5]), torch.tensor([0.0, 2.0]), torch.tensor([0.1, 0.2])
    print_bias_variance("critic", [0.0, 1.0], *b, v_minus_q=-3.0, q_mean=40.0)
    out = capsys.readouterr().out
    assert "averages -3.0" in out and "  1.00       0.50       2.00       2.50" in out and "≈ 0.20" in out
    plot_bias_variance({"a": b, "b": b}, [0.0, 1.0])
    hist = {"env_steps": [10, 20, 30], "train_return": [np.nan, 2.0, 4.0], "explained_variance": [0.0, 0.5, 1.0]}
    curves = {(0.5, 0): hist, (0.5, 1): {**hist, "train_return": [1.0, 3.0, 5.0]}}
    plot_lambda_curves(curves, [0.5], [0, 1])
    print_lambda_table(curves, [0.5], [0, 1])
    out = capsys.readouterr().out.splitlines()
    # seed 0: whole 3.0, last 4.0; seed 1: whole 3.0, last 5.0
    assert out[1] == f"{0.5:6.2f} {mean_se([3.0, 3.0]):>27s} {mean_se([4.0, 5.0]):>22s}"


@pytest.mark.filterwarnings("ignore:Mean of empty slice")
def test_mean_se_and_smooth():
    assert mean_se([1.0, 3.0]) == "   2.0 ±   1.0"
    assert mean_se([5.0]) == "   5.0 ±   0.0"
    assert np.allclose(smooth([np.nan, 1.0, 3.0, 5.0], w=2), [np.nan, 1.0, 2.0, 4.0], equal_nan=True)


def test_lambda_sweep_runs_every_pair_in_order():
    calls = []

    class Result:
        def __init__(self, cfg):
            self.history = {"cfg": cfg}

    def train(cfg, progress):
        calls.append(cfg)
        return Result(cfg)

    curves, seconds = lambda_sweep(train, lambda lam, seed: (lam, seed), [0.0, 1.0], [3, 4])
    assert calls == [(0.0, 3), (0.0, 4), (1.0, 3), (1.0, 4)]
    assert curves[1.0, 4] == {"cfg": (1.0, 4)} and seconds >= 0
