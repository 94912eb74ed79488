"""Lesson 09's measurements: what the optimised reward does not see.

A reward that goes up says only that its own judge is pleased. Lesson 09 reports three more things next to it,
each from fresh samples of the policy's own sampler:

- **an independent judge** (:func:`minigrpo.diffusion.rewards.digits_judge`: another architecture, trained on
  the other half of the training digits): the share of images it recognises as the prompt's digit
  (:func:`judge_accuracy`);
- **diversity per prompt** (:func:`per_prompt_diversity`): how different the images drawn for one prompt are
  from each other — it falls when the policy collapses onto one image per prompt;
- **spread over seeds** (:func:`train_seeds`, :func:`spread`): every figure from 3 GRPO runs, as mean ± sd and
  min–max, so that a difference between two settings can be told from the noise of one run.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from minigrpo.diffusion.grpo import DiffusionGRPOConfig, DiffusionGRPOTrainer, sample_rewards

METRICS = ("rms", "cosine")


def _check_images(images: torch.Tensor, labels: torch.Tensor | None = None) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError("images must be a tensor [N, C, H, W]")
    if labels is not None and (not isinstance(labels, torch.Tensor) or labels.shape != (images.shape[0],)):
        raise ValueError(f"labels must be a tensor [N] = [{images.shape[0]}], got "
                         f"{tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__}")


def mean_pairwise_distance(images: torch.Tensor, metric: str = "rms") -> float:
    """The mean over all pairs i < j of a distance between images ``[N, C, H, W]`` (N ≥ 2) in [-1, 1].

    ``"rms"``: ‖x_i − x_j‖ / √D, the root-mean-square pixel difference (0 for identical images, 2 for
    opposite ones). ``"cosine"``: 1 − cos(ink_i, ink_j) with ink = (x + 1) / 2, so that the blank background
    counts for nothing (0 for the same strokes, 1 for strokes that do not overlap).
    """
    _check_images(images)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    n = images.shape[0]
    if n < 2:
        raise ValueError(f"a pairwise distance needs at least 2 images, got {n}")
    x = images.detach().double().flatten(1).cpu()
    if metric == "rms":
        d = torch.cdist(x, x) / math.sqrt(x.shape[1])
    else:
        ink = (x.clamp(-1, 1) + 1) / 2
        unit = ink / ink.norm(dim=1, keepdim=True).clamp_min(1e-12)
        d = 1 - unit @ unit.T
    i, j = torch.triu_indices(n, n, offset=1)
    return d[i, j].mean().item()


def per_prompt_diversity(images: torch.Tensor, labels: torch.Tensor, metric: str = "rms") -> dict[int, float]:
    """``{prompt: mean pairwise distance of its images}`` for every prompt in ``labels`` (each needs ≥ 2 images)."""
    _check_images(images, labels)
    return {int(c): mean_pairwise_distance(images[labels == c], metric) for c in labels.unique().tolist()}


@torch.no_grad()
def judge_accuracy(judge: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[N]`` booleans: does ``judge`` (a classifier returning logits) pick the prompt's digit for each image."""
    _check_images(images, labels)
    dev = next(judge.parameters()).device
    return (judge(images.to(dev).clamp(-1, 1)).argmax(-1).cpu() == labels.cpu())


def evaluate(model, process, reward_fn, judge, labels: torch.Tensor, seed: int) -> dict:
    """Fresh samples of ``model`` for ``labels``: mean reward, the judge's accuracy, mean per-prompt diversity
    (rms), the same three per prompt (``per_prompt``: ``{prompt: (reward, judge, diversity)}``), and the images."""
    images, rewards = sample_rewards(model, process, reward_fn, labels, seed=seed)
    labels = torch.as_tensor(labels).cpu()
    ok = judge_accuracy(judge, images, labels).float()
    div = per_prompt_diversity(images, labels)
    per_prompt = {c: (rewards[labels == c].mean().item(), ok[labels == c].mean().item(), d) for c, d in div.items()}
    return {"reward": rewards.mean().item(), "judge": ok.mean().item(), "diversity": float(np.mean(list(div.values()))),
            "per_prompt": per_prompt, "images": images, "rewards": rewards}


