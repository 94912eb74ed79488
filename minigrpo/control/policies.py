"""Small MLP policies and value functions for vector observations."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributions import Categorical


def mlp(sizes: Sequence[int], activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """Linear layers of the given sizes with ``activation`` between them (none after the last)."""
    if len(sizes) < 2:
        raise ValueError(f"mlp needs at least an input and an output size, got {list(sizes)}")
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class CategoricalMLPPolicy(nn.Module):
    """π(a|s) = softmax(MLP(s)) over ``n_actions`` discrete actions."""

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int] = (64, 64)):
        super().__init__()
        self.obs_dim, self.n_actions = obs_dim, n_actions
        self.logits_net = mlp([obs_dim, *hidden_sizes, n_actions])
        # A small last layer starts the policy close to uniform (as in CleanRL / SB3).
        last = self.logits_net[-1]
        nn.init.normal_(last.weight, std=0.01)
        nn.init.zeros_(last.bias)

    def _check_obs(self, obs: torch.Tensor) -> None:
        if obs.shape[-1] != self.obs_dim:
            raise ValueError(f"expected observations with last dimension {self.obs_dim}, got shape {tuple(obs.shape)}")

    def forward(self, obs: torch.Tensor) -> Categorical:
        """The action distribution for a batch of observations ``[..., obs_dim]``."""
        self._check_obs(obs)
        return Categorical(logits=self.logits_net(obs))

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log π(a|s) for each (observation, action) pair: shape ``[...]``."""
        return self(obs).log_prob(actions)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Sample an action (or take the most likely one when ``deterministic``)."""
        dist = self(obs)
        return dist.probs.argmax(-1) if deterministic else dist.sample()


class MLPValue(nn.Module):
    """V(s) as an MLP with a scalar output: ``[..., obs_dim] -> [...]``."""

    def __init__(self, obs_dim: int, hidden_sizes: Sequence[int] = (64, 64)):
        super().__init__()
        self.obs_dim = obs_dim
        self.net = mlp([obs_dim, *hidden_sizes, 1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.shape[-1] != self.obs_dim:
            raise ValueError(f"expected observations with last dimension {self.obs_dim}, got shape {tuple(obs.shape)}")
        return self.net(obs).squeeze(-1)
