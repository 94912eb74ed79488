"""GRPO for a diffusion model: the denoising chain as a policy (DDPO, Black et al. 2023; Flow-GRPO and
DanceGRPO, 2025, use the same recipe with group-relative advantages).

The MDP: a state is ``(prompt c, timestep t, image x_t)``, an action is the next image ``x_{t−1}``,
the policy is the Gaussian reverse step ``N(μ_θ(x_t, t, c), σ_t²)`` (:mod:`minigrpo.diffusion.sampler`),
and the only reward arrives at the end, ``r(x_0, c)``. So every step of a chain gets the same
advantage: the one of its final image.

One step of :class:`DiffusionGRPOTrainer`:

1. draw ``prompts_per_step`` distinct prompts and sample ``num_generations`` (G) chains for each,
   recording every ``(x_t, x_{t−1}, t)`` and ``log π_old(x_{t−1} | x_t)``;
2. score each final image; advantages ``group_advantages(rewards, G)`` per prompt, clipped to
   ``±adv_clip_max``;
3. pick a random ``timestep_fraction`` of each chain's steps (the chain is long and its steps are
   highly correlated: a subset gives nearly the same gradient for a fraction of the compute);
4. ``num_iterations`` (μ) passes over the chains in ``num_minibatches`` minibatches, each an optimizer
   step on ``mean over (chain, step) of −min(ρ·A, clip(ρ, 1 − ε, 1 + ε_high)·A) + β·KL(π_θ ‖ π_ref)``,
   with ``ρ = π_θ(x_{t−1} | x_t) / π_old(x_{t−1} | x_t)`` **per step** and the KL to the frozen base
   model computed exactly (the two Gaussians share σ).

With μ = 1 and one minibatch the ratio is exactly 1 and the gradient is REINFORCE over the chain with
the group mean as baseline; the clip only acts once the weights have moved within a batch.

Config names follow TRL's GRPOConfig / DDPOConfig where the concept is the same (num_generations,
beta, epsilon, epsilon_high, num_iterations, scale_rewards, learning_rate, max_grad_norm,
sample_num_steps → num_inference_steps, sample_eta → eta, train_adv_clip_max → adv_clip_max,
train_timestep_fraction → timestep_fraction).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo._checks import (at_least, check_config_types, check_finite, config_error, non_negative, one_of,
                              positive)
from minigrpo.advantages import SCALES, group_advantages
from minigrpo.diffusion.sampler import (REDUCTIONS, Chain, ModelFn, ReverseProcess, ddim_scheduler,
                                        gaussian_kl_same_std, unet_output)
from minigrpo.losses import clipped_surrogate_loss

RewardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class DiffusionGRPOConfig:
    """GRPO-for-diffusion knobs (TRL GRPOConfig / DDPOConfig names where the concept is the same)."""

    max_steps: int = 40  #: GRPO steps (each: sample chains, then num_iterations × num_minibatches optimizer steps)
    prompts_per_step: int = 4  #: distinct prompts (class labels) per step
    num_generations: int = 8  #: G, chains per prompt (the group)
    num_classes: int = 10  #: prompts are drawn from 0 .. num_classes − 1
    sampler: str = "ddim"  #: "ddim" (η-controlled variance) or "ddpm" (the scheduler's own rule)
    num_inference_steps: int = 10  #: K, denoising steps per chain (DDPO: sample_num_steps)
    eta: float = 1.0  #: DDIM η (DDPO: sample_eta); must be > 0 (η = 0 is deterministic: no log-prob)
    logprob_reduction: str = "mean"  #: "mean" or "sum" of the per-pixel log-density (DDPO: mean)
    learning_rate: float = 1e-4  #: AdamW step size
    beta: float = 0.0  #: weight of the exact per-step KL(π_θ ‖ π_base); 0 keeps no reference copy
    epsilon: float = 0.2  #: lower clip range ε on the per-step ratio (pair a small ε with "mean")
    epsilon_high: float | None = None  #: upper clip range (None: = epsilon)
    adv_clip_max: float = 5.0  #: advantages are clipped to ±this (DDPO: train_adv_clip_max)
    scale_rewards: str = "group"  #: "group", "batch" or "none" (see group_advantages)
    timestep_fraction: float = 1.0  #: share of each chain's steps trained on (DDPO: train_timestep_fraction)
    min_step_std: float = 0.0  #: steps with σ below this are not trained on (their ∇log π ∝ 1/σ is mostly noise)
    num_iterations: int = 1  #: μ, passes over each sampled batch
    num_minibatches: int = 1  #: optimizer steps per pass (chains split into this many minibatches)
    max_grad_norm: float = 1.0  #: global gradient-norm clip
    weight_decay: float = 0.0  #: AdamW weight decay
    seed: int = 0  #: seeds prompts, noise and step subsampling

    def __post_init__(self):
        check_config_types(self)
        if self.num_generations < 2:
            raise config_error(self, "num_generations", ">= 2", "a group needs a spread")
        at_least(self, 1, "max_steps", "num_classes", "num_inference_steps", "num_iterations", "num_minibatches")
        if not 1 <= self.prompts_per_step <= self.num_classes:
            raise config_error(self, "prompts_per_step", f"in [1, num_classes={self.num_classes}]",
                               "the prompts of a step are distinct class labels")
        one_of(self, "sampler", ("ddim", "ddpm"))
        if self.sampler == "ddim" and not self.eta > 0:
            raise config_error(self, "eta", "> 0 for GRPO", "with eta=0 DDIM is deterministic, a step has no probability "
                                                            "density, so there is no log-prob and no policy ratio")
        non_negative(self, "eta")
        one_of(self, "logprob_reduction", REDUCTIONS)
        one_of(self, "scale_rewards", SCALES)
        positive(self, "learning_rate", "epsilon", "epsilon_high")
        non_negative(self, "beta", "min_step_std", "weight_decay")
        positive(self, "adv_clip_max", "max_grad_norm", finite=False)  # inf: no clipping
        if not 0 < self.timestep_fraction <= 1:
            raise config_error(self, "timestep_fraction", "in (0, 1]")
        chains = self.prompts_per_step * self.num_generations
        if chains % self.num_minibatches:
            raise config_error(self, "num_minibatches", f"a divisor of the number of chains per step "
                                                        f"(prompts_per_step × num_generations = {chains})")


def make_process(scheduler, cfg: DiffusionGRPOConfig, model_fn: ModelFn = unet_output) -> ReverseProcess:
    """The reverse process the trainer samples with: DDIM (ᾱ_final = ᾱ_0, every step stochastic) or DDPM."""
    if cfg.sampler == "ddim":
        sched = scheduler if type(scheduler).__name__.startswith("DDIM") else ddim_scheduler(scheduler)
    else:
        sched = scheduler
    return ReverseProcess(sched, cfg.num_inference_steps, cfg.eta, model_fn=model_fn)


def check_rewards(rewards, n: int) -> torch.Tensor:
    """The reward function's output as a float32 ``[n]`` tensor, or a clear error."""
    r = torch.as_tensor(rewards, dtype=torch.float32).detach().cpu()
    if r.shape != (n,):
        raise ValueError(f"the reward function must return one scalar per image, shape [{n}]; got {tuple(r.shape)}")
    check_finite(r, "the reward function's output")
    return r