def train_seeds(base_model, scheduler, reward_fn, config: DiffusionGRPOConfig, seeds: Sequence[int] = (0, 1, 2),
                progress: bool = False) -> list:
    """One GRPO run per seed, each from its own copy of ``base_model``: the list of ``DiffusionGRPOResult``."""
    results = []
    for seed in seeds:
        model = copy.deepcopy(base_model).requires_grad_(True)
        trainer = DiffusionGRPOTrainer(model, scheduler, reward_fn, replace(config, seed=seed))
        results.append(trainer.train(progress=progress))
    return results


def evaluate_seeds(models: Sequence, process, reward_fn, judge, labels: torch.Tensor, seed: int) -> dict[str, list]:
    """:func:`evaluate` for each model on the same prompts and noise: ``{"reward": [...], "judge": [...],
    "diversity": [...], "per_prompt": [...]}``, one entry per model."""
    runs = [evaluate(m, process, reward_fn, judge, labels, seed) for m in models]
    return {k: [r[k] for r in runs] for k in ("reward", "judge", "diversity", "per_prompt")}


def spread(values: Sequence[float], digits: int = 3) -> str:
    """``"mean ± sd (min–max)"`` of the values (sd with n − 1; one value: just the value)."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"values must be a non-empty list of numbers, got {values!r}")
    if v.size == 1:
        return f"{v[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f} ({v.min():.{digits}f}–{v.max():.{digits}f})"


def seed_table(rows: dict[str, dict[str, Sequence[float]]], keys: Sequence[str] = ("reward", "judge", "diversity"),
               width: int = 26) -> str:
    """A text table: one row per setting, one column per metric, each cell :func:`spread` over the seeds."""
    name_w = max(len(n) for n in rows)
    lines = [f"{'':{name_w}s}  " + "  ".join(f"{k:>{width}s}" for k in keys)]
    for name, row in rows.items():
        lines.append(f"{name:{name_w}s}  " + "  ".join(f"{spread(row[k]):>{width}s}" for k in keys))
    return "\n".join(lines)


def per_prompt_table(before: dict, after: Sequence[dict], prompts: Sequence[int] | None = None) -> str:
    """Reward, judge accuracy and diversity per prompt: ``before`` (one :func:`evaluate`'s ``per_prompt``) against
    ``after`` (one ``per_prompt`` per seed, averaged over the seeds)."""
    prompts = sorted(before) if prompts is None else prompts
    lines = [f"{'prompt':>6s}  {'reward':>13s}  {'judge':>13s}  {'diversity':>13s}   (base → after, mean of "
             f"{len(after)} seed{'s' if len(after) != 1 else ''})"]
    for c in prompts:
        b = before[c]
        a = np.mean([run[c] for run in after], axis=0)
        lines.append(f"{c:>6d}  " + "  ".join(f"{b[i]:.2f} → {a[i]:.2f}".rjust(13) for i in range(3)))
    return "\n".join(lines)


#: Ink is drawn black on white in lessons 08 and 09: pixels in [-1, 1] through matplotlib's reversed grey map.
INK_CMAP = "gray_r"


def show_grid(images: torch.Tensor, rows: int, title: str | None = None, row_labels: Sequence[str] | None = None,
              scores: Sequence[float] | None = None, size: float = 0.9) -> None:
    """Draw ``images`` ``[N, 1, H, W]`` in [-1, 1] (N = rows × cols, row by row), ink black on white as in lesson 08,
    with an optional score above each image and a label left of each row."""
    import matplotlib.pyplot as plt

    imgs = images.detach().clamp(-1, 1).cpu().numpy()[:, 0]
    cols = len(imgs) // rows
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size + (0.3 if title else 0)), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.imshow(imgs[i], cmap=INK_CMAP, vmin=-1, vmax=1)
        ax.set_xticks([]); ax.set_yticks([])
        if scores is not None:
            ax.set_title(f"{scores[i]:.2f}", fontsize=7, pad=1)
    for r, lab in enumerate(row_labels or []):
        axes[r, 0].set_ylabel(lab, rotation=0, ha="right", va="center", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    plt.tight_layout(); plt.show()
