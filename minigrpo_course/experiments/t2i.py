"""Lesson 13's plumbing: quiet library logging, an image grid, and the fixed-noise evaluation of a
text-to-image GRPO run.

The lesson keeps the ideas in its cells (the trainer, the LoRA targets, the seeds); these helpers only
draw and measure. ``evaluate`` is the before/after number of section 9: the mean reward of fresh images of
every prompt, sampled with a fixed noise seed so that "before" and "after" see the same noise and differ
only by the adapters.

    from minigrpo_course.experiments.t2i import evaluate, run_summary, show_images
    before = evaluate(trainer)            # the base policy (LoRA B = 0)
    trainer.train()
    after = evaluate(trainer)             # same prompts, same noise
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


def quiet_hub_logging() -> None:
    """Silence diffusers' and transformers' info messages and progress bars (the tiny models are built
    from configs, and their loading chatter would bury the lesson's outputs)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


def show_images(images: torch.Tensor, titles: Sequence[str] | None = None, rows: int = 1, size: float = 1.1,
                suptitle: str | None = None) -> None:
    """Plot ``images`` ``[N, 3, H, W]`` in [0, 1] as a grid of ``rows`` rows, one optional title each."""
    import matplotlib.pyplot as plt

    if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be a tensor [N, 3, H, W], got {getattr(images, 'shape', type(images))}")
    if titles is not None and len(titles) != len(images):
        raise ValueError(f"titles has {len(titles)} entries for {len(images)} images: give one per image")
    imgs = images.permute(0, 2, 3, 1).detach().cpu().numpy()
    cols = math.ceil(len(imgs) / rows)
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows + 0.3), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, img in enumerate(imgs):
        ax = axes.flat[i]
        ax.imshow(img, interpolation="nearest")
        if titles is not None:
            ax.set_title(titles[i], fontsize=7)
    if suptitle:
        fig.suptitle(suptitle, fontsize=9)
    plt.tight_layout()
    plt.show()


def evaluate(trainer, prompts: Sequence[str] | None = None, seed: int = 1234, per_prompt: int = 4,
             prompts_per_rollout: int = 4) -> float:
    """Mean reward of ``per_prompt`` fresh images for every prompt (default: the trainer's training prompts),
    sampled from noise seeded by ``seed``; the trainer's generator and group size are restored afterwards,
    so calling it does not change the training run that follows."""
    if per_prompt < 2:
        raise ValueError(f"per_prompt must be >= 2 (the rollout normalises rewards within each prompt's group), "
                         f"got {per_prompt}")
    if prompts_per_rollout < 1:
        raise ValueError(f"prompts_per_rollout must be >= 1, got {prompts_per_rollout}")
    prompts = list(trainer.train_prompts if prompts is None else prompts)
    saved, trainer.gen = trainer.gen, torch.Generator().manual_seed(seed)
    saved_g, trainer.cfg.num_generations = trainer.cfg.num_generations, per_prompt
    try:
        rewards = torch.cat([trainer.rollout(prompts[i:i + prompts_per_rollout]).rewards
                             for i in range(0, len(prompts), prompts_per_rollout)])
    finally:
        trainer.gen, trainer.cfg.num_generations = saved, saved_g
    return rewards.mean().item()


def run_summary(name: str, result: dict) -> str:
    """One line for a run of lesson 13's section 9: evaluation reward before -> after, the training reward of
    the first and last five steps, the mean clip fraction, the trainable LoRA weights and the time."""
    curve = result["curve"]
    return (f"{name}: eval reward {result['before']:+.4f} -> {result['after']:+.4f} "
            f"({result['after'] - result['before']:+.4f}); training reward first/last 5 steps "
            f"{np.mean(curve[:5]):+.4f} / {np.mean(curve[-5:]):+.4f}; clip fraction {result['clip']:.3f}; "
            f"{result['trainable']:,} LoRA weights; {result['seconds']:.0f} s")
