"""Exercise 02's ablation: what treating a time limit as the end of the world does to an actor-critic.

A time limit (``truncated``) says "we stopped watching", not "nothing follows". A trainer that zeroes the
bootstrap there anyway (old gym's single ``done`` flag did) teaches its critic that every state is at most
``max_episode_steps`` from the end. When the observation has no clock, that belief is wrong everywhere.

:class:`CashOutEnv` makes the damage large and fast. Each step the agent either **works** (+1, the episode
goes on) or **cashes out** (+``bonus`` once, the episode terminates). The observation never changes, so the
agent cannot see the clock. With γ = 0.9 working forever is worth 1/(1 − γ) = 10 > bonus = 5, so a correct
learner works until the time limit cuts the episode; bootstrapping from the state after the cut is how it
learns that the job goes on. Treat that cut as termination and the critic values working at about
(1 − γ^k)/(1 − γ) averaged over the k ≤ 5 steps left (≈ 3.1 < 5): cashing out looks better, and the agent
learns to quit.

:func:`train_a2c_on_targets` trains the package's A2C with one-step (λ = 0) targets from any function
``targets_fn(rewards, next_values, terminated, truncated, gamma)`` (the exercise's ``td_targets``), so a
learner plants the bug in their own function and measures it with the real trainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from unittest import mock

import gymnasium as gym
import numpy as np
import torch

from minigrpo.control.a2c import A2CConfig, train_a2c
from minigrpo.control.onpolicy import TrainResult

#: the registered id: CashOutEnv with a 5-step time limit
CASH_OUT_ID = "minigrpo/CashOut-v0"
CASH_OUT_LIMIT = 5  #: max_episode_steps of CASH_OUT_ID
CASH_OUT_BONUS = 5.0  #: the one-off reward for cashing out


class CashOutEnv(gym.Env):
    """Work (action 0: reward +1, go on) or cash out (action 1: reward +``bonus``, terminated).

    The observation is always ``[1.0]``: no clock, no state, so everything the critic learns about "how much
    future is left" comes from its targets. Episodes end only by cashing out (or by a time limit around it)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, bonus: float = CASH_OUT_BONUS):
        if not (isinstance(bonus, (int, float)) and math.isfinite(bonus)):
            raise ValueError(f"CashOutEnv: bonus must be a finite number, got {bonus!r}")
        self.bonus = float(bonus)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.ones(1, np.float32), {}

    def step(self, action):
        if int(action) == 1:
            return np.ones(1, np.float32), self.bonus, True, False, {}
        return np.ones(1, np.float32), 1.0, False, False, {}


if CASH_OUT_ID not in gym.registry:
    gym.register(id=CASH_OUT_ID, entry_point=CashOutEnv, max_episode_steps=CASH_OUT_LIMIT)


def cash_out_config(seed: int, total_timesteps: int = 8_000) -> A2CConfig:
    """A2C on CashOut: γ = 0.9 (working forever is worth 10), one-step targets (λ = 0), a learning rate high
    enough for the critic to reach those values within a few thousand steps (1e-2), no evaluation."""
    return A2CConfig(env_id=CASH_OUT_ID, seed=seed, total_timesteps=total_timesteps, gamma=0.9, gae_lambda=0.0,
                     learning_rate=1e-2, eval_every_steps=0)


TargetsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def train_a2c_on_targets(targets_fn: TargetsFn, cfg: A2CConfig) -> TrainResult:
    """Train the package's A2C with advantages ``targets − values`` and critic targets ``targets``, where
    ``targets = targets_fn(rewards, next_values, terminated, truncated, gamma)`` (one-step TD, i.e. GAE with
    λ = 0: ``cfg.gae_lambda`` must be 0). The trainer's own ``gae`` is swapped out for the run only."""
    if cfg.gae_lambda != 0.0:
        raise ValueError(f"train_a2c_on_targets: one-step targets are GAE with λ = 0; cfg.gae_lambda is {cfg.gae_lambda}")

    def advantages(rewards, values, next_values, terminated, truncated, gamma, lam):
        return torch.as_tensor(targets_fn(rewards, next_values, terminated, truncated, gamma)) - values

    with mock.patch("minigrpo.control.onpolicy.gae", advantages):
        return train_a2c(cfg, progress=False)


def late_episode_length(result: TrainResult, share: float = 0.5) -> float:
    """Mean episode length over the last ``share`` of the iterations: on CashOut, how many steps the agent
    works before it cashes out (at most the time limit, 5). Averaging over iterations smooths the
    back-and-forth of a learner that sits between working and quitting."""
    lengths = np.asarray(result.history["episode_length"], dtype=float)
    late = lengths[int(len(lengths) * (1 - share)):]
    return float(np.nanmean(late)) if np.isfinite(late).any() else math.nan


def cash_out_probability(agent) -> float:
    """π(cash out), the same in every state (the observation never changes)."""
    with torch.no_grad():
        return float(agent.dist(torch.ones(1, 1)).probs[0, 1])


def value_of_working(agent) -> float:
    """The critic's V(s): what the agent believes its job is worth (truth for an agent that never quits: 10)."""
    with torch.no_grad():
        return float(agent.value(torch.ones(1, 1)).reshape(()))