def select_steps(stochastic: torch.Tensor, num_chains: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """``[num_chains, n]`` step indices: for each chain a random ``fraction`` of its stochastic steps."""
    usable = stochastic.nonzero().squeeze(-1)
    if usable.numel() == 0:
        raise ValueError("the chain has no step to train on (every σ is 0, or below min_step_std)")
    n = max(1, int(round(fraction * usable.numel())))
    order = torch.stack([torch.randperm(usable.numel(), generator=generator)[:n] for _ in range(num_chains)])
    return usable[order]


def grpo_step_loss(process: ReverseProcess, model, chain: Chain, chains: torch.Tensor, steps: torch.Tensor,
                   advantages: torch.Tensor, cfg: DiffusionGRPOConfig, ref_mean: torch.Tensor | None = None):
    """The GRPO loss on the recorded steps ``(chains[i], steps[i, j])``, one forward pass for all of them.

    ``advantages`` is one scalar per chain ``[B]``; each step of a chain gets its chain's advantage.
    Returns ``(loss, stats, mean)``; ``mean`` is the policy's Gaussian mean per (chain, step) row.
    """
    n = steps.shape[1]
    b = chains.repeat_interleave(n)
    k = steps.reshape(-1)
    x_t, x_prev = chain.xs[k, b], chain.xs[k + 1, b]
    t = chain.timesteps[k]
    logp, mean, std = process.step_logprob(model, x_t, x_prev, t, chain.labels[b], cfg.logprob_reduction,
                                           return_mean=True)
    old = chain.logprobs[b, k]
    loss, stats = clipped_surrogate_loss(logp, old, advantages[b], cfg.epsilon, cfg.epsilon_high)
    with torch.no_grad():
        stats["log_ratio_abs_max"] = (logp - old).abs().max().item()
    if ref_mean is not None:
        kl = gaussian_kl_same_std(mean, ref_mean, std, cfg.logprob_reduction).mean()
        loss = loss + cfg.beta * kl
        stats["kl_ref"] = kl.item()
    return loss, stats, mean


#: The digits recipe of lesson 09 and benchmarks/grpo_diffusion.py (base model: lesson 08's
#: ``pretrained_base``; reward: ``ClassifierReward(classifier, **DIGITS_REWARD)``).
DIGITS_RECIPE = dict(max_steps=60, prompts_per_step=4, num_generations=8, num_inference_steps=10, eta=1.0,
                     learning_rate=3e-4, epsilon=1e-3, logprob_reduction="mean", timestep_fraction=0.5,
                     min_step_std=0.05, num_iterations=1, num_minibatches=2, beta=0.0)
#: The judge's probability at temperature 4: at temperature 1 the probability saturates (lesson 08's
#: base already scores 0.99 as a best-of-4), which leaves little to learn or to measure.
DIGITS_REWARD = dict(kind="prob", temperature=4.0)


@dataclass
class DiffusionGRPOResult:
    model: torch.nn.Module
    history: dict[str, list] = field(default_factory=dict)
    config: dict = field(default_factory=dict)


class DiffusionGRPOTrainer:
    """Holds the policy, the frozen base (if β > 0), the optimizer, the reverse process and the RNGs.

    Args:
        model: the denoiser (e.g. a class-conditional ``diffusers.UNet2DModel``); trained in place.
        scheduler: its ``DDPMScheduler`` (or ``DDIMScheduler``); the trainer's sampler is built from it.
        reward_fn: ``reward_fn(images [B, C, H, W], labels [B]) -> [B]``.
        config: :class:`DiffusionGRPOConfig`.
        ref_model: the frozen base for the KL (default: a copy of ``model`` taken now, only if β > 0).
        model_fn: how to call the network (see :mod:`minigrpo.diffusion.sampler`).
    """

    def __init__(self, model, scheduler, reward_fn: RewardFn, config: DiffusionGRPOConfig | None = None,
                 ref_model=None, model_fn: ModelFn = unet_output):
        self.cfg = cfg = config or DiffusionGRPOConfig()
        self.model, self.reward_fn = model, reward_fn
        self.process = make_process(scheduler, cfg, model_fn)
        self.ref = None
        if cfg.beta > 0:
            self.ref = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref.eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step_count = 0
        self.history: dict[str, list] = {}

    def prompts(self) -> torch.Tensor:
        """``[prompts_per_step × G]`` labels: distinct prompts, each repeated G times (contiguous groups)."""
        cfg = self.cfg
        labels = torch.randperm(cfg.num_classes, generator=self.gen)[:cfg.prompts_per_step]
        return labels.repeat_interleave(cfg.num_generations)

    def step(self) -> dict[str, float]:
        cfg, G = self.cfg, self.cfg.num_generations
        t0 = time.perf_counter()
        device = next(self.model.parameters()).device
        labels = self.prompts().to(device)
        self.model.eval()  # one policy: the same function samples and is scored (no dropout anywhere)
        chain = self.process.sample(self.model, labels, generator=self.gen, reduction=cfg.logprob_reduction)
        rewards = check_rewards(self.reward_fn(chain.images, labels), labels.numel())
        adv = group_advantages(rewards, G, cfg.scale_rewards).clamp(-cfg.adv_clip_max, cfg.adv_clip_max).to(device)
        B = labels.numel()
        trainable = chain.stochastic & (chain.stds >= cfg.min_step_std)
        steps = select_steps(trainable, B, cfg.timestep_fraction, self.gen).to(device)
        t_sample = time.perf_counter() - t0

        ref_mean = None
        if self.ref is not None:
            with torch.no_grad():
                n = steps.shape[1]
                b, k = torch.arange(B, device=device).repeat_interleave(n), steps.reshape(-1)
                ref_mean = self.process.predict(self.ref, chain.xs[k, b], chain.timesteps[k].to(device),
                                                labels[b])[0].view(B, n, *chain.xs.shape[2:])
        stats, grad_norms = [], []
        for _ in range(cfg.num_iterations):
            perm = torch.randperm(B, generator=self.gen).to(device)
            for mb in perm.chunk(cfg.num_minibatches):
                rm = None if ref_mean is None else ref_mean[mb].flatten(0, 1)
                loss, st, _ = grpo_step_loss(self.process, self.model, chain, mb, steps[mb], adv, cfg, rm)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)))
                self.opt.step()
                st["loss"] = loss.item()
                stats.append(st)
        self.step_count += 1
        group_std = rewards.view(-1, G).std(1)
        metrics = {
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std().item(),
            "zero_std_frac": (group_std == 0).float().mean().item(),
            "grad_norm": float(np.mean(grad_norms)),
            "sample_time": t_sample,
            "step_time": time.perf_counter() - t0,
        }
        for key in ("loss", "clip_frac", "approx_kl", "ratio_min", "ratio_max", "log_ratio_abs_max", "kl_ref"):
            if key in stats[0]:
                metrics[key] = float(np.mean([s[key] for s in stats]))
        for key, v in metrics.items():
            self.history.setdefault(key, []).append(v)
        return metrics

    def train(self, progress: bool = True, callback: Callable[[int, dict], None] | None = None) -> DiffusionGRPOResult:
        """Run ``max_steps`` GRPO steps with a tqdm bar; ``callback(step, metrics)`` after each."""
        bar = tqdm(range(self.cfg.max_steps), desc="GRPO (diffusion)", disable=not progress)
        for i in bar:
            m = self.step()
            bar.set_postfix(reward=f"{m['reward_mean']:.3f}", clip=f"{m.get('clip_frac', 0):.2f}")
            if callback is not None:
                callback(i, m)
        return DiffusionGRPOResult(self.model, self.history, asdict(self.cfg))


@torch.no_grad()
def sample_rewards(model, process: ReverseProcess, reward_fn: RewardFn, labels: torch.Tensor, seed: int = 0,
                   batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh samples for ``labels`` and their rewards: ``(images [N, C, H, W], rewards [N])``."""
    g = torch.Generator().manual_seed(seed)
    model.eval()
    device = next(model.parameters()).device
    imgs, rs = [], []
    for lab in torch.as_tensor(labels).split(batch_size):
        chain = process.sample(model, lab.to(device), generator=g)
        imgs.append(chain.images.cpu())
        rs.append(check_rewards(reward_fn(chain.images, lab.to(device)), lab.numel()))
    return torch.cat(imgs), torch.cat(rs)


def best_of_n(rewards: torch.Tensor, n: int) -> torch.Tensor:
    """Best-of-n per prompt: ``rewards`` ``[num_prompts * n]`` (each prompt's n samples contiguous) → ``[num_prompts]``."""
    if rewards.ndim != 1 or rewards.numel() % n:
        raise ValueError(f"rewards must be [num_prompts * n] with n={n}; got shape {tuple(rewards.shape)}")
    return rewards.view(-1, n).max(1).values
