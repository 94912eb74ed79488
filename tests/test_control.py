"""The control stack's networks, whole-episode collection on a gymnasium vector env, and REINFORCE."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from minigrpo.control import (
    A2CConfig,
    MLPPolicy,
    MLPValue,
    PPOConfig,
    ReinforceConfig,
    collect_episodes,
    evaluate,
    make_vec_env,
    train_reinforce,
)
from minigrpo.control.reinforce import episode_weights, per_episode_gradients
from minigrpo.control.rollouts import run_episodes


@pytest.fixture
def policy():
    torch.manual_seed(0)
    return MLPPolicy(4, 2, (16,))


def test_log_prob_is_log_softmax_of_the_logits(policy):
    obs, actions = torch.randn(7, 4), torch.randint(0, 2, (7,))
    expected = torch.log_softmax(policy.net(obs), -1)[torch.arange(7), actions]
    torch.testing.assert_close(policy.log_prob(obs, actions), expected)
    assert policy.act(obs, deterministic=True).tolist() == policy(obs).argmax(-1).tolist()


def test_score_function_has_zero_mean(policy):
    """E_{a~π}[∇ log π(a|s)] = Σ_a π(a|s) ∇ log π(a|s) = ∇ Σ_a π(a|s) = 0, exactly, by enumeration."""
    obs = torch.randn(4)
    probs = policy.dist(obs).probs.detach()
    total = [torch.zeros_like(p) for p in policy.parameters()]
    for a in range(2):
        grads = torch.autograd.grad(policy.log_prob(obs, torch.tensor(a)), list(policy.parameters()))
        total = [t + probs[a] * g for t, g in zip(total, grads)]
    assert max(t.abs().max().item() for t in total) < 1e-6


def test_wrong_observation_size_is_an_error(policy):
    with pytest.raises(ValueError, match="last dimension 4"):
        policy.dist(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="last dimension 4"):
        MLPValue(4)(torch.zeros(2))
    with pytest.raises(ValueError, match="flat Box"):
        MLPPolicy(gym.spaces.Discrete(3), 2)


def test_collect_episodes_runs_every_episode_to_its_end(policy):
    envs = make_vec_env("CartPole-v1", 3, seed=0)
    eps = collect_episodes(envs, policy, n_episodes=6)
    assert len(eps) == 6
    for e in eps:
        assert e.terminated != e.truncated  # a random CartPole policy falls: terminated, never both
        assert e.obs.shape == (len(e), 4) and e.actions.shape == (len(e),) and e.rewards.shape == (len(e),)
        assert e.total_reward == len(e)  # CartPole pays 1 per step


def single_env_episode(policy, seed: int, resets: int) -> list[float]:
    """Reference without a vector env: the ``resets``-th episode of one CartPole env seeded with ``seed``."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    for _ in range(resets - 1):
        obs, _ = env.reset()
    rows = []
    while True:
        action = int(policy.act(torch.as_tensor(obs)[None], deterministic=True))
        rows.append([*obs.tolist(), action])
        obs, _, term, trunc, _ = env.step(action)
        if term or trunc:
            return rows


def test_episodes_are_each_sub_envs_first_episode_with_the_wrapper_statistics():
    """SAME_STEP autoreset handled right: after ``make_vec_env(seed=s)`` and a round's reset, sub-env i's
    episode is exactly single-env ``reset(seed=s + i)`` then ``reset()`` under the same greedy policy (the
    sub-envs that end early keep stepping, and their next episodes are dropped). Returns come from
    RecordEpisodeStatistics and agree with the rewards."""
    torch.manual_seed(3)
    policy = MLPPolicy(4, 2, (8,))
    with torch.no_grad():
        policy.net[-1].weight.mul_(300)  # a confident policy: episodes of different lengths
    envs = make_vec_env("CartPole-v1", 4, seed=11)
    episodes, returns = run_episodes(envs, policy, deterministic=True)
    assert len({len(e) for e in episodes}) > 1
    for i, e in enumerate(episodes):
        mine = torch.cat([e.obs, e.actions[:, None].float()], 1)
        torch.testing.assert_close(mine, torch.tensor(single_env_episode(policy, 11 + i, resets=2)))
    np.testing.assert_array_equal(returns, [e.total_reward for e in episodes])
    evaluated = evaluate(policy, "CartPole-v1", n_episodes=4, seed=11)
    np.testing.assert_array_equal(evaluated, returns)  # evaluate: the same seeding and greedy play
    envs.close()


