"""The networks of every control trainer: a policy π(a|s), a value function V(s), and the two side by side.

REINFORCE trains an :class:`ActorCritic`'s actor (and its critic as a baseline); A2C, TRPO and PPO train both.
Discrete actions → a categorical over logits; continuous actions → a diagonal Gaussian with a
state-independent, learned log standard deviation. Initialisation follows CleanRL's PPO (orthogonal
weights; a small last layer for the policy so it starts near uniform / near zero mean). The policy and
the value function share no trunk.
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


def mlp(n_in: int, hidden: Sequence[int], n_out: int, last_std: float) -> nn.Sequential:
    """Tanh MLP ``n_in → hidden… → n_out``, orthogonal weights (gain √2; ``last_std`` for the last layer)."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_layer(n_in, h, np.sqrt(2)), nn.Tanh()]
        n_in = h
    layers.append(_layer(n_in, n_out, last_std))
    return nn.Sequential(*layers)


def _obs_dim(observation_space: gym.Space | int, who: str) -> int:
    if isinstance(observation_space, int):
        return observation_space
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise ValueError(f"{who} needs a flat Box observation space, got {observation_space}")
    return int(observation_space.shape[0])


def _check_obs(obs: torch.Tensor, obs_dim: int) -> None:
    if obs.shape[-1] != obs_dim:
        raise ValueError(f"expected observations with last dimension {obs_dim}, got shape {tuple(obs.shape)}")


class MLPPolicy(nn.Module):
    """π(a|s) for a flat Box observation space and a Discrete or flat Box action space.

    An int stands for a space: ``MLPPolicy(4, 2)`` is a 4-dimensional observation and 2 discrete actions.
    ``forward`` gives the network's output (logits, or the Gaussian's mean); ``dist`` the distribution.
    """

    def __init__(self, observation_space: gym.Space | int, action_space: gym.Space | int,
                 hidden_sizes: Sequence[int] = (64, 64), log_std_init: float = 0.0):
        super().__init__()
        self.obs_dim = _obs_dim(observation_space, "MLPPolicy")
        if isinstance(action_space, int):
            action_space = gym.spaces.Discrete(action_space)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            self.act_dim = int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self.act_dim = int(action_space.shape[0])
            self.log_std = nn.Parameter(torch.full((self.act_dim,), float(log_std_init)))
        else:
            raise ValueError(f"MLPPolicy supports Discrete or flat Box action spaces, got {action_space}")
        self.net = mlp(self.obs_dim, hidden_sizes, self.act_dim, last_std=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits (discrete) or means (continuous): ``[..., obs_dim] → [..., act_dim]``."""
        _check_obs(obs, self.obs_dim)
        return self.net(obs)

    def dist(self, obs: torch.Tensor) -> Distribution:
        """π(·|s) for a batch ``[..., obs_dim]``; ``log_prob`` and ``entropy`` give shape ``[...]``."""
        out = self(obs)
        # validate_args=False: skip per-call constraint checks (inputs are ours; ~10% of a PPO step)
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        return Independent(Normal(out, self.log_std.exp().expand_as(out), validate_args=False), 1,
                           validate_args=False)

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log π(a|s) for each (observation, action) pair: shape ``[...]``."""
        return self.dist(obs).log_prob(actions)

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


class MLPValue(nn.Module):
    """V(s): ``[..., obs_dim] → [...]`` (an int ``observation_space`` is the observation's size)."""

    def __init__(self, observation_space: gym.Space | int, hidden_sizes: Sequence[int] = (64, 64)):
        super().__init__()
        self.obs_dim = _obs_dim(observation_space, "MLPValue")
        self.net = mlp(self.obs_dim, hidden_sizes, 1, last_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        _check_obs(obs, self.obs_dim)
        return self.net(obs).squeeze(-1)


class ActorCritic(nn.Module):
    """An :class:`MLPPolicy` (``actor``) and an :class:`MLPValue` (``critic``) for the same spaces."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 hidden_sizes: Sequence[int] = (64, 64), log_std_init: float = 0.0):
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
            raise ValueError(f"ActorCritic needs a flat Box observation space, got {observation_space}")
        self.actor = MLPPolicy(observation_space, action_space, hidden_sizes, log_std_init)
        self.critic = MLPValue(observation_space, hidden_sizes)
        self.obs_dim, self.act_dim, self.discrete = self.actor.obs_dim, self.actor.act_dim, self.actor.discrete

    @property
    def log_std(self) -> nn.Parameter:
        """The Gaussian policy's log standard deviation (continuous actions only)."""
        return self.actor.log_std

    def dist(self, obs: torch.Tensor) -> Distribution:
        """π(·|s) for a batch ``[..., obs_dim]``; ``log_prob`` and ``entropy`` give shape ``[...]``."""
        return self.actor.dist(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs)

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        """The policy's parameters (what TRPO's trust region constrains): the network's, then log σ."""
        yield from self.actor.net.parameters()
        if not self.discrete:
            yield self.actor.log_std

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """See :meth:`MLPPolicy.act`."""
        return self.actor.act(obs, deterministic)
