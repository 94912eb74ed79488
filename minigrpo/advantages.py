"""Advantage estimators: what multiplies ∇log π in every policy-gradient method of the course.

- ``reward_to_go``: discounted return from each step of one episode (REINFORCE, lesson 01).
- ``batch_reward_to_go``: the same over several episodes laid end to end, reset at each boundary.
"""

from __future__ import annotations

from typing import Any

import torch

from minigrpo._checks import as_float_tensor, check_finite, check_gamma, check_same_shape


def _discounted_cumsum_reversed(values: list[float], gamma: float, resets: list[bool]) -> list[float]:
    """out[t] = values[t] + gamma * out[t + 1], except out[t] = values[t] where resets[t] is True."""
    out = [0.0] * len(values)
    running = 0.0
    for t in range(len(values) - 1, -1, -1):
        if resets[t]:
            running = 0.0
        running = values[t] + gamma * running
        out[t] = running
    return out


def reward_to_go(rewards: Any, gamma: float) -> torch.Tensor:
    """Discounted return from each step of **one** episode.

    ``out[t] = Σ_{k ≥ 0} γ^k · rewards[t + k]``, computed backwards as ``out[t] = r_t + γ·out[t+1]``.

    Args:
        rewards: shape ``[T]`` — the rewards of one episode, in time order (tensor, array or list).
        gamma: discount factor in [0, 1].

    Returns:
        A tensor of shape ``[T]`` (float64 in, float64 out; otherwise float32).

    Raises:
        ValueError: for anything but a non-empty 1-D sequence, NaN/inf rewards, or γ outside [0, 1].

    >>> reward_to_go([1.0, 1.0, 1.0], gamma=0.5)
    tensor([1.7500, 1.5000, 1.0000])
    """
    r = as_float_tensor(rewards, "rewards")
    if r.ndim != 1:
        raise ValueError(
            f"reward_to_go expects the rewards of one episode as a 1-D sequence of shape [T]; "
            f"got shape {tuple(r.shape)}. For several episodes call it once per episode "
            f"(or use batch_reward_to_go with episode-end flags)."
        )
    if r.numel() == 0:
        raise ValueError("reward_to_go expects at least one reward (shape [T] with T >= 1); got an empty episode")
    check_finite(r, "rewards")
    gamma = check_gamma(gamma)
    values = r.tolist()
    out = _discounted_cumsum_reversed(values, gamma, [False] * len(values))
    return torch.tensor(out, dtype=r.dtype, device=r.device)


def batch_reward_to_go(rewards: Any, dones: Any, gamma: float) -> torch.Tensor:
    """Reward-to-go for several episodes concatenated in time, never summing across a boundary.

    Args:
        rewards: shape ``[T]``, the rewards of consecutive episodes laid end to end.
        dones: shape ``[T]``, True on the **last** step of each episode. The final step of the
            batch is treated as an episode end whatever its flag says (nothing follows it).
        gamma: discount factor in [0, 1].

    Returns:
        Shape ``[T]``: ``out[t] = r_t + γ · out[t+1]`` unless step t ends an episode (then ``r_t``).
    """
    r = as_float_tensor(rewards, "rewards")
    d = torch.as_tensor(dones)
    if r.ndim != 1 or r.numel() == 0:
        raise ValueError(f"rewards must be a non-empty 1-D sequence of shape [T]; got shape {tuple(r.shape)}")
    check_same_shape(r, d, "rewards", "dones")
    check_finite(r, "rewards")
    gamma = check_gamma(gamma)
    ends = [bool(x) for x in d.tolist()]
    ends[-1] = True
    out = _discounted_cumsum_reversed(r.tolist(), gamma, ends)
    return torch.tensor(out, dtype=r.dtype, device=r.device)