def test_time_limit_marks_episodes_truncated(policy):
    eps = collect_episodes(make_vec_env("CartPole-v1", 2, seed=0, max_episode_steps=3), policy, n_episodes=2)
    assert all(len(e) <= 3 for e in eps)
    assert all(e.truncated for e in eps if len(e) == 3 and not e.terminated)


def test_min_steps_and_argument_errors(policy):
    envs = make_vec_env("CartPole-v1", 2, seed=0)
    assert sum(len(e) for e in collect_episodes(envs, policy, min_steps=100)) >= 100
    with pytest.raises(ValueError, match="exactly one"):
        collect_episodes(envs, policy)
    with pytest.raises(TypeError, match="needs a vector env"):
        collect_episodes([gym.make("CartPole-v1")], policy, n_episodes=1)


def test_collection_is_reproducible(policy):
    def run():
        torch.manual_seed(1)
        return [e.actions.tolist() for e in collect_episodes(make_vec_env("CartPole-v1", 2, seed=5), policy,
                                                             n_episodes=4)]

    assert run() == run()


def test_per_episode_gradients_average_to_the_batch_gradient(policy):
    eps = collect_episodes(make_vec_env("CartPole-v1", 4, seed=0), policy, n_episodes=4)
    per_ep = per_episode_gradients(policy, eps, gamma=0.99)
    obs, actions = torch.cat([e.obs for e in eps]), torch.cat([e.actions for e in eps])
    w = episode_weights(eps, 0.99)
    grads = torch.autograd.grad((policy.log_prob(obs, actions) * w).sum() / len(eps), list(policy.parameters()))
    torch.testing.assert_close(per_ep.mean(0), torch.cat([g.reshape(-1) for g in grads]), rtol=1e-4, atol=1e-5)


def test_reward_to_go_and_a_baseline_reduce_gradient_variance():
    """The lesson's claim, on a fixed random policy: Var(whole return) > Var(reward-to-go) > Var(rtg − b).

    Measured by benchmarks/margins_control.py (seeds 0–4 × torch threads 1, 2, here seed 0; the policy
    starts near uniform, episodes of about 20 steps): Var(episode)/Var(rtg) 3.14–5.06 (excess over 1:
    min 2.14), Var(rtg)/Var(rtg − b) 1.13–2.42 (min excess 0.134, seed 1; seed 0: 1.60). Asserted:
    ratios ≥ 2.0 and ≥ 1.06 (excesses 1.0 and 0.06, under half the minima).
    """
    torch.manual_seed(0)
    policy = MLPPolicy(4, 2, (32, 32))
    envs = make_vec_env("CartPole-v1", 16, seed=0)
    fit = collect_episodes(envs, policy, n_episodes=64)
    test = collect_episodes(envs, policy, n_episodes=128)
    # time-indexed baseline fitted on separate episodes: b_t = mean reward-to-go at step t
    horizon = max(len(e) for e in fit + test)
    table = torch.zeros(horizon)
    count = torch.zeros(horizon)
    for e in fit:
        rtg = episode_weights([e], 0.99)
        table[: len(e)] += rtg
        count[: len(e)] += 1
    table = table / count.clamp(min=1)

    def variance(**kw):
        g = per_episode_gradients(policy, test, 0.99, **kw)
        return ((g - g.mean(0)) ** 2).sum(1).mean().item()

    v_ep = variance(returns="episode")
    v_rtg = variance(returns="reward_to_go")
    v_base = variance(returns="reward_to_go", baseline=lambda e: table[: len(e)])
    assert v_ep / v_rtg >= 2.0, (v_ep, v_rtg)
    assert v_rtg / v_base >= 1.06, (v_rtg, v_base)


