"""minigrpo_course.experiments.time_limits: the CashOut env, and A2C trained on one-step targets from any function."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from minigrpo_course.experiments.time_limits import (CASH_OUT_BONUS, CASH_OUT_ID, CASH_OUT_LIMIT, CashOutEnv,
                                                     cash_out_config, cash_out_probability, late_episode_length,
                                                     train_a2c_on_targets, value_of_working)


def test_cash_out_pays_one_per_step_of_work_and_the_bonus_once():
    env = CashOutEnv()
    obs, _ = env.reset(seed=0)
    assert obs.tolist() == [1.0] and env.observation_space.contains(obs)
    assert env.step(0)[1:4] == (1.0, False, False)
    obs, reward, terminated, truncated, _ = env.step(1)
    assert (reward, terminated, truncated) == (CASH_OUT_BONUS, True, False) and obs.tolist() == [1.0]
    with pytest.raises(ValueError, match="bonus"):
        CashOutEnv(bonus=float("nan"))


def test_the_registered_env_truncates_after_five_steps_of_work():
    env = gym.make(CASH_OUT_ID)
    env.reset(seed=0)
    flags = [env.step(0)[2:4] for _ in range(CASH_OUT_LIMIT)]
    assert flags == [(False, False)] * (CASH_OUT_LIMIT - 1) + [(False, True)]


def test_working_forever_is_worth_more_than_cashing_out_but_five_steps_of_it_are_not():
    """The premise of the ablation, with γ = 0.9: Σ γ^k = 10 > bonus 5 > 1 + 0.9 + … + 0.9^4 = 4.10."""
    gamma = cash_out_config(0).gamma
    assert 1 / (1 - gamma) > CASH_OUT_BONUS > sum(gamma**k for k in range(CASH_OUT_LIMIT))


def test_train_a2c_on_targets_hands_the_rollout_to_the_targets_function():
    """The targets function sees each rollout's rewards, next values and both flags, as [num_steps, num_envs];
    a time limit shows up as truncated, a cash-out as terminated (reward 5)."""
    seen = []

    def targets(rewards, next_values, terminated, truncated, gamma):
        seen.append((rewards.clone(), terminated.clone(), truncated.clone(), gamma))
        return rewards + gamma * torch.where(terminated, torch.zeros_like(next_values), next_values)

    cfg = cash_out_config(0, total_timesteps=512)
    result = train_a2c_on_targets(targets, cfg)
    assert len(seen) == cfg.num_iterations == 4
    rewards, terminated, truncated = (torch.cat([s[i] for s in seen]) for i in range(3))
    assert rewards.shape == (4 * cfg.num_steps, cfg.num_envs) and {s[3] for s in seen} == {0.9}
    assert truncated.any() and terminated.any()
    assert torch.equal(terminated, rewards == CASH_OUT_BONUS)
    assert 0.0 <= cash_out_probability(result.agent) <= 1.0 and np.isfinite(value_of_working(result.agent))
    assert 1.0 <= late_episode_length(result) <= CASH_OUT_LIMIT


def test_train_a2c_on_targets_refuses_a_lambda_other_than_zero():
    cfg = cash_out_config(0, total_timesteps=512)
    cfg.gae_lambda = 0.95
    with pytest.raises(ValueError, match="gae_lambda"):
        train_a2c_on_targets(lambda r, nv, term, trunc, g: r, cfg)


def test_the_run_is_reproducible_and_the_trainer_is_restored():
    """Same seed, same numbers; and after the run the trainer's own gae is back in place."""
    import minigrpo.control.onpolicy as onpolicy
    from minigrpo.advantages import gae

    def targets(rewards, next_values, terminated, truncated, gamma):
        return rewards + gamma * torch.where(terminated, torch.zeros_like(next_values), next_values)

    runs = [train_a2c_on_targets(targets, cash_out_config(3, total_timesteps=1024)) for _ in range(2)]
    assert runs[0].history["episode_length"] == runs[1].history["episode_length"]
    assert onpolicy.gae is gae


def test_late_episode_length_averages_the_last_share_of_iterations():
    class Result:
        history = {"episode_length": [1.0, float("nan"), 3.0, 5.0]}

    assert late_episode_length(Result()) == 4.0
    assert late_episode_length(Result(), share=1.0) == 3.0
