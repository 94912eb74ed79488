"""Collecting whole episodes from gymnasium environments with a policy, and evaluating it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from minigrpo.utils import torch_threads


@dataclass
class Episode:
    """One finished episode. ``obs[t]`` is the observation at which ``actions[t]`` was taken."""

    obs: torch.Tensor  # [T, obs_dim] float32
    actions: torch.Tensor  # [T] (int64 for discrete actions)
    rewards: torch.Tensor  # [T] float32
    terminated: bool  # ended in a terminal state (nothing follows: V = 0)
    truncated: bool  # cut by a time limit (the last state still has value)

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def total_reward(self) -> float:
        return float(self.rewards.sum())


def to_env_action(space: gym.Space, action: torch.Tensor):
    """A policy's action as the env wants it: an int for Discrete, a clipped array for Box."""
    if isinstance(space, gym.spaces.Discrete):
        return int(action.item())
    return np.clip(action.cpu().numpy(), space.low, space.high)


def make_envs(env_id: str, n: int, seed: int | None = None, **kwargs) -> list[gym.Env]:
    """``n`` independent copies of ``env_id``; with a seed, env i is reset with ``seed + i``."""
    envs = [gym.make(env_id, **kwargs) for _ in range(n)]
    if seed is not None:
        for i, env in enumerate(envs):
            env.reset(seed=seed + i)
            env.action_space.seed(seed + i)
    return envs


def _run_round(envs: Sequence[gym.Env], policy, deterministic: bool, max_steps: int | None) -> list[Episode]:
    """Run one episode in every env, in lockstep, with one batched policy call per step."""
    n = len(envs)
    current = [env.reset()[0] for env in envs]
    bufs: list[dict[str, list]] = [{"obs": [], "act": [], "rew": []} for _ in range(n)]
    done_flags: list[tuple[bool, bool] | None] = [None] * n
    steps = 0
    while any(flag is None for flag in done_flags):
        live = [i for i in range(n) if done_flags[i] is None]
        obs = torch.as_tensor(np.stack([current[i] for i in live]), dtype=torch.float32)
        actions = policy.act(obs, deterministic=deterministic)
        for j, i in enumerate(live):
            a = actions[j]
            next_obs, r, term, trunc, _ = envs[i].step(to_env_action(envs[i].action_space, a))
            bufs[i]["obs"].append(current[i])
            bufs[i]["act"].append(a)
            bufs[i]["rew"].append(float(r))
            current[i] = next_obs
            steps += 1
            if max_steps is not None and len(bufs[i]["rew"]) >= max_steps and not (term or trunc):
                trunc = True
            if term or trunc:
                done_flags[i] = (bool(term), bool(trunc))
    episodes = []
    for i in range(n):
        term, trunc = done_flags[i]
        episodes.append(
            Episode(
                obs=torch.as_tensor(np.stack(bufs[i]["obs"]), dtype=torch.float32),
                actions=torch.stack(bufs[i]["act"]),
                rewards=torch.tensor(bufs[i]["rew"], dtype=torch.float32),
                terminated=term,
                truncated=trunc,
            )
        )
    return episodes


def collect_episodes(
    envs: Sequence[gym.Env],
    policy,
    n_episodes: int | None = None,
    min_steps: int | None = None,
    deterministic: bool = False,
    max_steps: int | None = None,
) -> list[Episode]:
    """Collect whole episodes, ``len(envs)`` at a time, each run to its end.

    Starting a fixed set of episodes and running every one to completion avoids a subtle bias:
    "keep the first N episodes to finish" over-represents short episodes.

    Args:
        envs: environments to run in parallel (see ``make_envs``).
        policy: anything with ``act(obs_batch, deterministic) -> actions``.
        n_episodes: stop after at least this many episodes (a multiple of ``len(envs)``).
        min_steps: or stop once at least this many steps were collected in total.
        deterministic: take the policy's most likely action instead of sampling.
        max_steps: optional cap on an episode's length (the episode is then marked truncated).
    """
    if (n_episodes is None) == (min_steps is None):
        raise ValueError("pass exactly one of n_episodes or min_steps")
    if len(envs) == 0:
        raise ValueError("collect_episodes needs at least one environment")
    episodes: list[Episode] = []
    with torch_threads(1):
        while True:
            episodes += _run_round(envs, policy, deterministic, max_steps)
            if n_episodes is not None and len(episodes) >= n_episodes:
                return episodes
            if min_steps is not None and sum(len(e) for e in episodes) >= min_steps:
                return episodes


def evaluate(policy, env_id: str, n_episodes: int = 10, seed: int = 10_000, deterministic: bool = True) -> np.ndarray:
    """Undiscounted return of ``n_episodes`` fresh episodes (seeded envs, greedy actions by default)."""
    envs = make_envs(env_id, n_episodes, seed=seed)
    try:
        episodes = collect_episodes(envs, policy, n_episodes=n_episodes, deterministic=deterministic)
    finally:
        for env in envs:
            env.close()
    return np.array([e.total_reward for e in episodes])