def test_evaluate_returns_one_value_per_episode(policy):
    returns = evaluate(policy, "CartPole-v1", n_episodes=3, seed=0)
    assert returns.shape == (3,) and np.all(returns >= 1)


def test_config_validation():
    with pytest.raises(ValueError, match="baseline"):
        ReinforceConfig(baseline="critic")
    with pytest.raises(ValueError, match="returns"):
        ReinforceConfig(returns="gae")


@pytest.mark.parametrize("cls, old, new", [
    (ReinforceConfig, "lr", "learning_rate"), (ReinforceConfig, "value_lr", "vf_lr"),
    (ReinforceConfig, "value_iters", "vf_iters"), (ReinforceConfig, "iterations", "num_iterations"),
    (ReinforceConfig, "episodes_per_iter", "num_envs"), (ReinforceConfig, "normalize_advantages", "norm_adv"),
    (ReinforceConfig, "eval_every", "eval_every_steps"), (PPOConfig, "lr", "learning_rate"),
    (A2CConfig, "eval_every", "eval_every_steps")])
def test_an_old_field_name_is_refused_with_the_new_one(cls, old, new):
    message = f"{cls.__name__} has no field '{old}'; it is called '{new}'"
    with pytest.raises(TypeError, match=f"^{message}$"):
        cls(**{old: 1})
    with pytest.raises(AttributeError, match=f"^{message}$"):
        getattr(cls(), old)


def test_every_control_config_shares_the_base_fields():
    """One naming scheme: the shared settings are declared once, in ControlConfig."""
    from dataclasses import fields

    from minigrpo.control import ControlConfig, TRPOConfig

    base = [f.name for f in fields(ControlConfig)]
    for cls in (ReinforceConfig, A2CConfig, PPOConfig, TRPOConfig):
        assert issubclass(cls, ControlConfig) and [f.name for f in fields(cls)][:len(base)] == base
        assert cls().num_iterations >= 1


def test_training_is_reproducible():
    cfg = ReinforceConfig(seed=3, num_iterations=3, eval_every_steps=0)
    a = train_reinforce(cfg, progress=False).history
    b = train_reinforce(cfg, progress=False).history
    assert a["train_return"] == b["train_return"] and a["policy_loss"] == b["policy_loss"]


def test_reinforce_solves_cartpole():
    """The default config solves CartPole: greedy evaluation (10 episodes) reaches a mean return >= 475.

    Measured (benchmarks/margins_control.py, seeds 0–4 × torch threads 1, 2; evaluations every 5k env
    steps): solved at iteration 13–14 (seeds 0–3) or 17 (seed 4), 15.7k–23.8k env steps, of a
    150-iteration budget: 8.8x room. The trainer runs in ``torch_threads(1)``, so the outer thread
    count does not change its trajectory (identical histories).
    """
    result = train_reinforce(ReinforceConfig(seed=0), progress=False)
    assert result.solved_at_step is not None, f"evaluations: {result.history['eval_return']}"
    assert result.history["eval_return"][-1] >= 475


def test_reinforce_without_baseline_learns():
    """Mean training return of the last 5 of 20 iterations minus that of the first 5.

    Measured (benchmarks/margins_control.py, seeds 0–4 × torch threads 1, 2): gain 221–386
    (first 5: 27.5–31.5, last 5: 253–414). Asserted: gain >= 110 (under half the smallest gain).
    """
    cfg = ReinforceConfig(seed=0, baseline="none", num_iterations=20, eval_every_steps=0)
    result = train_reinforce(cfg, progress=False)
    first, last = np.mean(result.history["train_return"][:5]), np.mean(result.history["train_return"][-5:])
    assert last - first >= 110, (first, last)
