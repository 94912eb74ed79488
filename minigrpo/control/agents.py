"""Actor-critic agents: a policy network and a value network side by side (no shared trunk).

Discrete actions → a categorical over logits; continuous actions → a diagonal Gaussian with a
state-independent, learned log standard deviation. Initialisation follows CleanRL's PPO
(orthogonal weights; a small last layer for the policy so it starts near uniform / near zero mean).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal


def _layer(n_in: int, n_out: int, std: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(n_in: int, hidden: Sequence[int], n_out: int, last_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_layer(n_in, h, np.sqrt(2)), nn.Tanh()]
        n_in = h
    layers.append(_layer(n_in, n_out, last_std))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """π(a|s) and V(s) for a Box observation space and a Discrete or Box action space."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 hidden_sizes: Sequence[int] = (64, 64), log_std_init: float = 0.0):
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
            raise ValueError(f"ActorCritic needs a flat Box observation space, got {observation_space}")
        self.obs_dim = int(observation_space.shape[0])
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            self.act_dim = int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self.act_dim = int(action_space.shape[0])
            self.register_buffer("action_low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("action_high", torch.as_tensor(action_space.high, dtype=torch.float32))
            self.log_std = nn.Parameter(torch.full((self.act_dim,), float(log_std_init)))
        else:
            raise ValueError(f"ActorCritic supports Discrete or flat Box action spaces, got {action_space}")
        self.actor = _mlp(self.obs_dim, hidden_sizes, self.act_dim, last_std=0.01)
        self.critic = _mlp(self.obs_dim, hidden_sizes, 1, last_std=1.0)

    def _check(self, obs: torch.Tensor) -> None:
        if obs.shape[-1] != self.obs_dim:
            raise ValueError(f"expected observations with last dimension {self.obs_dim}, got shape {tuple(obs.shape)}")

    def dist(self, obs: torch.Tensor) -> Distribution:
        """π(·|s) for a batch ``[..., obs_dim]``; ``log_prob`` and ``entropy`` give shape ``[...]``."""
        self._check(obs)
        out = self.actor(obs)
        # validate_args=False: skip per-call constraint checks (inputs are ours; ~10% of a PPO step)
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        return Independent(Normal(out, self.log_std.exp().expand_as(out), validate_args=False), 1,
                           validate_args=False)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        self._check(obs)
        return self.critic(obs).squeeze(-1)

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        """The policy's parameters (what TRPO's trust region constrains)."""
        yield from self.actor.parameters()
        if not self.discrete:
            yield self.log_std

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """An action per observation: sampled, or the mode when ``deterministic``.

        Continuous actions are returned unclipped (their log-prob is what the policy produced);
        the environment loop clips them to the action bounds.
        """
        d = self.dist(obs)
        if deterministic:
            return d.probs.argmax(-1) if self.discrete else d.mean
        return d.sample()
