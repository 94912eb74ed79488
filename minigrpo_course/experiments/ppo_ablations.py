"""Lesson 04's measurements: which samples turn the clipped objective down, and PPO's knobs over seeds
(value clipping, ``target_kl`` early stopping, the entropy bonus, PPO-Penalty), summarised per setting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from minigrpo.control.onpolicy import TrainResult

#: The three groups of :func:`clip_sides`, in label order.
SIDES = ("moved the right way, inside the range", "moved the right way, clipped", "moved the wrong way")


def clip_sides(ratio: torch.Tensor, advantages: torch.Tensor, eps: float) -> torch.Tensor:
    """Label each sample of a clipped objective: 0 = moved in the direction its advantage asks for (or not
    at all) and still inside ``[1 − ε, 1 + ε]``; 1 = moved that way past the range (clipped, gradient 0);
    2 = moved the wrong way, ``(r − 1)·A < 0``, where the min keeps the full ``r·A`` whatever ``r`` is."""
    wrong = (ratio - 1) * advantages < 0
    clipped = ((advantages > 0) & (ratio > 1 + eps)) | ((advantages < 0) & (ratio < 1 - eps))
    return torch.where(wrong, 2, torch.where(clipped, 1, 0))


def surrogate_terms(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample ``min(r·A, clip(r)·A)`` (L^CLIP is their mean) and their :func:`clip_sides` labels."""
    ratio = torch.exp(logp - old_logp)
    terms = torch.min(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    return terms, clip_sides(ratio, advantages, eps)


def slopes_by_side(alphas: np.ndarray, terms: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """How much each group adds to dL^CLIP/dα between consecutive α of a line search.

    ``terms`` and ``labels`` are ``[len(alphas), N]`` (from :func:`surrogate_terms` at each α). Row ``j`` of
    the result is ``[Σ_{i in group g at α_j} (term_i(α_{j+1}) − term_i(α_j))] / (N · Δα)`` for g = 0, 1, 2:
    the three columns add up to the finite-difference slope of L^CLIP."""
    alphas, terms, labels = np.asarray(alphas), np.asarray(terms), np.asarray(labels)
    diff = (terms[1:] - terms[:-1]) / (terms.shape[1] * np.diff(alphas)[:, None])
    return np.stack([(diff * (labels[:-1] == g)).sum(1) for g in range(len(SIDES))], axis=1)


def run_seeds(train: Callable[..., TrainResult], configs: dict[str, Callable[[int], object]],
              seeds: Iterable[int], progress: bool = False) -> dict[str, list[TrainResult]]:
    """``{name: [train(configs[name](seed)) for seed in seeds]}``: one setting per name, the same seeds."""
    return {name: [train(make(seed), progress=progress) for seed in seeds] for name, make in configs.items()}


def seed_summary(results: list[TrainResult]) -> dict[str, float]:
    """Medians over seeds of what the lesson's tables report: env steps to solve (``nan`` if a seed did not),
    seeds solved, the last greedy evaluation, epochs run per iteration, approx KL, entropy at the end."""
    def med(key: str, reduce=np.mean) -> float:
        vals = [reduce(np.asarray(r.history[key], dtype=float)) for r in results if r.history.get(key)]
        return float(np.median(vals)) if vals else float("nan")

    solved = [r.solved_at_step for r in results if r.solved_at_step is not None]
    return {"seeds solved": len(solved), "steps to solve (median)": float(np.median(solved)) if solved else float("nan"),
            "last evaluation": med("eval_return", lambda h: h[-1]), "epochs per iteration": med("epochs_run"),
            "approx_kl (median)": med("approx_kl", np.median), "final entropy": med("entropy", lambda h: h[-1])}


def print_summary(runs: dict[str, list[TrainResult]], columns: Iterable[str] | None = None) -> None:
    """One row per setting of :func:`seed_summary`'s figures (medians over the seeds)."""
    rows = {name: seed_summary(rs) for name, rs in runs.items()}
    columns = list(columns or next(iter(rows.values())))
    width = max(len(n) for n in rows) + 2
    print(f"{'setting':{width}}" + "".join(f"{c:>{max(12, len(c) + 2)}}" for c in columns))
    for name, row in rows.items():
        print(f"{name:{width}}" + "".join(f"{row[c]:>{max(12, len(c) + 2)}.4g}" for c in columns))


def band(results: list[TrainResult], key: str = "eval_return", x: str = "eval_step"):
    """``(x, mean, min, max)`` of a history key over seeds, on the steps all seeds share (for a seed band)."""
    n = min(len(r.history[key]) for r in results)
    ys = np.array([r.history[key][:n] for r in results], dtype=float)
    return np.asarray(results[0].history[x][:n]), ys.mean(0), ys.min(0), ys.max(0)


#: The panels of lesson 04's dashboard: history key and axis label.
DASHBOARD = (("train_return", "return (last 20 episodes)"), ("approx_kl", "approx KL (k3), nats"),
             ("clip_frac", "clip fraction"), ("explained_variance", "explained variance"),
             ("entropy", "policy entropy, nats"), ("sps", "environment steps / second"))


def plot_dashboard(histories: dict[str, dict], title: str):
    """One row of the six dashboard panels for runs of one environment (one line per run); returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DASHBOARD), figsize=(20, 3.3))
    for ax, (key, label) in zip(axes, DASHBOARD):
        for name, h in histories.items():
            ax.plot(np.array(h["env_steps"]) / 1000, h[key], lw=1.2, label=name)
        ax.set(xlabel="env steps (thousands)", ylabel=label)
    axes[1].set_yscale("log")
    axes[3].set_ylim(-0.5, 1.05)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
