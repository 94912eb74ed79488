"""REINFORCE (vanilla policy gradient), with or without a learned value baseline.

One iteration: run a batch of whole episodes with the current policy, weight each step's
log π(a_t|s_t) by its reward-to-go (minus V(s_t) with a baseline), and take one gradient step on
``reinforce_loss``. With a baseline, V is then regressed on the reward-to-go of the same batch.
Reference: Williams (1992); the layout follows OpenAI Spinning Up's "simplest policy gradient".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo._checks import at_least, check_config_types, in_unit_interval, one_of, positive
from minigrpo.advantages import reward_to_go
from minigrpo.control.policies import CategoricalMLPPolicy, MLPValue
from minigrpo.control.rollouts import Episode, collect_episodes, evaluate, make_envs
from minigrpo.losses import reinforce_loss
from minigrpo.tracking import Tracker, check_report_to, should_log
from minigrpo.utils import seed_everything, torch_threads

RETURNS = ("reward_to_go", "episode")
BASELINES = ("none", "value")


@dataclass
class ReinforceConfig:
    """Every knob of the REINFORCE trainer (defaults solve CartPole-v1 on CPU in about a minute)."""

    env_id: str = "CartPole-v1"  #: a gymnasium id with a vector observation and discrete actions
    seed: int = 0  #: seeds python, numpy, torch and the envs
    iterations: int = 150  #: number of policy updates (each on a fresh batch)
    episodes_per_iter: int = 16  #: whole episodes per batch (also the number of parallel envs)
    gamma: float = 0.99  #: discount of the reward-to-go
    returns: str = "reward_to_go"  #: "reward_to_go" (from step t on) or "episode" (whole-episode return)
    baseline: str = "value"  #: "value" (learned V(s) subtracted) or "none"
    normalize_advantages: bool = True  #: standardise the weights over the batch (a common variance reduction)
    lr: float = 1e-2  #: Adam learning rate of the policy
    value_lr: float = 1e-2  #: Adam learning rate of the value network
    value_iters: int = 10  #: regression steps on V per iteration
    hidden_sizes: tuple[int, ...] = (32, 32)  #: hidden layer widths of the policy and value MLPs
    eval_every: int = 10  #: evaluate the greedy policy every this many iterations (0: never)
    eval_episodes: int = 10  #: episodes per evaluation
    target_return: float | None = 475.0  #: stop once the evaluation mean reaches this (None: never)
    #: trackers to log to: "none", "tensorboard", "trackio", "wandb", or a list of them (see minigrpo.tracking);
    #: the step axis is env_steps
    report_to: str | list[str] = "none"
    logging_dir: str | Path | None = None  #: where the trackers write (None: runs/reinforce-<env_id>-<timestamp>)
    logging_steps: int = 1  #: send the metrics to the trackers every this many iterations (and at the last)

    def __post_init__(self):
        check_config_types(self)
        one_of(self, "returns", RETURNS)
        one_of(self, "baseline", BASELINES)
        at_least(self, 0, "seed", "eval_every")  # gymnasium refuses negative seeds
        at_least(self, 1, "iterations", "episodes_per_iter", "value_iters", "eval_episodes", "hidden_sizes",
                 "logging_steps")
        check_report_to(self)
        in_unit_interval(self, "gamma")
        positive(self, "lr", "value_lr")


@dataclass
class ReinforceResult:
    policy: CategoricalMLPPolicy
    value: MLPValue | None
    history: dict[str, list] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    solved_at_step: int | None = None  #: env steps when the evaluation first reached target_return
    solved_at_seconds: float | None = None  #: wall-clock seconds at that moment


def episode_weights(
    episodes: list[Episode],
    gamma: float,
    returns: str = "reward_to_go",
    returns_fn: Callable = reward_to_go,
) -> torch.Tensor:
    """The per-step weights of a batch, concatenated: reward-to-go, or the episode's return."""
    parts = []
    for ep in episodes:
        if returns == "reward_to_go":
            parts.append(torch.as_tensor(returns_fn(ep.rewards, gamma), dtype=torch.float32))
        else:
            g0 = torch.as_tensor(returns_fn(ep.rewards, gamma), dtype=torch.float32)[0]
            parts.append(g0.expand(len(ep)).clone())
    return torch.cat(parts)


