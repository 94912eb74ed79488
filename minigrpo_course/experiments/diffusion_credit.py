"""Lesson 09's credit-assignment experiments: why one reward per chain is a sparse signal, and what GRPO adds to
plain REINFORCE on the denoising chain.

- :func:`undecided_variance`: how much of the final reward is still open after each denoising step. From anchor
  chains, the rest of the chain is re-sampled many times from every intermediate ``x_t``; the spread of the final
  reward over those continuations is the variance not yet decided at that step (law of total variance:
  ``E[Var(r | x_t)]`` falls from ``Var(r | c)`` at the prompt to 0 at the image).
- :class:`DiffusionReinforceTrainer`: vanilla REINFORCE over the chain, ``−(r − b)·Σ log π`` with a running-mean
  baseline ``b``, one optimizer step per sampled batch, no ratio and no clip. It reuses the GRPO trainer's sampler,
  step selection and optimizer step (:class:`minigrpo.diffusion.grpo.DiffusionGRPOTrainer`), so that the two differ
  only in the advantage and in how often a batch is used.
- :func:`variance_split`: how much of a global-baseline advantage is only the prompt being easy or hard (noise
  that GRPO's group mean removes), and how much says which image of a prompt was better.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from minigrpo.diffusion.grpo import DiffusionGRPOConfig, DiffusionGRPOResult, DiffusionGRPOTrainer, check_rewards

@torch.no_grad()
def continue_chain(process, model, x: torch.Tensor, k: int, labels: torch.Tensor,
                   generator: torch.Generator) -> torch.Tensor:
    """The final images of chains restarted from ``x`` = the state before step ``k`` (``Chain.xs[k]``): steps
    ``k .. K−1`` of ``process`` with fresh noise from ``generator``, as ``ReverseProcess.sample`` takes them."""
    if not 0 <= k <= process.timesteps.numel():
        raise ValueError(f"k must be in [0, {process.timesteps.numel()}] (a state of the chain), got {k}")
    device = x.device
    for t in process.timesteps[k:]:
        mean, std, _ = process.predict(model, x, t.to(device), labels)
        x = mean + std * torch.randn(x.shape, generator=generator).to(device)
    return x


@torch.no_grad()
def undecided_variance(model, process, reward_fn, labels: torch.Tensor, branches: int = 16, seed: int = 0) -> dict:
    """How much reward variance is still undecided at each state of the chain.

    One anchor chain per entry of ``labels``; from each of its states ``x_{t_k}`` (k = 0 is the starting noise
    x_T, k = K the image) the rest of the chain is re-sampled ``branches`` times and the final rewards' sample
    variance taken; ``prompt`` does the same from the prompt alone (fresh x_T too). Returns ``{"prompt": [A],
    "states": [A, K + 1], "timesteps": [K], "stds": [K]}`` (A anchors) — per anchor, so that a spread can be
    shown. ``states[:, k].mean() / prompt.mean()`` is the share of the reward's variance left open after k steps.
    """
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.numel() == 0:
        raise ValueError(f"labels must be a non-empty 1-D tensor [A], got shape {tuple(labels.shape)}")
    if not isinstance(branches, int) or branches < 2:
        raise ValueError(f"branches must be an int >= 2 (a variance needs two samples), got {branches!r}")
    g = torch.Generator().manual_seed(seed)
    model.eval()
    device = next(model.parameters()).device
    labels = labels.to(device)
    A, rep = labels.numel(), labels.repeat_interleave(branches)
    anchor = process.sample(model, labels, generator=g)

    def spread(images):  # [A × branches] images → [A] variance of the reward over each anchor's branches
        r = check_rewards(reward_fn(images, rep), A * branches)
        return r.view(A, branches).double().var(dim=1)

    noise = torch.randn((A * branches, *anchor.xs.shape[2:]), generator=g).to(device)
    prompt = spread(continue_chain(process, model, noise, 0, rep, g))
    states = [spread(continue_chain(process, model, anchor.xs[k].repeat_interleave(branches, 0), k, rep, g))
              for k in range(anchor.num_steps + 1)]
    return {"prompt": prompt, "states": torch.stack(states, 1), "timesteps": anchor.timesteps, "stds": anchor.stds}


class DiffusionReinforceTrainer(DiffusionGRPOTrainer):
    """Vanilla REINFORCE on the denoising chain: the loss is ``−mean over (chain, step) of (r − b) · log π_θ``.

    ``b`` is a running mean of the batch rewards (an exponential moving average with ``baseline_decay``) taken
    *before* the current batch is seen, so it does not depend on the batch it centres (the first batch, with no
    past, is centred on its own mean). Compared with GRPO: one baseline for every prompt instead of one per group,
    no division by a std, no advantage clipping, no ratio, no clip and no KL, and each sampled chain is used for
    exactly one optimizer step (``num_iterations = 1``; by default one minibatch: one step per batch). Sampling, the
    steps trained on (``timestep_fraction``, ``min_step_std``), AdamW and the gradient-norm clip are the GRPO
    trainer's.
    """

    def __init__(self, model, scheduler, reward_fn, config: DiffusionGRPOConfig | None = None,
                 baseline_decay: float = 0.9, **kwargs):
        config = config or DiffusionGRPOConfig()
        if config.num_iterations != 1:
            raise ValueError("REINFORCE uses each sampled chain once (no ratio to correct a reuse): num_iterations "
                             f"must be 1, got {config.num_iterations} (use reinforce_config(cfg))")
        if config.beta != 0:
            raise ValueError(f"beta must be 0: the REINFORCE loss has no KL term, got beta={config.beta}")
        if not 0 <= baseline_decay < 1:
            raise ValueError(f"baseline_decay must be in [0, 1), got {baseline_decay!r}")
        super().__init__(model, scheduler, reward_fn, config, **kwargs)
        self.baseline_decay = baseline_decay
        self.baseline: float | None = None
        self.baselines: list[float] = []  #: the baseline each batch was centred on

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """``r − b`` with the running mean ``b`` of the past batches' rewards, then ``b`` moves towards this batch."""
        mean = rewards.mean().item()
        b = mean if self.baseline is None else self.baseline
        self.baselines.append(b)
        self.baseline = self.baseline_decay * b + (1 - self.baseline_decay) * mean
        return rewards - b

    def compute_loss(self, rollout, chains: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """``−mean((r − b) · log π_θ(x_{t−1} | x_t))`` over the minibatch's selected (chain, step) pairs."""
        steps = rollout.steps[chains]
        b, k = chains.repeat_interleave(steps.shape[1]), steps.reshape(-1)
        ch = rollout.chain
        logp = self.process.step_logprob(self.model, ch.xs[k, b], ch.xs[k + 1, b], ch.timesteps[k], ch.labels[b],
                                         self.cfg.logprob_reduction)
        return -(rollout.advantages[b] * logp).mean(), {}


def reinforce_config(config: DiffusionGRPOConfig, num_minibatches: int = 1) -> DiffusionGRPOConfig:
    """``config`` with each chain used once (μ = 1), ``num_minibatches`` optimizer steps per batch (default one) and
    no KL: what REINFORCE accepts."""
    return replace(config, num_iterations=1, num_minibatches=num_minibatches, beta=0.0)


def train_reinforce_seeds(base_model, scheduler, reward_fn, config: DiffusionGRPOConfig,
                          seeds: Sequence[int] = (0, 1, 2), baseline_decay: float = 0.9, num_minibatches: int = 1,
                          progress: bool = False) -> list[DiffusionGRPOResult]:
    """One REINFORCE run per seed, each from its own copy of ``base_model`` (as ``diffusion_eval.train_seeds``), with
    ``num_minibatches`` optimizer steps per sampled batch (1: plain REINFORCE)."""
    results = []
    for seed in seeds:
        model = copy.deepcopy(base_model).requires_grad_(True)
        cfg = replace(reinforce_config(config, num_minibatches), seed=seed)
        trainer = DiffusionReinforceTrainer(model, scheduler, reward_fn, cfg, baseline_decay=baseline_decay)
        results.append(trainer.train(progress=progress))
    return results


def variance_split(rewards: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Where the variance of a global-baseline advantage ``r − mean(r)`` comes from, for rewards of several prompts.

    ``total`` = ``between`` + ``within`` (population variances, so the split is exact): ``between`` is the variance
    of the prompts' mean rewards (weighted by their counts) — in REINFORCE's advantage it multiplies
    ``Σ ∇log π`` of a chain whose prompt merely is easy or hard, so it is noise, and GRPO's group mean removes
    it exactly; ``within`` is the variance inside each prompt, the part that says which images of a prompt were
    better. ``sd_min`` and ``sd_max``: the smallest and largest per-prompt standard deviation, the spread of the
    factors that GRPO's division by the group std multiplies each prompt's gradient by (1 / sd).
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    labels = torch.as_tensor(labels).flatten().cpu()
    if r.numel() != labels.numel() or r.numel() < 2:
        raise ValueError(f"rewards and labels must be two tensors [N] of the same length N >= 2, got "
                         f"{r.numel()} and {labels.numel()}")
    prompts = labels.unique()
    if any(int((labels == c).sum()) < 2 for c in prompts):
        raise ValueError("every prompt in labels needs at least 2 rewards (a within-prompt spread)")
    means = torch.stack([r[labels == c].mean() for c in prompts])
    share = torch.stack([(labels == c).double().mean() for c in prompts])
    sds = torch.stack([r[labels == c].std() for c in prompts])
    between = (share * (means - r.mean()) ** 2).sum().item()
    total = r.var(unbiased=False).item()
    return {"total": total, "between": between, "within": total - between, "sd_min": sds.min().item(),
            "sd_max": sds.max().item()}


def reward_bands(ax, runs: dict[str, list[DiffusionGRPOResult]], images_per_step: int, key: str = "reward",
                 smooth: int = 5) -> None:
    """Draw, per setting, the mean over seeds of ``history[key]`` (a ``smooth``-step moving average) against the
    number of images sampled so far, with a band from the lowest to the highest seed."""
    for name, results in runs.items():
        y = np.array([r.history[key] for r in results], dtype=float)  # [seeds, steps]
        w = min(smooth, y.shape[1])
        y = np.stack([np.convolve(row, np.ones(w) / w, mode="valid") for row in y])
        x = (np.arange(y.shape[1]) + (w + 1) / 2) * images_per_step
        line, = ax.plot(x, y.mean(0), lw=1.5, label=f"{name} ({len(results)} seeds)")
        ax.fill_between(x, y.min(0), y.max(0), color=line.get_color(), alpha=0.2)
    ax.set_xlabel("images sampled"); ax.set_ylabel(f"batch {key} ({smooth}-step mean)")


__all__ = ["DiffusionReinforceTrainer", "continue_chain", "reinforce_config", "reward_bands", "train_reinforce_seeds",
           "undecided_variance", "variance_split"]
