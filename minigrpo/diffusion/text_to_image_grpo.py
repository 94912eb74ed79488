"""GRPO for a text-to-image latent diffusion model (DDPO, Black et al. 2023, arXiv:2305.13301, with
group-relative advantages per prompt as in Flow-GRPO and DanceGRPO, 2025).

The recipe is lesson 09's (:mod:`minigrpo.diffusion.grpo`) with the parts a real model brings:

1. the prompts of a step are **text**: ``prompts_per_step`` distinct strings drawn from ``train_prompts``,
   encoded once by the frozen text encoder (and the empty prompt, for guidance);
2. G = ``num_generations`` chains per prompt run in **latent** space with **classifier-free guidance inside the
   policy's mean** (:class:`~minigrpo.diffusion.text_to_image.GuidedDenoiser`): the recorded log-probs, the
   recomputed ones and so the ratios are those of the guided sampler;
3. the VAE decodes the final latents, the **reward functions** score ``(images in [0, 1], prompts)``; their
   weighted sum gives per-prompt group advantages (``group_advantages``, clipped to ±``adv_clip_max``);
4. a random ``timestep_fraction`` of each chain's steps with σ ≥ ``min_step_std`` is trained on (**timestep
   subsampling**: DDPO's ``train.timestep_fraction``; lesson 09 shows the smallest-σ steps cost reward): rows
   (chain, step) are shuffled, split into ``num_minibatches`` optimizer steps, each accumulated over micro-batches
   of ``train_batch_size`` rows (a large UNet fits only a few rows at once);
5. only the **LoRA** adapters train (``peft_config``); with β > 0 the exact per-step KL is to the same UNet
   with its adapters off (no second copy of the weights).

Metrics use TRL's names (``reward``, ``reward_std``, ``frac_reward_zero_std``, ``rewards/<name>/mean``, ``kl``,
``clip_ratio/*``, ``loss``, ``grad_norm``) and lesson 09's (``approx_kl``, ``ratio_min``, ``ratio_max``,
``log_ratio_abs_max``, ``sample_time``, ``step_time``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo.infra.atomic import atomic_folder
from minigrpo.infra.checks import at_least, check_config_types, config_error, non_negative, one_of, positive
from minigrpo.advantages import SCALES, group_advantages
from minigrpo.diffusion.grpo import (STEP_STATS, check_rewards, grpo_step_loss, process_stds, select_steps,
                                     trainable_steps)
from minigrpo.diffusion.sampler import REDUCTIONS, Chain, ReverseProcess, ddim_scheduler
from minigrpo.diffusion.text_to_image import PromptEmbeds, TextToImagePolicy, with_prompts
from minigrpo.grpo_common import frozen_reference, mean_of, reference_policy, reward_metrics

#: ``reward(images [N, 3, H, W] in [0, 1], prompts: list[str] of N) -> [N]``
RewardFunc = Callable[[torch.Tensor, list], torch.Tensor]


@dataclass
class TextToImageGRPOConfig:
    """Text-to-image GRPO knobs: TRL's GRPOConfig names where the concept is the same, DDPO's for the sampler."""

    max_steps: int = 10  #: GRPO steps (each: one rollout, then num_iterations × num_minibatches optimizer steps)
    prompts_per_step: int = 2  #: distinct prompts per step, drawn from train_prompts without repetition
    num_generations: int = 4  #: G, images (chains) per prompt: the group of the advantage
    num_inference_steps: int = 10  #: K, denoising steps per chain (DDPO: sample.num_steps)
    guidance_scale: float = 5.0  #: classifier-free guidance w, inside the policy's mean (1: no guidance)
    sampler: str = "ddim"  #: "ddim" (η-controlled variance) or "ddpm"; a flow-matching scheduler always uses its SDE
    #: DDIM η (DDPO: sample.eta), or the SDE's noise level a for a flow-matching scheduler (Flow-GRPO: 0.7);
    #: must be > 0: η = 0 (or a = 0, the ODE) is deterministic and has no log-prob
    eta: float = 1.0
    logprob_reduction: str = "mean"  #: "mean" (DDPO) or "sum" of the per-element log-density over the latent
    epsilon: float = 1e-4  #: clip range ε of the per-step ratio (DDPO's 1e-4 goes with the per-element mean)
    epsilon_high: float | None = None  #: upper clip range (None: = epsilon)
    beta: float = 0.0  #: weight of the exact per-step KL(π_θ ‖ π_ref), π_ref = the UNet with adapters off
    learning_rate: float = 3e-4  #: AdamW step size (LoRA takes larger steps than full fine-tuning)
    weight_decay: float = 0.0  #: AdamW weight decay
    max_grad_norm: float = 1.0  #: global gradient-norm clip
    adv_clip_max: float = 5.0  #: advantages are clipped to ±this (DDPO: train.adv_clip_max)
    scale_rewards: str = "group"  #: "group", "batch" or "none" (see group_advantages)
    reward_weights: list[float] | None = None  #: one weight per reward function (None: all 1)
    timestep_fraction: float = 1.0  #: share of each chain's steps trained on (DDPO: train.timestep_fraction)
    #: steps with σ below this are not trained on (their ∇log π ∝ 1/σ is mostly noise; lesson 09: 0.05 on the digits);
    #: 0 trains on every stochastic step. Stable Diffusion's DDIM chain at η = 1 ends with σ ≈ 0.04 and 0.02
    min_step_std: float = 0.0
    num_iterations: int = 1  #: μ, passes over each rollout
    num_minibatches: int = 1  #: optimizer steps per pass (the rows (chain, step) split into this many)
    train_batch_size: int | None = None  #: rows per forward/backward, gradients accumulated (None: a whole minibatch)
    sample_batch_size: int | None = None  #: chains sampled at once (None: all of a step's)
    seed: int = 0  #: seeds prompts, noise and the step subsampling

    def __post_init__(self):
        check_config_types(self)
        if self.num_generations < 2:
            raise config_error(self, "num_generations", ">= 2", "a group needs a spread")
        at_least(self, 1, "max_steps", "prompts_per_step", "num_inference_steps", "num_iterations",
                 "num_minibatches", "train_batch_size", "sample_batch_size")
        one_of(self, "sampler", ("ddim", "ddpm"))
        if not self.eta > 0:
            raise config_error(self, "eta", "> 0 for training", "with eta=0 DDIM (or the flow ODE) is deterministic: "
                                                                "a step has no density, so no log-prob and no ratio")
        non_negative(self, "eta", "beta", "weight_decay", "min_step_std")
        if not self.guidance_scale >= 1:
            raise config_error(self, "guidance_scale", ">= 1", "1 is the conditional model alone, w > 1 guides")
        one_of(self, "logprob_reduction", REDUCTIONS)
        one_of(self, "scale_rewards", SCALES)
        positive(self, "learning_rate", "epsilon", "epsilon_high")
        positive(self, "adv_clip_max", "max_grad_norm", finite=False)
        if not 0 < self.timestep_fraction <= 1:
            raise config_error(self, "timestep_fraction", "in (0, 1]")


@dataclass
class TextToImageRollout:
    """One step's sampled chains and what the loss needs of them."""

    prompts: list[str]  #: the distinct prompts (row i of ``embeds.cond``)
    process: ReverseProcess  #: the guided reverse process on these prompts (a FlowProcess for a flow model)
    chain: Chain  #: latents x_T … x_0 of B = P × G chains, ``chain.labels`` = prompt index
    images: torch.Tensor  #: [B, 3, H, W] decoded in [0, 1], on the CPU
    rewards: torch.Tensor  #: [B] the weighted sum of the reward functions (CPU)
    reward_parts: dict[str, torch.Tensor]  #: each reward function's [B] output
    advantages: torch.Tensor  #: [B] group advantages, clipped
    steps: torch.Tensor  #: [B, n] the steps trained on
    ref_mean: torch.Tensor | None  #: [B·n, C, h, w] π_ref's Gaussian means at those rows (β > 0)
    sample_time: float


