"""Actor-critic agents, vector-env rollouts (terminated vs truncated, final observations), PPO, TRPO."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from minigrpo.control import ActorCritic, PPOConfig, TRPOConfig, make_vec_env, train_ppo, train_trpo
from minigrpo.control.onpolicy import RolloutCollector, explained_variance


def test_agent_distributions_for_discrete_and_continuous_actions():
    torch.manual_seed(0)
    disc = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), (8,))
    obs = torch.randn(5, 4)
    assert disc.dist(obs).log_prob(torch.zeros(5, dtype=torch.long)).shape == (5,)
    assert disc.value(obs).shape == (5,)
    cont = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,)), (8,))
    d = cont.dist(torch.randn(5, 3))
    a = d.sample()
    assert a.shape == (5, 2) and d.log_prob(a).shape == (5,) and d.entropy().shape == (5,)
    # a diagonal Gaussian's log-prob is the sum over action dimensions
    normal = torch.distributions.Normal(d.mean, cont.log_std.exp())
    torch.testing.assert_close(d.log_prob(a), normal.log_prob(a).sum(-1))
    assert set(map(id, cont.actor_parameters())) == set(map(id, [*cont.actor.parameters(), cont.log_std]))


def test_agent_rejects_wrong_shapes_and_spaces():
    agent = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="last dimension 4"):
        agent.dist(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="flat Box"):
        ActorCritic(gym.spaces.Discrete(3), gym.spaces.Discrete(2))


def test_rollout_keeps_terminated_truncated_and_final_observations_apart():
    """CartPole truncated at 20 steps: a balancing-ish random policy hits both kinds of ending."""
    torch.manual_seed(0)
    envs = make_vec_env("CartPole-v1", 4, max_episode_steps=20)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, (16,))
    ro = RolloutCollector(envs, seed=0).collect(agent, 60)
    assert ro.obs.shape == (60, 4, 4) and ro.rewards.shape == (60, 4)
    assert ro.truncated.any() and ro.terminated.any() and not (ro.truncated & ro.terminated).any()
    # the obs after a step that did not end the episode is the next stored obs
    cont = ~(ro.terminated | ro.truncated)[:-1]
    with torch.no_grad():
        torch.testing.assert_close(ro.next_values[:-1][cont], agent.value(ro.obs[1:][cont]))
    # after an ending step the next stored obs is a reset, not what next_values was computed from
    t, n = map(int, (ro.truncated[:-1]).nonzero()[0])
    assert not torch.allclose(ro.next_values[t, n], agent.value(ro.obs[t + 1, n]))
    # episode statistics: truncated episodes are 20 steps long
    assert max(ro.episode_lengths) == 20 and len(ro.episode_returns) == len(ro.episode_lengths)
    envs.close()


def test_explained_variance():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target) == 1.0
    assert explained_variance(torch.full((4,), 2.5), target) == pytest.approx(0.0)


def test_ppo_config_checks_minibatches():
    with pytest.raises(ValueError, match="must divide"):
        PPOConfig(num_envs=3, num_steps=10, num_minibatches=4)


def test_ppo_metrics_and_reproducibility():
    cfg = PPOConfig(total_timesteps=2048, num_envs=4, num_steps=128, eval_every_steps=0)
    a, b = train_ppo(cfg, progress=False), train_ppo(cfg, progress=False)
    assert a.history["policy_loss"] == b.history["policy_loss"]
    for key in ("approx_kl", "clip_frac", "explained_variance", "entropy", "sps", "value_loss", "learning_rate"):
        assert len(a.history[key]) == cfg.num_iterations and np.all(np.isfinite(a.history[key])), key
    assert a.history["learning_rate"][0] == cfg.learning_rate > a.history["learning_rate"][-1]


def test_ppo_target_kl_stops_epochs_early():
    cfg = PPOConfig(total_timesteps=1024, num_envs=4, num_steps=128, update_epochs=10, learning_rate=3e-3,
                    target_kl=1e-4, eval_every_steps=0)
    h = train_ppo(cfg, progress=False).history
    assert max(h["epochs_run"]) < 10 and max(h["stopped_early"]) == 1.0


def test_ppo_solves_cartpole():
    from minigrpo.control.ppo import PRESETS

    cfg = PPOConfig(**{**PRESETS["CartPole-v1"], "seed": 1, "total_timesteps": 60_000, "target_return": 475,
                       "eval_every_steps": 5_000})
    result = train_ppo(cfg, progress=False)
    assert result.solved_at_step is not None, result.history["eval_return"]


def test_trpo_respects_the_trust_region_and_solves_cartpole():
    cfg = TRPOConfig(seed=0, total_timesteps=100_000, target_return=475, eval_every_steps=10_000)
    result = train_trpo(cfg, progress=False)
    assert max(result.history["kl"]) <= cfg.max_kl
    assert result.solved_at_step is not None, result.history["eval_return"]


def test_a2c_learns_cartpole():
    from minigrpo.control import A2CConfig, train_a2c

    result = train_a2c(A2CConfig(seed=0, total_timesteps=60_000, target_return=475, eval_every_steps=10_000),
                       progress=False)
    assert result.solved_at_step is not None, result.history["eval_return"]


@pytest.mark.slow
def test_ppo_pendulum_preset_reaches_minus_250():
    """Continuous actions (diagonal Gaussian): the Pendulum preset's deterministic evaluation >= -250."""
    from minigrpo.control.ppo import PRESETS

    cfg = PPOConfig(**{**PRESETS["Pendulum-v1"], "seed": 0, "eval_every_steps": 20_000, "target_return": -250})
    result = train_ppo(cfg, progress=False)
    assert result.solved_at_step is not None, result.history["eval_return"]
