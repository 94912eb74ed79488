import numpy as np
import pytest
import torch

from minigrpo.control import (
    CategoricalMLPPolicy,
    MLPValue,
    ReinforceConfig,
    collect_episodes,
    evaluate,
    make_envs,
    train_reinforce,
)
from minigrpo.control.reinforce import episode_weights, per_episode_gradients


@pytest.fixture
def policy():
    torch.manual_seed(0)
    return CategoricalMLPPolicy(4, 2, (16,))


def test_log_prob_is_log_softmax_of_the_logits(policy):
    obs, actions = torch.randn(7, 4), torch.randint(0, 2, (7,))
    expected = torch.log_softmax(policy.logits_net(obs), -1)[torch.arange(7), actions]
    torch.testing.assert_close(policy.log_prob(obs, actions), expected)
    assert policy.act(obs, deterministic=True).tolist() == policy.logits_net(obs).argmax(-1).tolist()


def test_score_function_has_zero_mean(policy):
    """E_{a~π}[∇ log π(a|s)] = Σ_a π(a|s) ∇ log π(a|s) = ∇ Σ_a π(a|s) = 0, exactly, by enumeration."""
    obs = torch.randn(4)
    probs = policy(obs).probs.detach()
    total = [torch.zeros_like(p) for p in policy.parameters()]
    for a in range(2):
        grads = torch.autograd.grad(policy.log_prob(obs, torch.tensor(a)), list(policy.parameters()))
        total = [t + probs[a] * g for t, g in zip(total, grads)]
    assert max(t.abs().max().item() for t in total) < 1e-6


def test_wrong_observation_size_is_an_error(policy):
    with pytest.raises(ValueError, match="last dimension 4"):
        policy(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="last dimension 4"):
        MLPValue(4)(torch.zeros(2))


def test_collect_episodes_runs_every_episode_to_its_end(policy):
    envs = make_envs("CartPole-v1", 3, seed=0)
    eps = collect_episodes(envs, policy, n_episodes=6)
    assert len(eps) == 6
    for e in eps:
        assert e.terminated != e.truncated  # a random CartPole policy falls: terminated, never both
        assert e.obs.shape == (len(e), 4) and e.actions.shape == (len(e),) and e.rewards.shape == (len(e),)
        assert e.total_reward == len(e)  # CartPole pays 1 per step


def test_max_steps_marks_episodes_truncated(policy):
    eps = collect_episodes(make_envs("CartPole-v1", 2, seed=0), policy, n_episodes=2, max_steps=3)
    assert all(len(e) <= 3 for e in eps)
    assert all(e.truncated for e in eps if len(e) == 3 and not e.terminated)


def test_min_steps_and_argument_errors(policy):
    envs = make_envs("CartPole-v1", 2, seed=0)
    assert sum(len(e) for e in collect_episodes(envs, policy, min_steps=100)) >= 100
    with pytest.raises(ValueError, match="exactly one"):
        collect_episodes(envs, policy)


def test_collection_is_reproducible(policy):
    def run():
        torch.manual_seed(1)
        return [e.actions.tolist() for e in collect_episodes(make_envs("CartPole-v1", 2, seed=5), policy, n_episodes=4)]

    assert run() == run()


def test_per_episode_gradients_average_to_the_batch_gradient(policy):
    eps = collect_episodes(make_envs("CartPole-v1", 4, seed=0), policy, n_episodes=4)
    per_ep = per_episode_gradients(policy, eps, gamma=0.99)
    obs, actions = torch.cat([e.obs for e in eps]), torch.cat([e.actions for e in eps])
    w = episode_weights(eps, 0.99)
    grads = torch.autograd.grad((policy.log_prob(obs, actions) * w).sum() / len(eps), list(policy.parameters()))
    torch.testing.assert_close(per_ep.mean(0), torch.cat([g.reshape(-1) for g in grads]), rtol=1e-4, atol=1e-5)


def test_reward_to_go_and_a_baseline_reduce_gradient_variance():
    """The lesson's claim, on a fixed random policy: Var(whole return) > Var(reward-to-go) > Var(rtg − b).

    Measured by benchmarks/margins_control.py (seeds 0–4 × torch threads 1, 2, here seed 0):
    Var(episode)/Var(rtg) 3.93–5.28 (excess over 1: min 2.93), Var(rtg)/Var(rtg − b) 1.51–2.14
    (min excess 0.51). Asserted: ratios ≥ 2.4 and ≥ 1.25 (excesses 1.4 and 0.25, under half the minima).
    """
    torch.manual_seed(0)
    policy = CategoricalMLPPolicy(4, 2, (32, 32))
    envs = make_envs("CartPole-v1", 16, seed=0)
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
    assert v_ep / v_rtg >= 2.4, (v_ep, v_rtg)
    assert v_rtg / v_base >= 1.25, (v_rtg, v_base)


def test_evaluate_returns_one_value_per_episode(policy):
    returns = evaluate(policy, "CartPole-v1", n_episodes=3, seed=0)
    assert returns.shape == (3,) and np.all(returns >= 1)


def test_config_validation():
    with pytest.raises(ValueError, match="baseline"):
        ReinforceConfig(baseline="critic")
    with pytest.raises(ValueError, match="returns"):
        ReinforceConfig(returns="gae")


def test_training_is_reproducible():
    cfg = ReinforceConfig(seed=3, iterations=3, eval_every=0)
    a = train_reinforce(cfg, progress=False).history
    b = train_reinforce(cfg, progress=False).history
    assert a["train_return"] == b["train_return"] and a["policy_loss"] == b["policy_loss"]


def test_reinforce_solves_cartpole():
    """The default config solves CartPole: greedy evaluation (10 episodes) reaches a mean return >= 475.

    Measured (benchmarks/margins_control.py, seeds 0–4 × torch threads 1, 2): solved at the
    evaluation after iteration 20 (seeds 0–3) or 30 (seed 4), 29k–96k env steps, of a 150-iteration
    budget: at least 5x room. The trainer runs in ``torch_threads(1)``, so the outer thread count
    does not change its trajectory (identical histories).
    """
    result = train_reinforce(ReinforceConfig(seed=0), progress=False)
    assert result.solved_at_step is not None, f"evaluations: {result.history['eval_return']}"
    assert result.history["eval_return"][-1] >= 475


def test_reinforce_without_baseline_learns():
    """Mean training return of the last 5 of 30 iterations minus that of the first 5.

    Measured (benchmarks/margins_control.py, seeds 0–4 × torch threads 1, 2): gain 290–474
    (first 5: 23–28, last 5: 317–500). Asserted: gain >= 140 (under half the smallest gain).
    """
    result = train_reinforce(ReinforceConfig(seed=0, baseline="none", iterations=30, eval_every=0), progress=False)
    first, last = np.mean(result.history["train_return"][:5]), np.mean(result.history["train_return"][-5:])
    assert last - first >= 140, (first, last)