@dataclass
class TextToImageGRPOResult:
    policy: TextToImagePolicy
    history: dict[str, list] = field(default_factory=dict)
    config: dict = field(default_factory=dict)


def _cat_chains(chains: list[Chain]) -> Chain:
    """Chains sampled in batches, joined along the batch."""
    if len(chains) == 1:
        return chains[0]
    c = chains[0]
    return Chain(xs=torch.cat([x.xs for x in chains], 1), timesteps=c.timesteps, stds=c.stds,
                 logprobs=torch.cat([x.logprobs for x in chains]), labels=torch.cat([x.labels for x in chains]),
                 reduction=c.reduction)


def make_process(scheduler, cfg: TextToImageGRPOConfig):
    """The sampler of the policy: Flow-GRPO's SDE (noise level ``eta``) for a ``FlowMatchEulerDiscreteScheduler``,
    else DDIM (η = ``eta``; a DDPM schedule is converted, ᾱ_final = ᾱ_0 as in Stable Diffusion) or DDPM."""
    name = type(scheduler).__name__
    if name.startswith("FlowMatch"):
        from minigrpo.diffusion.flow import FlowProcess

        return FlowProcess(scheduler, cfg.num_inference_steps, cfg.eta)
    if cfg.sampler == "ddim" and not name.startswith("DDIM"):
        scheduler = ddim_scheduler(scheduler, set_alpha_to_one=False)
    return ReverseProcess(scheduler, cfg.num_inference_steps, cfg.eta)


