"""What the LLM and the diffusion GRPO trainers share, apart from the objective (``losses.grpo_loss``).

- :func:`frozen_reference`: the frozen reference policy of the KL term (none when β = 0).
- :func:`reward_metrics`: the reward statistics of a batch of groups, with TRL's names.
- :func:`mean_of`: per-minibatch statistics averaged into one value per logged step.
"""

from __future__ import annotations

import copy

import numpy as np
import torch


def frozen_reference(model: torch.nn.Module, beta: float, ref_model: torch.nn.Module | None = None):
    """The reference π_ref of the KL penalty: ``ref_model`` (default: a copy of ``model`` taken now), in eval mode
    and without gradients; ``None`` when ``beta`` is 0 (no KL term, so no second model in memory)."""
    if not beta > 0:
        return None
    ref = ref_model if ref_model is not None else copy.deepcopy(model)
    return ref.eval().requires_grad_(False)


def reward_metrics(rewards: torch.Tensor, group_size: int) -> tuple[dict[str, float], torch.Tensor]:
    """``(metrics, group_std)`` for rewards ``[num_groups × G]`` (each group contiguous).

    ``reward`` and ``reward_std`` are the batch's mean and std; ``frac_reward_zero_std`` is the share of groups
    whose G rewards are all equal (advantage 0: they teach nothing). ``group_std`` is ``[num_groups]``."""
    group_std = rewards.view(-1, group_size).std(1)
    metrics = {"reward": rewards.mean().item(), "reward_std": rewards.std().item(),
               "frac_reward_zero_std": (group_std == 0).float().mean().item()}
    return metrics, group_std


def mean_of(stats: list[dict[str, float]], keys) -> dict[str, float]:
    """The mean over ``stats`` of each of ``keys`` that the first entry has."""
    return {k: float(np.mean([s[k] for s in stats])) for k in keys if k in stats[0]}


__all__ = ["frozen_reference", "mean_of", "reward_metrics"]
