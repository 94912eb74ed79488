"""What the LLM and the diffusion GRPO trainers share, apart from the objective (``losses.grpo_loss``).

- :func:`frozen_reference`: the frozen reference policy of the KL term (none when β = 0, and no copy for a
  model with LoRA adapters); :func:`reference_policy`: the model that plays π_ref in a ``with`` block.
- :func:`reward_metrics`: the reward statistics of a batch of groups, with TRL's names.
- :func:`mean_of`: per-minibatch statistics averaged into one value per logged step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def frozen_reference(model: torch.nn.Module, beta: float, ref_model: torch.nn.Module | None = None,
                     dtype: torch.dtype | None = None):
    """The reference π_ref of the KL penalty: ``ref_model`` (default: a copy of ``model`` taken now, cast to
    ``dtype`` if given), in eval mode and without gradients; ``None`` when ``beta`` is 0 (no KL term, so no second
    model in memory) or when ``model`` has adapters (``disable_adapter``, a peft model) and no ``ref_model`` is
    given: its reference is itself with the adapters off (:func:`reference_policy`)."""
    if not beta > 0 or (ref_model is None and hasattr(model, "disable_adapter")):
        return None
    ref = ref_model if ref_model is not None else copy.deepcopy(model)
    if ref_model is None and dtype is not None:
        ref = ref.to(dtype)
    return ref.eval().requires_grad_(False)


@contextmanager
def reference_policy(model: torch.nn.Module, ref: torch.nn.Module | None) -> Iterator[torch.nn.Module]:
    """``with reference_policy(model, ref) as pi_ref:`` — the frozen copy ``ref``, or, when there is none,
    ``model`` with its LoRA adapters switched off for the block (peft's ``disable_adapter``, as TRL does)."""
    if ref is not None:
        yield ref
        return
    if not hasattr(model, "disable_adapter"):
        raise ValueError("no reference policy: give a ref_model (or beta > 0 to copy the model), or a peft model")
    with model.disable_adapter():
        yield model


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


__all__ = ["frozen_reference", "mean_of", "reference_policy", "reward_metrics"]
