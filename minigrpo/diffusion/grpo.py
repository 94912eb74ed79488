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
3. pick a random ``timestep_fraction`` of each chain's steps (the chain is long; its steps'
   gradients are nearly orthogonal — lesson 09 measures mean |cos| ≈ 0.13 between neighbours — so a subset is
   an unbiased but noisier estimate of the full chain's gradient, at a fraction of the compute);
4. ``num_iterations`` (μ) passes over the chains in ``num_minibatches`` minibatches, each an optimizer
   step on ``losses.grpo_loss`` with one element per (chain, step): the mean over them of
   ``−min(ρ·A, clip(ρ, 1 − ε, 1 + ε_high)·A) + β·KL(π_θ ‖ π_ref)`` (``loss_type="bnpo"``, every element
   valid), with ``ρ = π_θ(x_{t−1} | x_t) / π_old(x_{t−1} | x_t)`` **per step** and the KL to the frozen
   base model computed exactly (the two Gaussians share σ) instead of estimated from log-probs.

Steps 1–3 are :meth:`DiffusionGRPOTrainer.rollout`, step 4 the rest of :meth:`~DiffusionGRPOTrainer.step`
(the loss of a minibatch is :func:`grpo_step_loss`, through :meth:`~DiffusionGRPOTrainer.compute_loss`).
Metrics carry TRL's names where TRL logs the quantity, as the LLM trainer's: ``reward``, ``reward_std``,
``frac_reward_zero_std``, ``kl``, ``clip_ratio/low_mean``, ``clip_ratio/high_mean``,
``clip_ratio/region_mean``, ``loss``, ``grad_norm``; ours for ``approx_kl``, ``ratio_min``, ``ratio_max``,
``log_ratio_abs_max``, ``sample_time``, ``step_time`` (each the mean over the step's minibatches).

With μ = 1 and one minibatch the ratio is exactly 1 and the gradient is REINFORCE over the chain with
the group mean as baseline; the clip only acts once the weights have moved within a batch.

Several processes (``accelerate launch --num_processes N``, ``torchrun``; ``minigrpo.infra.distributed``): each rank samples
``prompts_per_step`` whole groups with its own seed (a global batch of N × ``prompts_per_step`` prompts); the rewards
are gathered (``scale_rewards="batch"`` and the reward metrics see the global batch), each minibatch's loss is
normalised by the (chain, step) elements of every rank and the gradients are summed, so an optimizer step is the
one-process step of the global minibatch; the other metrics are averaged over the ranks; only rank 0 shows progress,
logs and saves. In one process nothing changes.

Config names follow TRL's GRPOConfig where the concept is the same (num_generations, beta, epsilon,
epsilon_high, num_iterations, scale_rewards, learning_rate, max_grad_norm); the diffusion-specific ones
follow the DDPO reference implementation (github.com/kvablack/ddpo-pytorch, ``config.sample`` /
``config.train``): sample.num_steps → num_inference_steps, sample.eta → eta, train.adv_clip_max →
adv_clip_max, train.timestep_fraction → timestep_fraction. (TRL's DDPOConfig, which carried the same
names with ``sample_`` / ``train_`` prefixes, has since been removed from TRL.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo.infra.checks import (at_least, check_config_types, check_finite, config_error, non_negative, one_of,
                                   positive)
from minigrpo.advantages import SCALES, group_advantages
from minigrpo.infra.atomic import atomic_folder
from minigrpo.infra.distributed import Distributed
from minigrpo.diffusion.sampler import (REDUCTIONS, Chain, ModelFn, ReverseProcess, ddim_scheduler,
                                        gaussian_kl_same_std, unet_output)
from minigrpo.grpo_common import frozen_reference, mean_of, reward_metrics
from minigrpo.losses import grpo_loss
from minigrpo.infra.tracking import (Tracker, check_report_to, checkpoint_folder, resolve_checkpoint, restore_trainer,
                                     save_state, save_weights, should_log, should_save, trainer_state)

RewardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class DiffusionGRPOConfig:
    """GRPO-for-diffusion knobs (TRL GRPOConfig names where the concept is the same, DDPO's for the sampler)."""

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
    #: lower clip range ε on the per-step ratio. 1e-3 pairs with the per-pixel "mean" (lesson 09 §12: a mean
    #: log-ratio is ~D times smaller than the image's, so an LLM's 0.2 would almost never clip); with "sum" use ~0.2
    epsilon: float = 1e-3
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
    #: trackers to log to: "none", "tensorboard", "trackio", "wandb", or a list of them (see minigrpo.infra.tracking)
    report_to: str | list[str] = "none"
    logging_dir: str | Path | None = None  #: where the trackers write (None: runs/diffusion-grpo-<timestamp>)
    logging_steps: int = 1  #: send the metrics to the trackers every this many steps (and at the last)
    #: save a resumable checkpoint (weights, optimizer, random states, history) to output_dir/checkpoint-<step>
    output_dir: str | Path | None = None
    save_steps: int = 0  #: every this many steps (0: only at the end), when output_dir is set
    #: resume from this checkpoint folder, or True: the latest one in output_dir
    resume_from_checkpoint: str | Path | bool | None = None

    def __post_init__(self):
        check_config_types(self)
        if self.num_generations < 2:
            raise config_error(self, "num_generations", ">= 2", "a group needs a spread")
        at_least(self, 1, "max_steps", "num_classes", "num_inference_steps", "num_iterations", "num_minibatches",
                 "logging_steps")
        at_least(self, 0, "save_steps")
        check_report_to(self)
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
    """The reverse process the trainer samples with: DDIM (ᾱ_final = ᾱ_0, every step stochastic) or DDPM;
    for a ``FlowMatchEulerDiscreteScheduler``, Flow-GRPO's SDE sampler with noise level ``cfg.eta``."""
    if type(scheduler).__name__.startswith("FlowMatch"):
        from minigrpo.diffusion.flow import FlowProcess
        return FlowProcess(scheduler, cfg.num_inference_steps, cfg.eta, model_fn=model_fn)
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


def trainable_steps(stds: torch.Tensor, min_step_std: float = 0.0) -> torch.Tensor:
    """``[K]`` bool: the steps of a chain with per-step σ ``stds`` that may be trained on, the stochastic ones (σ > 0)
    with σ ≥ ``min_step_std``; a ValueError in one sentence when that leaves none."""
    keep = (stds > 0) & (stds >= min_step_std)
    if not keep.any():
        largest = float(stds.max()) if stds.numel() else 0.0
        raise ValueError(f"min_step_std={min_step_std:g} leaves no step to train on: the largest σ of the chain is "
                         f"{largest:.3g} (lower min_step_std, or raise eta)")
    return keep


def process_stds(process: ReverseProcess) -> torch.Tensor:
    """``[K]`` the σ of each step of ``process``'s chain (what ``Chain.stds`` records), without sampling one."""
    return process.std(process.timesteps).float()


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

    ``advantages`` is one scalar per chain ``[B]``; each step of a chain gets its chain's advantage. With
    ``ref_mean`` (the frozen base's Gaussian means of the same rows) the exact per-step KL joins the objective.
    Returns ``(loss, stats, mean)``; ``mean`` is the policy's Gaussian mean per (chain, step) row.
    """
    n = steps.shape[1]
    b = chains.repeat_interleave(n)
    k = steps.reshape(-1)
    x_t, x_prev = chain.xs[k, b], chain.xs[k + 1, b]
    t = chain.timesteps[k]
    logp, mean, std = process.step_logprob(model, x_t, x_prev, t, chain.labels[b], cfg.logprob_reduction,
                                           return_mean=True)
    kl = None if ref_mean is None else gaussian_kl_same_std(mean, ref_mean, std, cfg.logprob_reduction)
    loss, stats = grpo_loss(logp, chain.logprobs[b, k], advantages[b], None, "bnpo", cfg.epsilon, cfg.epsilon_high,
                            kl=kl, beta=cfg.beta)
    return loss, stats, mean


#: The digits recipe of lesson 09 and benchmarks/grpo_diffusion.py (base model: lesson 08's
#: ``pretrained_base``; reward: ``ClassifierReward(classifier, **DIGITS_REWARD)``).
DIGITS_RECIPE = dict(max_steps=60, prompts_per_step=4, num_generations=8, num_inference_steps=10, eta=1.0,
                     learning_rate=3e-4, epsilon=1e-3, logprob_reduction="mean", timestep_fraction=0.5,
                     min_step_std=0.05, num_iterations=1, num_minibatches=2, beta=0.0)
#: The judge's probability at temperature 4: at temperature 1 the probability saturates (lesson 08's
#: base already scores 0.99 as a best-of-4), which leaves little to learn or to measure.
DIGITS_REWARD = dict(kind="prob", temperature=4.0)


#: The loss statistics a step logs, each the mean over its minibatches (``kl`` only when β > 0).
STEP_STATS = ("loss", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "approx_kl",
              "ratio_min", "ratio_max", "log_ratio_abs_max", "kl")


@dataclass
class DiffusionRollout:
    """What :meth:`DiffusionGRPOTrainer.rollout` returns: the sampled chains and what the loss needs of them."""

    chain: Chain
    labels: torch.Tensor  #: [B] the prompts (class labels), groups of G contiguous
    rewards: torch.Tensor  #: [B] on the CPU
    advantages: torch.Tensor  #: [B] group advantages, clipped to ±adv_clip_max
    steps: torch.Tensor  #: [B, n] the steps of each chain trained on
    ref_mean: torch.Tensor | None  #: [B, n, C, H, W] the base model's Gaussian means there (β > 0)
    sample_time: float


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
        self.dist = Distributed()  # one process: every collective is the identity
        self.dist.broadcast_parameters(model)  # every rank starts from rank 0's weights (and copies its reference)
        self.process = make_process(scheduler, cfg, model_fn)
        trainable_steps(process_stds(self.process), cfg.min_step_std)  # a min_step_std that leaves no step: fail now
        self.ref = frozen_reference(model, cfg.beta, ref_model)
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.gen = torch.Generator().manual_seed(self.dist.seed(cfg.seed))  # rank 0: cfg.seed; the others their own
        self.step_count = 0
        self.history: dict[str, list] = {}

    def prompts(self) -> torch.Tensor:
        """``[prompts_per_step × G]`` labels: distinct prompts, each repeated G times (contiguous groups)."""
        cfg = self.cfg
        labels = torch.randperm(cfg.num_classes, generator=self.gen)[:cfg.prompts_per_step]
        return labels.repeat_interleave(cfg.num_generations)

    @torch.no_grad()
    def rollout(self) -> DiffusionRollout:
        """The first half of :meth:`step`, no gradient: sample G chains per prompt recording every step, score the
        final images, the group advantages, the steps to train on, π_ref's means there. B = prompts_per_step × G."""
        cfg, t0 = self.cfg, time.perf_counter()
        device = next(self.model.parameters()).device
        labels = self.prompts().to(device)  # (B,) class labels, groups of G contiguous
        self.model.eval()  # one policy: the same function samples and is scored (no dropout anywhere)
        chain = self.process.sample(self.model, labels, generator=self.gen,
                                    reduction=cfg.logprob_reduction)  # xs (K + 1, B, C, H, W), logprobs (B, K)
        B = labels.numel()
        rewards = check_rewards(self.reward_fn(chain.images, labels), B)  # (B,) on the CPU
        # One advantage per chain, given to each of its steps: the reward arrives only at the end.
        adv = self.advantages(rewards).to(device)  # (B,) against its group, clipped to ±adv_clip_max
        # Timestep subsampling (DDPO): a random timestep_fraction of each chain's steps with σ ≥ min_step_std.
        trainable = trainable_steps(chain.stds, cfg.min_step_std)  # (K,) stochastic, σ ≥ min_step_std
        steps = select_steps(trainable, B, cfg.timestep_fraction, self.gen).to(device)  # (B, n)
        sample_time = time.perf_counter() - t0
        ref_mean = None  # with β > 0: the frozen base's Gaussian means at those rows, for the exact KL
        if self.ref is not None:
            n = steps.shape[1]
            b, k = torch.arange(B, device=device).repeat_interleave(n), steps.reshape(-1)  # (B·n,) chain, step
            ref_mean = self.process.predict(self.ref, chain.xs[k, b], chain.timesteps[k].to(device),
                                            labels[b])[0].view(B, n, *chain.xs.shape[2:])  # (B, n, C, H, W)
        return DiffusionRollout(chain, labels, rewards, adv, steps, ref_mean, sample_time)

    def step(self, rollout: DiffusionRollout | None = None) -> dict[str, float]:
        """One GRPO step: a rollout, then μ = ``num_iterations`` passes over its chains in ``num_minibatches``
        optimizer steps each; returns the step's metrics (reduced over the processes, if several) and records them
        in the history. ``rollout``: train on this one instead of sampling one (the tests hand each process its
        rows of a global rollout)."""
        cfg, G, t0 = self.cfg, self.cfg.num_generations, time.perf_counter()

        # 1. Rollout (DDPO's sampling phase, no gradient): G chains per prompt, every (x_t, x_{t−1}, t) and
        # log π_old recorded; each final image scored; one group advantage per chain; the steps to train on.
        ro = self.rollout() if rollout is None else rollout
        B, n = ro.steps.shape  # B chains, n of each chain's steps trained on

        # 2. μ passes over the batch, each a fresh shuffle of the chains cut into num_minibatches optimizer steps.
        # With μ = 1 and one minibatch the ratio is exactly 1: REINFORCE over the chain with the group baseline.
        stats, grad_norms = [], []
        for _ in range(cfg.num_iterations):
            perm = torch.randperm(B, generator=self.gen).to(ro.labels.device)  # (B,) chain indices
            for mb in perm.chunk(cfg.num_minibatches):  # (B / num_minibatches,) each
                # Per (chain, step) row −min(ρ·A, clip(ρ, 1 − ε, 1 + ε_high)·A) + β·KL(π_θ ‖ π_ref), ρ = π_θ/π_old
                # of the step, averaged over the minibatch's rows: grpo_step_loss, one forward pass.
                loss, st = self.compute_loss(ro, mb)
                # Several processes: each rank's loss is its share of the global minibatch's mean (one: × 1);
                # the ranks' gradients are summed, so the step is the one-process step of the global minibatch.
                local = mb.numel() * n  # (chain, step) rows of this rank
                loss_share = loss * (local / self.dist.sum(local))
                self.opt.zero_grad(set_to_none=True)
                loss_share.backward()
                self.dist.sum_gradients(self.model)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                grad_norms.append(float(grad_norm))  # before clipping
                self.opt.step()
                st["loss"] = loss.item()
                stats.append(st)
        self.step_count += 1

        # 3. Metrics, TRL's names where TRL logs the quantity: the rewards of every process; the loss statistics
        # (clip fractions, ratios, KL) each the mean over the step's minibatches.
        metrics, _ = reward_metrics(self.dist.gather(ro.rewards), G)  # reward, reward_std, frac_reward_zero_std
        metrics.update(grad_norm=float(np.mean(grad_norms)), sample_time=ro.sample_time,
                       step_time=time.perf_counter() - t0)
        metrics.update(mean_of(stats, STEP_STATS))
        metrics = self.dist.reduce_metrics(metrics)
        for key, v in metrics.items():
            self.history.setdefault(key, []).append(v)
        return metrics

    def compute_loss(self, rollout: DiffusionRollout, chains: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The GRPO loss of the minibatch ``chains`` (indices into the rollout) over its selected steps, and its
        statistics (a subclass changes the objective here: REINFORCE in ``minigrpo_course.experiments``)."""
        rm = None if rollout.ref_mean is None else rollout.ref_mean[chains].flatten(0, 1)
        loss, stats, _ = grpo_step_loss(self.process, self.model, rollout.chain, chains, rollout.steps[chains],
                                        rollout.advantages, self.cfg, rm)
        return loss, stats

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """This rank's group advantages ``[B]``, clipped to ±``adv_clip_max``; the rewards of every rank are gathered
        first, so ``scale_rewards="batch"`` divides by the global batch's std (the groups themselves are local)."""
        cfg = self.cfg
        everyone = self.dist.gather(rewards)
        adv = group_advantages(everyone, cfg.num_generations, cfg.scale_rewards)[self.dist.local(rewards.numel())]
        return adv.clamp(-cfg.adv_clip_max, cfg.adv_clip_max)

    def save_checkpoint(self, folder: str | Path | None = None) -> Path:
        """A resumable checkpoint (default: ``output_dir/checkpoint-<step>``): the weights (``save_pretrained``
        when the model has it), and the optimizer, every random state, the step and the history. Written whole or
        not at all: a crash mid-save leaves the folder's previous checkpoint as it was."""
        if folder is None and self.cfg.output_dir is None:
            raise ValueError("save_checkpoint() needs a folder, or DiffusionGRPOConfig.output_dir to put "
                             "checkpoint-<step> in")
        folder = Path(folder) if folder is not None else checkpoint_folder(self.cfg.output_dir, self.step_count)
        with atomic_folder(folder) as tmp:  # written beside, then renamed into place: never half a checkpoint
            save_weights(self.model, tmp, final_folder=folder)
            save_state(tmp, trainer_state(self), asdict(self.cfg))
        return folder

    def load_checkpoint(self, folder: str | Path) -> None:
        """Continue from a :meth:`save_checkpoint` folder: weights, optimizer, random states, step, history.
        Build the trainer as the first run did (same base model, so the reference model is the same). Under a
        launcher the checkpoint holds rank 0's generator: the other ranks reseed theirs (apart, reproducibly), else
        every rank would sample the same chains."""
        restore_trainer(self, folder)
        if self.dist.rank > 0:
            self.gen.manual_seed(self.dist.seed(self.cfg.seed + self.step_count))

    def train(self, progress: bool = True, callback: Callable[[int, dict], None] | None = None,
              resume_from_checkpoint: str | Path | bool | None = None) -> DiffusionGRPOResult:
        """Run up to ``max_steps`` GRPO steps with a tqdm bar (resuming first if asked, here or in the config);
        log and save when due; ``callback(step_index, metrics)`` after each (index from 0)."""
        cfg = self.cfg
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else cfg.resume_from_checkpoint
        folder = resolve_checkpoint(cfg, resume)
        if folder is not None:
            self.load_checkpoint(folder)
        bar = tqdm(range(self.step_count + 1, cfg.max_steps + 1), desc="GRPO (diffusion)",
                   disable=not progress or not self.dist.is_main,
                   initial=self.step_count, total=cfg.max_steps)
        with Tracker(cfg.report_to, cfg.logging_dir, "diffusion-grpo", asdict(cfg)) as tracker:
            for step in bar:
                m = self._record(step)
                if should_log(step, cfg.logging_steps, cfg.max_steps):
                    tracker.log(m, step, prefix="train/")
                due = cfg.output_dir is not None and should_save(step, cfg.save_steps, cfg.max_steps)
                if due and self.dist.is_main:  # only rank 0 writes
                    self.save_checkpoint()
                bar.set_postfix({k: f"{m[k]:.3f}" for k in ("reward", "clip_ratio/region_mean") if k in m})
                if callback is not None:
                    callback(step - 1, m)
        return DiffusionGRPOResult(self.model, self.history, asdict(self.cfg))

    def _record(self, step: int) -> dict[str, float]:
        """Take step number ``step`` (:meth:`step` keeps its metrics in the history); add the step number."""
        metrics = self.step()
        self.history.setdefault("step", []).append(step)
        return metrics


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