def _reward_name(f) -> str:
    return getattr(f, "__name__", type(f).__name__)


class TextToImageGRPOTrainer:
    """GRPO on a :class:`TextToImagePolicy`: LoRA adapters on its UNet, everything else frozen.

    Args:
        policy: the components (text encoder, tokenizer, UNet, VAE, scheduler); its UNet is trained in place.
        reward_funcs: one ``reward(images, prompts) -> [N]`` or a list of them (summed with ``reward_weights``).
        train_prompts: the prompts a step draws from (a list of str).
        config: :class:`TextToImageGRPOConfig`.
        peft_config: e.g. ``LoraConfig(target_modules=["to_q", "to_k", "to_v", "to_out.0"])``; None trains the
            UNet as it is (its adapters if it already has some, else every weight, with a frozen copy for β > 0).
    """

    def __init__(self, policy: TextToImagePolicy, reward_funcs: RewardFunc | Sequence[RewardFunc],
                 train_prompts: Sequence[str], config: TextToImageGRPOConfig | None = None, peft_config=None):
        self.cfg = cfg = config or TextToImageGRPOConfig()
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not self.reward_funcs or not all(callable(f) for f in self.reward_funcs):
            raise TypeError("reward_funcs must be a reward function reward(images, prompts) or a list of them")
        if cfg.reward_weights is not None and len(cfg.reward_weights) != len(self.reward_funcs):
            raise config_error(cfg, "reward_weights", f"one weight per reward function ({len(self.reward_funcs)})")
        self.weights = torch.tensor(cfg.reward_weights or [1.0] * len(self.reward_funcs))
        self.train_prompts = self._check_prompts(train_prompts, "train_prompts")
        if cfg.prompts_per_step > len(self.train_prompts):
            raise config_error(cfg, "prompts_per_step", f"<= len(train_prompts) = {len(self.train_prompts)}",
                               "the prompts of a step are distinct")
        self.policy = policy
        if peft_config is not None:
            policy.add_lora(peft_config)
        self.unet = policy.unet
        params = [p for p in self.unet.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the UNet has no trainable parameter: give a peft_config, or load adapters trainable")
        self.ref = frozen_reference(self.unet, cfg.beta)  # None with adapters: π_ref = adapters off
        self.opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.process = make_process(policy.scheduler, cfg)
        trainable_steps(process_stds(self.process), cfg.min_step_std)  # a min_step_std that leaves no step: fail now
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step_count, self.history = 0, {}

    @staticmethod
    def _check_prompts(prompts, name: str) -> list[str]:
        if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise TypeError(f"{name} must be a non-empty list of str, got {prompts!r}")
        return list(prompts)

    def sample_prompts(self) -> list[str]:
        """``prompts_per_step`` distinct prompts of ``train_prompts``, at random."""
        idx = torch.randperm(len(self.train_prompts), generator=self.gen)[:self.cfg.prompts_per_step]
        return [self.train_prompts[i] for i in idx.tolist()]

    def score(self, images: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The weighted sum of the reward functions ``[N]`` (CPU) and each one's output; a clear error for a
        reward of the wrong shape or with NaN/inf."""
        parts = {}
        for f in self.reward_funcs:
            name = _reward_name(f)
            try:
                parts[name] = check_rewards(f(images, prompts), len(prompts))
            except ValueError as e:
                raise ValueError(f"reward function {name!r}: {e}") from None
        total = (torch.stack(list(parts.values()), 1) * self.weights).sum(1)
        return total, parts

    @torch.no_grad()
    def sample(self, process: ReverseProcess, labels: torch.Tensor) -> Chain:
        """Chains for ``labels`` (prompt indices), ``sample_batch_size`` at a time; the UNet in eval mode."""
        self.unet.eval()
        size = self.cfg.sample_batch_size or labels.numel()
        return _cat_chains([process.sample(self.unet, lab, shape=self.policy.latent_shape, generator=self.gen,
                                           reduction=self.cfg.logprob_reduction) for lab in labels.split(size)])

    @torch.no_grad()
    def rollout(self, prompts: Sequence[str] | None = None) -> TextToImageRollout:
        """Encode the prompts, sample G chains each, decode and score, advantages, the steps, π_ref's means."""
        cfg, t0 = self.cfg, time.perf_counter()
        prompts = self.sample_prompts() if prompts is None else self._check_prompts(prompts, "prompts")
        embeds: PromptEmbeds = self.policy.encode_prompts(prompts, with_uncond=cfg.guidance_scale != 1)
        process = with_prompts(self.process, embeds, cfg.guidance_scale)
        labels = torch.arange(len(prompts), device=self.policy.device).repeat_interleave(cfg.num_generations)  # (B,)
        chain = self.sample(process, labels)  # latents xs (K + 1, B, C, h, w), logprobs (B, K)
        images = self.policy.decode(chain.images).cpu()  # (B, 3, H, W) in [0, 1]
        rewards, parts = self.score(images, [prompts[i] for i in labels.tolist()])  # (B,) weighted sum, and each
        adv = group_advantages(rewards, cfg.num_generations, cfg.scale_rewards)
        adv = adv.clamp(-cfg.adv_clip_max, cfg.adv_clip_max).to(labels.device)  # (B,) one per chain
        B = labels.numel()
        trainable = trainable_steps(chain.stds, cfg.min_step_std)  # (K,) stochastic, σ ≥ min_step_std
        steps = select_steps(trainable, B, cfg.timestep_fraction, self.gen).to(labels.device)  # (B, n)
        sample_time = time.perf_counter() - t0
        ref_mean = self.reference_means(process, chain, steps) if cfg.beta > 0 else None
        return TextToImageRollout(prompts, process, chain, images, rewards, parts, adv, steps, ref_mean, sample_time)

    @torch.no_grad()
    def reference_means(self, process: ReverseProcess, chain: Chain, steps: torch.Tensor) -> torch.Tensor:
        """π_ref's Gaussian means ``[B·n, C, h, w]`` at the rows to train on (adapters off, or the frozen copy)."""
        b, k = self._rows(steps, torch.arange(steps.numel(), device=steps.device))
        size = self.cfg.train_batch_size or b.numel()
        with reference_policy(self.unet, self.ref) as ref:
            return torch.cat([process.predict(ref, chain.xs[kk, bb], chain.timesteps[kk].to(bb.device),
                                              chain.labels[bb])[0] for bb, kk in zip(b.split(size), k.split(size))])

    @staticmethod
    def _rows(steps: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain and step index of flat rows ``r = chain · n + j`` (``steps`` is ``[B, n]``)."""
        return rows // steps.shape[1], steps.reshape(-1)[rows]

    def compute_loss(self, ro: TextToImageRollout, rows: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The GRPO loss (mean over ``rows``) of the flat rows ``rows`` (a chain and one of its selected steps)."""
        b, k = self._rows(ro.steps, rows)
        ref_mean = None if ro.ref_mean is None else ro.ref_mean[rows]
        loss, stats, _ = grpo_step_loss(ro.process, self.unet, ro.chain, b, k[:, None], ro.advantages, self.cfg,
                                        ref_mean)
        return loss, stats

    def step(self, prompts: Sequence[str] | None = None) -> dict[str, float]:
        """One GRPO step (on ``prompts`` if given, else ``prompts_per_step`` drawn from ``train_prompts``): a
        rollout, then μ = ``num_iterations`` passes over its (chain, step) rows in ``num_minibatches`` optimizer
        steps each, every one accumulated over micro-batches of ``train_batch_size`` rows; returns its metrics."""
        cfg, t0 = self.cfg, time.perf_counter()

        # 1. Rollout (no gradient): encode the prompts, G guided chains each in latent space, decode and score,
        # one group advantage per chain, the steps to train on, π_ref's means there (β > 0).
        ro = self.rollout(prompts)  # B = P × G chains; ro.steps (B, n): the rows are the B·n (chain, step) pairs
        params = [p for g in self.opt.param_groups for p in g["params"]]  # the LoRA adapters (or the UNet)

        # 2. μ passes over the rows, each a fresh shuffle cut into num_minibatches optimizer steps.
        stats, norms = [], []
        for _ in range(cfg.num_iterations):
            perm = torch.randperm(ro.steps.numel(), generator=self.gen).to(ro.steps.device)  # (B·n,) flat rows
            for rows in perm.chunk(cfg.num_minibatches):  # (B·n / num_minibatches,) each
                self.opt.zero_grad(set_to_none=True)
                # Gradient accumulation: each micro-batch's loss (a mean over its rows) weighted by its share, so
                # the gradient is the one of the whole minibatch.
                for micro in rows.split(cfg.train_batch_size or rows.numel()):  # (≤ train_batch_size,) each
                    # −min(ρ·A, clip(ρ, 1 − ε, 1 + ε_high)·A) + β·KL(π_θ ‖ π_ref) per row: grpo_step_loss
                    loss, st = self.compute_loss(ro, micro)
                    (loss * micro.numel() / rows.numel()).backward()
                    st["loss"] = loss.item()
                    stats.append(st)
                norms.append(float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)))  # before clipping
                self.opt.step()
        self.step_count += 1

        # 3. Metrics (TRL's names): the rewards, each reward function's mean, the loss statistics averaged over
        # the micro-batches.
        metrics, _ = reward_metrics(ro.rewards, cfg.num_generations)
        metrics.update({f"rewards/{name}/mean": float(r.mean()) for name, r in ro.reward_parts.items()})
        metrics.update(grad_norm=float(np.mean(norms)), sample_time=ro.sample_time,
                       step_time=time.perf_counter() - t0)
        metrics.update(mean_of(stats, STEP_STATS))
        for key, v in metrics.items():
            self.history.setdefault(key, []).append(v)
        return metrics

    def train(self, progress: bool = True, callback: Callable[[int, dict], None] | None = None
              ) -> TextToImageGRPOResult:
        """``max_steps`` GRPO steps with a tqdm bar; ``callback(step_index, metrics)`` after each (index from 0)."""
        bar = tqdm(range(self.step_count, self.cfg.max_steps), desc="GRPO (text-to-image)", disable=not progress,
                   initial=self.step_count, total=self.cfg.max_steps)
        for i in bar:
            m = self.step()
            self.history.setdefault("step", []).append(i + 1)
            bar.set_postfix(reward=f"{m['reward']:.3f}")
            if callback is not None:
                callback(i, m)
        return TextToImageGRPOResult(self.policy, self.history, asdict(self.cfg))

    def save_adapter(self, folder) -> None:
        """The LoRA adapters alone (``unet.save_pretrained``: adapter_config.json + adapter weights), written whole or
        not at all: ``folder`` becomes the new adapters, or stays as it was if the save fails midway."""
        if not hasattr(self.unet, "peft_config"):
            raise ValueError("the UNet has no adapters to save: save the whole policy with policy.save_pretrained")
        with atomic_folder(folder) as tmp:  # written beside, then renamed into place
            self.unet.save_pretrained(str(tmp))


__all__ = ["RewardFunc", "TextToImageGRPOConfig", "TextToImageGRPOResult", "TextToImageGRPOTrainer",
           "TextToImageRollout"]