def per_episode_gradients(
    policy: CategoricalMLPPolicy,
    episodes: list[Episode],
    gamma: float,
    returns: str = "reward_to_go",
    baseline: Callable[[Episode], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One policy-gradient estimate per episode, ``Σ_t ∇log π(a_t|s_t) · w_t``: shape ``[N, n_params]``.

    Their spread measures the variance of the estimator on a fixed policy (lesson 01's experiment).
    ``baseline(episode)`` returns ``[T]`` values subtracted from the weights; it must not depend on
    the actions taken, or the estimator becomes biased.
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    grads = []
    with torch_threads(1):
        for ep in episodes:
            w = episode_weights([ep], gamma, returns)
            if baseline is not None:
                w = w - torch.as_tensor(baseline(ep), dtype=torch.float32)
            logp = policy.log_prob(ep.obs, ep.actions)
            g = torch.autograd.grad((logp * w).sum(), params)
            grads.append(torch.cat([x.reshape(-1) for x in g]))
    return torch.stack(grads)


def train_reinforce(
    config: ReinforceConfig | None = None,
    progress: bool = True,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = reinforce_loss,
    returns_fn: Callable = reward_to_go,
) -> ReinforceResult:
    """Train a categorical MLP policy with REINFORCE. ``loss_fn``/``returns_fn`` can be swapped
    for a learner's own implementations (the exercise does this).

    History keys: ``iteration, env_steps, seconds, train_return, episode_length, policy_loss,
    value_loss, entropy`` per iteration, and ``eval_step, eval_return`` per evaluation.
    """
    cfg = config or ReinforceConfig()
    with torch_threads(1), Tracker(cfg.report_to, cfg.logging_dir, f"reinforce-{cfg.env_id}", asdict(cfg)) as tracker:
        return _train_reinforce(cfg, progress, loss_fn, returns_fn, tracker)


def _train_reinforce(cfg: ReinforceConfig, progress: bool, loss_fn: Callable, returns_fn: Callable,
                     tracker: Tracker) -> ReinforceResult:
    seed_everything(cfg.seed)
    envs = make_envs(cfg.env_id, cfg.episodes_per_iter, seed=cfg.seed)
    obs_dim = envs[0].observation_space.shape[0]
    n_actions = int(envs[0].action_space.n)
    policy = CategoricalMLPPolicy(obs_dim, n_actions, cfg.hidden_sizes)
    value = MLPValue(obs_dim, cfg.hidden_sizes) if cfg.baseline == "value" else None
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    vopt = torch.optim.Adam(value.parameters(), lr=cfg.value_lr) if value is not None else None

    keys = ["iteration", "env_steps", "seconds", "train_return", "episode_length", "policy_loss",
            "value_loss", "entropy", "eval_step", "eval_return"]
    hist: dict[str, list] = {k: [] for k in keys}
    result = ReinforceResult(policy, value, hist, asdict(cfg))
    env_steps, start = 0, time.perf_counter()
    bar = tqdm(range(1, cfg.iterations + 1), desc=f"REINFORCE {cfg.env_id}", disable=not progress)
    for it in bar:
        episodes = collect_episodes(envs, policy, n_episodes=cfg.episodes_per_iter)
        env_steps += sum(len(e) for e in episodes)
        obs = torch.cat([e.obs for e in episodes])
        actions = torch.cat([e.actions for e in episodes])
        rtg = episode_weights(episodes, cfg.gamma, cfg.returns, returns_fn)
        weights = rtg
        if value is not None:
            with torch.no_grad():
                weights = rtg - value(obs)
        if cfg.normalize_advantages and weights.numel() > 1:
            weights = (weights - weights.mean()) / (weights.std() + 1e-8)

        dist = policy(obs)
        loss = loss_fn(dist.log_prob(actions), weights)
        opt.zero_grad()
        loss.backward()
        opt.step()

        value_loss = float("nan")
        if value is not None:
            targets = episode_weights(episodes, cfg.gamma, "reward_to_go")
            for _ in range(cfg.value_iters):
                vloss = ((value(obs) - targets) ** 2).mean()
                vopt.zero_grad()
                vloss.backward()
                vopt.step()
            value_loss = vloss.item()

        returns = [e.total_reward for e in episodes]
        hist["iteration"].append(it)
        hist["env_steps"].append(env_steps)
        hist["seconds"].append(time.perf_counter() - start)
        hist["train_return"].append(float(np.mean(returns)))
        hist["episode_length"].append(float(np.mean([len(e) for e in episodes])))
        hist["policy_loss"].append(loss.item())
        hist["value_loss"].append(value_loss)
        hist["entropy"].append(dist.entropy().mean().item())
        bar.set_postfix(ret=f"{hist['train_return'][-1]:.0f}")
        if should_log(it, cfg.logging_steps, cfg.iterations):
            tracker.log({k: hist[k][-1] for k in keys[2:8]}, env_steps, prefix="train/")

        if cfg.eval_every and (it % cfg.eval_every == 0 or it == cfg.iterations):
            ev = float(evaluate(policy, cfg.env_id, cfg.eval_episodes, seed=10_000 + cfg.seed).mean())
            hist["eval_step"].append(env_steps)
            hist["eval_return"].append(ev)
            tracker.log({"return": ev}, env_steps, prefix="eval/")
            bar.set_postfix(ret=f"{hist['train_return'][-1]:.0f}", eval=f"{ev:.0f}")
            if cfg.target_return is not None and ev >= cfg.target_return:
                result.solved_at_step = env_steps
                result.solved_at_seconds = time.perf_counter() - start
                break
    for env in envs:
        env.close()
    return result
