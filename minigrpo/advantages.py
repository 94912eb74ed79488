"""Advantage estimators: what multiplies ∇log π in every policy-gradient method of the course.

- ``reward_to_go``: discounted return from each step of one episode (REINFORCE, lesson 01).
- ``batch_reward_to_go``: the same over several episodes laid end to end, reset at each boundary.
- ``gae``: generalized advantage estimation (actor-critic, TRPO, PPO: lessons 02–04).
- ``group_advantages``: GRPO's critic-free advantage, a reward relative to its group (lessons 05–09).
"""

from __future__ import annotations

from typing import Any

import torch

from minigrpo.infra.checks import as_float_tensor, check_finite, check_gamma, check_same_shape


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


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    Time-major inputs, all of shape ``[T]`` or ``[T, N]`` (N parallel environments):

    - ``values[t]`` = V(s_t); ``next_values[t]`` = V of the observation **after** step t. For a
      truncated step that is V of the final observation (not of the reset observation that a vector
      env hands back); for a terminated step its value is ignored.
    - ``terminated[t]``: step t ended the episode in a terminal state: nothing is bootstrapped.
    - ``truncated[t]``: step t was cut by a time limit: bootstrap from ``next_values[t]``, but the
      recursion does not cross into the next episode.

    ``δ_t = r_t + γ·(1 − terminated_t)·next_values_t − values_t`` and
    ``A_t = δ_t + γλ·(1 − terminated_t)·(1 − truncated_t)·A_{t+1}``, with ``A_{T-1} = δ_{T-1}``
    (the rollout's last step bootstraps through ``next_values`` only).

    λ = 0 gives the TD residual δ_t (low variance, biased by V); λ = 1 gives the discounted return
    (bootstrapped at the end) minus V (unbiased, high variance). Returns the advantages; the value
    targets are ``advantages + values``.
    """
    names = ["rewards", "values", "next_values", "terminated", "truncated"]
    tensors = [torch.as_tensor(x) for x in (rewards, values, next_values, terminated, truncated)]
    r = as_float_tensor(tensors[0], "rewards")
    if r.ndim not in (1, 2) or r.shape[0] == 0:
        raise ValueError(f"gae expects time-major rewards of shape [T] or [T, N] with T >= 1; got shape {tuple(r.shape)}")
    for name, t in zip(names[1:], tensors[1:]):
        check_same_shape(r, t, "rewards", name)
    v = tensors[1].to(r.dtype)
    nv = tensors[2].to(r.dtype)
    term = tensors[3].to(torch.bool)
    trunc = tensors[4].to(torch.bool)
    for name, t in (("rewards", r), ("values", v)):
        check_finite(t, name)
    check_finite(torch.where(term, torch.zeros_like(nv), nv), "next_values (at non-terminated steps)")
    gamma, lam = check_gamma(gamma), check_gamma(lam, "lam")

    not_term = (~term).to(r.dtype)
    not_done = (~(term | trunc)).to(r.dtype)
    nv = torch.where(term, torch.zeros_like(nv), nv)  # a NaN placeholder at a terminal step must not leak
    deltas = r + gamma * not_term * nv - v
    adv = torch.zeros_like(r)
    running = torch.zeros_like(r[0])
    for t in range(r.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * lam * not_done[t] * running
        adv[t] = running
    return adv


SCALES = ("group", "batch", "none")


def group_advantages(rewards: Any, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    ``rewards`` holds one scalar per completion, ``[num_prompts * group_size]``, the completions of
    each prompt contiguous (prompt 0's G completions, then prompt 1's, ...). Each reward becomes
    ``(r − mean of its group) / (std + eps)``, with the std chosen by ``scale``:

    - ``"group"``: the std of its own group (DeepSeekMath's GRPO; TRL ``scale_rewards="group"``);
    - ``"batch"``: the std of all rewards in the batch (TRL ``scale_rewards="batch"``);
    - ``"none"``: no division, mean-centring only (Dr. GRPO, arXiv:2503.20783: dividing by the group
      std up-weights prompts that are nearly always or nearly never solved).

    Std convention: the *sample* standard deviation (Bessel's correction, divide by n − 1), as
    ``torch.std`` and TRL compute it, plus ``eps`` in the denominator, so a group whose rewards are
    all equal gets advantage exactly 0 (not NaN).
    """
    r = as_float_tensor(rewards, "rewards")
    if r.ndim != 1:
        raise ValueError(f"group_advantages expects a flat tensor of rewards [num_prompts * group_size]; "
                         f"got shape {tuple(r.shape)}")
    if not isinstance(group_size, (int,)) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2 (a group needs a mean and a spread); got {group_size!r}")
    if r.numel() == 0 or r.numel() % group_size:
        raise ValueError(f"the number of rewards ({r.numel()}) must be a positive multiple of group_size "
                         f"({group_size}): each prompt needs exactly group_size completions")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    check_finite(r, "rewards")
    groups = r.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale == "group":
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (r.std() + eps)
    # An all-equal group carries no signal: make it exactly 0 (in float32 the mean of eight 0.1s
    # is not exactly 0.1, and the rounding error divided by eps would become a tiny advantage).
    all_equal = (groups == groups[:, :1]).all(dim=1, keepdim=True)
    return torch.where(all_equal, torch.zeros_like(centred), centred).reshape(-1)
