"""GRPO for a causal language model (Shao et al. 2024; DAPO, Yu et al. 2025; Dr. GRPO, Liu et al. 2025).

One step (:meth:`GRPOTrainer.step`), cut where TRL's GRPOTrainer cuts it:
1. :meth:`~GRPOTrainer.rollout`: draw ``prompts_per_step`` prompts, sample ``num_generations`` (G)
   completions for each (recording the sampler's log-probs) and score them with the task's rewards;
2. :meth:`~GRPOTrainer.prepare`: advantages ``group_advantages(rewards, G, scale_rewards)`` — each
   completion against its group, one scalar per completion broadcast over its tokens (outcome
   supervision) —, the batch's normalisers, and the old and reference log-probs when needed;
3. ``num_iterations`` (μ) optimizer steps on the same batch (:meth:`~GRPOTrainer.optimizer_step`),
   each over ``gradient_accumulation_steps`` micro-batches of :meth:`~GRPOTrainer.compute_loss`:
   ``losses.grpo_loss``, per token ``−min(ρ·A, clip(ρ, 1 − ε, 1 + ε_high)·A) + β·k(π_θ, π_ref)``
   with ρ = π_θ / π_old, reduced by ``loss_type``. With μ = 1 the batch is used once and
   ``old = current.detach()``: ρ = 1 exactly, and the gradient is the plain policy gradient with
   the group baseline.

Truncated importance sampling (``vllm_importance_sampling_correction``, off by default; lesson 07).
When the tokens come from a sampler whose log-probs differ from the trainer's (another engine, other
kernels, bf16, stale weights), the batch is *not* on-policy for the trainer, and treating it as if it
were biases the gradient. Each token's loss is then weighted by
``w = min(π_θold(trainer) / π_sampler, C)`` (detached; ``C = vllm_importance_sampling_clip_max``),
which re-weights the sampler's tokens toward the trainer's policy and caps the variance. It weights the
clipped surrogate only, not the KL term (as TRL's ``token_truncate`` mode does).

``loss_type`` decides how tokens are weighted (TRL's names; ``losses.aggregate`` implements them):
- ``"grpo"``: mean over each completion's tokens, then mean over completions (DeepSeekMath). A
  long completion's tokens weigh less: a length bias (long wrong answers are punished less).
- ``"dapo"``: one mean over all completion tokens of the batch (DAPO's token-level loss).
- ``"dr_grpo"``: sum over tokens divided by a constant, completions × ``max_completion_length``
  (Dr. GRPO): no dependence on lengths at all.
- ``"bnpo"``: the mean over the completion tokens of each micro-batch, divided by the number of
  micro-batches (TRL's): equal to ``"dapo"`` without gradient accumulation.
``"grpo"``, ``"dapo"`` and ``"dr_grpo"`` stay exact under gradient accumulation: their normalisers are
counted over the whole batch before any micro-batch is processed.

Several processes (``accelerate launch --num_processes N``, ``torchrun``; ``minigrpo.infra.distributed``): each rank samples
``prompts_per_step`` whole groups with its own seed; the rewards are gathered (advantages and reward metrics over the
global batch), the loss normalisers counted over every rank, the gradients summed: the step is the one-process step
of the global batch (N × ``prompts_per_step`` prompts; ``"bnpo"`` needs ``gradient_accumulation_steps = 1`` there).
Only rank 0 evaluates, logs and saves. In one process nothing changes.

Metrics (one value per step) carry TRL's names where TRL logs the quantity: ``reward``,
``reward_std``, ``frac_reward_zero_std``, ``completions/mean_length``, ``kl``, ``entropy``,
``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean``, ``grad_norm``,
``sampling/sampling_logp_difference/max`` and ``/mean`` (the sampler–trainer gap, see below) and
``sampling/importance_sampling_ratio/mean`` (``/min``, ``/max``); ours for the rest: ``correct``, ``format`` (the reward's parts), ``ratio_min``,
``ratio_mean``, ``ratio_max``, ``skipped``, ``step_time``.

Config names follow TRL's ``GRPOConfig`` where the concept is the same (num_generations, beta,
epsilon, epsilon_high, loss_type, scale_rewards, num_iterations, temperature,
max_completion_length, learning_rate, max_grad_norm, gradient_accumulation_steps, max_steps,
mask_truncated_completions, bf16, gradient_checkpointing).

On a pretrained model (Qwen, Llama) on a GPU, the same code path: everything runs on the model's device
(sampling with a generator there, rewards and advantages moved there); prompts may be conversations and
``use_chat_template`` / ``system_prompt`` format them (``sampling.encode_prompts``); completions end at any
end-of-turn id of the model's ``generation_config``; log-probs and entropy are taken chunk by chunk
(``losses.selective_log_softmax``: no ``[B, C, V]`` float32 tensor); ``gradient_checkpointing`` trades
compute for activation memory; ``bf16`` runs the forward passes under bf16 autocast, float32 master weights
(frozen weights — LoRA's base, the reference copy — stored in bf16, so the KL at step 0 is bf16 rounding rather
than exactly 0); ``GRPOTrainer(..., peft_config=LoraConfig(...))`` trains LoRA adapters, the
reference being the same model with the adapters off. ``sampling/sampling_logp_difference/mean`` is the mean
|log π_sampler − log π_trainer| over the completion tokens, taken from the loss pass of the first iteration
(no extra forward): the sampler (KV-cached decoding) and the trainer (one pass) compute the same policy with
other kernels, which in bf16 differ by far more than float32 rounding. Measured on an H100, a model of
Qwen2.5-0.5B's configuration (random weights), bf16, 16 prompts × G = 8, 256-token completions, gradient
checkpointing, 4 micro-batches: gap mean 4.5e-3, max 0.03 nats; 7.0 s per step, of which sampling 6.1 s
(~4.7k completion tokens/s); peak memory 14.2 GiB.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import TrainerState

from minigrpo.infra.atomic import atomic_folder
from minigrpo.infra.distributed import Distributed
from minigrpo.infra.checks import at_least, check_config_types, config_error, non_negative, one_of, positive
from minigrpo.advantages import SCALES, group_advantages
from minigrpo.llm.models import prepare_policy
from minigrpo.llm.sampling import Generation, check_context_length, generate, score_completions
from minigrpo.llm.sft import evaluate_task
from minigrpo.llm.tasks import Problem, Task
from minigrpo.grpo_common import frozen_reference, reference_policy, reward_metrics
from minigrpo.losses import LOSS_TYPES, grpo_loss, truncated_importance_weights
from minigrpo.infra.tracking import (Tracker, check_report_to, checkpoint_folder, resolve_checkpoint, restore_trainer,
                                     save_state, save_weights, should_log, should_save, trainer_state)
from minigrpo.utils import autocast_bf16, model_device

KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclass
class GRPOConfig:
    """GRPO's knobs. Names follow TRL's GRPOConfig where the concept is the same."""

    max_steps: int = 100  #: GRPO steps (each: sample a batch, then num_iterations optimizer steps)
    prompts_per_step: int = 16  #: distinct prompts per step
    num_generations: int = 8  #: G, completions per prompt (the group)
    temperature: float = 1.0  #: sampling temperature; log-probs are scored at the same temperature
    max_completion_length: int | None = None  #: tokens per completion (None: the task's default)
    learning_rate: float = 1e-3  #: AdamW step size
    beta: float = 0.0  #: weight of the KL(π_θ ‖ π_ref) penalty in the loss; 0 loads no reference model
    kl_estimator: str = "k3"  #: "k1", "k2" or "k3" (per-token estimator of the KL to the reference)
    epsilon: float = 0.2  #: lower clip range ε (ratio >= 1 − ε)
    epsilon_high: float | None = None  #: upper clip range (None: = epsilon); DAPO's clip-higher raises it
    loss_type: str = "dapo"  #: "grpo" (per-sequence mean), "dapo" (token mean), "dr_grpo" (constant), "bnpo"
    scale_rewards: str = "group"  #: "group", "batch" or "none" (see group_advantages)
    num_iterations: int = 1  #: μ, optimizer steps per sampled batch
    gradient_accumulation_steps: int = 1  #: micro-batches per optimizer step (same result, less memory)
    max_grad_norm: float = 1.0  #: global gradient-norm clip
    filter_zero_std_groups: bool = False  #: drop groups whose rewards are all equal (zero advantage)
    #: completions that hit max_completion_length without an end-of-turn token get no loss (TRL's option); they
    #: still count in their group's reward statistics and in the "grpo"/"dr_grpo" normalisers, as in TRL
    mask_truncated_completions: bool = False
    use_chat_template: bool = False  #: format plain-text prompts as one user message with the tokenizer's template
    system_prompt: str | None = None  #: a system message put before each prompt (needs the chat template)
    bf16: bool = False  #: forward passes under bf16 autocast (float32 master weights; frozen weights stored in bf16)
    gradient_checkpointing: bool = False  #: recompute activations in backward (HF's, non-reentrant): less memory
    #: truncated importance sampling: weight each token's surrogate by min(π_old(trainer) / π_sampler, C)
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_clip_max: float = 3.0  #: C, the cap on the sampler-to-trainer weight
    seed: int = 0  #: seeds the prompt stream and sampling
    eval_every: int = 25  #: evaluate on the held-out set every this many steps (0: never)
    eval_generations: int = 8  #: samples per held-out prompt for pass@1 / pass@G
    #: trackers to log to: "none", "tensorboard", "trackio", "wandb", or a list of them (see minigrpo.infra.tracking)
    report_to: str | list[str] = "none"
    logging_dir: str | Path | None = None  #: where the trackers write (None: runs/grpo-<timestamp>)
    logging_steps: int = 1  #: send the metrics to the trackers every this many steps (and at the last)
    #: save a resumable checkpoint (weights, optimizer, random states, history) to output_dir/checkpoint-<step>
    output_dir: str | Path | None = None
    save_steps: int = 0  #: every this many steps (0: only at the end), when output_dir is set
    #: resume from this checkpoint folder, or True: the latest one in output_dir
    resume_from_checkpoint: str | Path | bool | None = None
    checkpoint_dir: str | Path | None = None  #: older name of output_dir (kept as an alias)
    checkpoint_every: int = 0  #: older name of save_steps (kept as an alias)

    def __post_init__(self):
        check_config_types(self)
        one_of(self, "loss_type", LOSS_TYPES)
        one_of(self, "kl_estimator", KL_ESTIMATORS)
        one_of(self, "scale_rewards", SCALES)
        if self.num_generations < 2:
            raise config_error(self, "num_generations", ">= 2", "a group needs a spread")
        at_least(self, 1, "max_steps", "prompts_per_step", "max_completion_length", "num_iterations",
                 "gradient_accumulation_steps", "eval_generations")
        at_least(self, 0, "eval_every", "checkpoint_every", "save_steps")
        at_least(self, 1, "logging_steps")
        check_report_to(self)
        _alias_checkpoint_fields(self)
        if not self.temperature > 0:
            raise config_error(self, "temperature", "> 0", "GRPO needs a stochastic sampler (greedy decoding has "
                                                           "no spread within a group and no meaningful log-probs)")
        positive(self, "temperature", "epsilon", "epsilon_high")
        non_negative(self, "learning_rate", "beta")  # learning_rate = 0 freezes the weights (the tests use it)
        positive(self, "max_grad_norm", "vllm_importance_sampling_clip_max", finite=False)  # inf: no clip / no cap
        if (self.prompts_per_step * self.num_generations) % self.gradient_accumulation_steps:
            raise ValueError(f"GRPOConfig.gradient_accumulation_steps must divide prompts_per_step * num_generations "
                             f"= {self.prompts_per_step * self.num_generations} (equal micro-batches), "
                             f"got {self.gradient_accumulation_steps}")


def _alias_checkpoint_fields(cfg: GRPOConfig) -> None:
    """``checkpoint_dir`` / ``checkpoint_every`` are the older names of ``output_dir`` / ``save_steps``."""
    for old, new, unset in (("checkpoint_dir", "output_dir", None), ("checkpoint_every", "save_steps", 0)):
        value, current = getattr(cfg, old), getattr(cfg, new)
        if value == unset:
            continue
        if current != unset and str(current) != str(value):
            raise config_error(cfg, old, f"{new}'s value ({current!r}) when both are set", f"it is {new}'s older name")
        setattr(cfg, new, value)


def completion_logprobs(model, gen: Generation, rows: torch.Tensor | slice, temperature: float,
                        with_entropy: bool = False, shared_prefix: bool = True):
    """Log-probs ``[b, C]`` of the completion tokens of ``rows`` under ``model`` (each distinct prompt run once,
    see ``sampling.score_completions``), and optionally the per-token entropy of the temperature-scaled policy
    (no gradient). Chunked: no ``[b, C, V]`` float32 tensor is made."""
    return score_completions(model, gen.prompt_ids[rows], gen.prompt_mask[rows], gen.completion_ids[rows],
                             temperature, shared_prefix, with_entropy)


@dataclass
class GRPOBatch:
    """A scored rollout ready for the loss: what :meth:`GRPOTrainer.prepare` makes of :meth:`GRPOTrainer.rollout`."""

    gen: Generation
    advantages: torch.Tensor  #: [B] one per completion (all rows, filtered or not)
    micro_batches: list[torch.Tensor]  #: the kept rows (that get a loss), split for gradient accumulation
    num_sequences: int  #: completions of the kept groups (the normaliser of "grpo" and "dr_grpo")
    num_tokens: int  #: their completion tokens (the normaliser of "dapo")
    old_logp: torch.Tensor | None = None  #: [kept, C] π_old, stored only when μ > 1 (rows in micro-batch order)
    ref_logp: torch.Tensor | None = None  #: [kept, C] π_ref, only when β > 0
    metrics: dict[str, float] = field(default_factory=dict)  #: the rollout's statistics

    def slices(self):
        """``(rows, sl)`` per micro-batch: its rows of ``gen`` and its slice of ``old_logp`` / ``ref_logp``."""
        offset = 0
        for rows in self.micro_batches:
            yield rows, slice(offset, offset + rows.numel())
            offset += rows.numel()


@dataclass
class GRPOResult:
    model: torch.nn.Module
    history: dict[str, list] = field(default_factory=dict)
    evals: list[dict] = field(default_factory=list)  #: held-out metrics, with the step they were taken at
    config: dict = field(default_factory=dict)


class GRPOTrainer:
    """Holds the policy, the frozen reference (if β > 0), the optimizer and the prompt stream.

    :meth:`step` = :meth:`rollout` (generate + score) → :meth:`prepare` (advantages, old/ref log-probs) →
    μ × (:meth:`compute_loss` per micro-batch, backward) → :meth:`optimizer_step`. Each can be called alone.
    """

    def compute_loss(self, batch: GRPOBatch, rows: torch.Tensor, sl: slice) -> tuple[torch.Tensor, dict]:
        """The GRPO loss of one micro-batch (its share of the batch's loss) and its statistics."""
        cfg = self.cfg
        with self.autocast():
            logp, ent = completion_logprobs(self.model, batch.gen, rows, cfg.temperature, with_entropy=True,
                                            shared_prefix=not cfg.gradient_checkpointing)
        m = batch.gen.completion_mask[rows]
        old = logp.detach() if batch.old_logp is None else batch.old_logp[sl]
        ref = None if batch.ref_logp is None else batch.ref_logp[sl]
        is_w = None
        if cfg.vllm_importance_sampling_correction:  # old: the trainer's log-probs at the rollout's weights
            is_w, _ = truncated_importance_weights(old, batch.gen.sampler_logprobs[rows],
                                                   cfg.vllm_importance_sampling_clip_max)
        # across processes "bnpo" (gradient_accumulation_steps = 1) is the token mean of the global batch: "dapo"
        loss_type = "dapo" if self.dist.active and cfg.loss_type == "bnpo" else cfg.loss_type
        loss, stats = grpo_loss(logp, old, batch.advantages[rows], m, loss_type, cfg.epsilon, cfg.epsilon_high,
                                ref_logp=ref, beta=cfg.beta, kl_estimator=cfg.kl_estimator, importance_weights=is_w,
                                num_sequences=batch.num_sequences, num_tokens=batch.num_tokens,
                                max_completion_length=self.max_len,
                                gradient_accumulation_steps=cfg.gradient_accumulation_steps)
        with torch.no_grad():
            stats["entropy"] = ((ent * m).sum() / m.sum().clamp(min=1)).item()
            # the sampler-vs-trainer gap: same weights, two code paths (meaningful before the first update)
            gap = (logp.detach() - batch.gen.sampler_logprobs[rows]).abs() * m
            stats["sampling/sampling_logp_difference/max"] = gap.max().item()
            stats["gap_sum"], stats["gap_count"] = gap.sum().item(), m.sum().item()
            if is_w is not None:  # a tensor, concatenated over micro-batches by step_metrics()
                stats["is_weights"] = is_w[m.bool()]
        return loss, stats

    def __init__(self, model, tokenizer, task: Task, config: GRPOConfig | None = None, ref_model=None,
                 peft_config=None, sampler=None):
        """``peft_config`` (e.g. ``peft.LoraConfig``): train LoRA adapters; the reference is then the model with
        its adapters off (TRL's way). ``sampler``: what draws the completions (``minigrpo.llm.samplers.Sampler``;
        default ``sampling.generate``). The model stays on its device; everything follows it there."""
        self.cfg = cfg = config or GRPOConfig()
        self.model = prepare_policy(model, peft_config, cfg.gradient_checkpointing, cfg.bf16)
        self.dist = _distributed(cfg, self.model)  # one process: every collective is the identity
        self.tokenizer, self.task = tokenizer, task
        self.sample_completions = generate if sampler is None else sampler  # (lesson 07 plugs a stale sampler in)
        self.max_len = cfg.max_completion_length or task.max_completion_length
        check_context_length(self.model, 1, self.max_len)  # a one-token prompt must fit; generate checks the rest
        self.ref = frozen_reference(self.model, cfg.beta, ref_model, torch.bfloat16 if cfg.bf16 else None)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0, foreach=True)
        self.device = model_device(self.model)
        self.rng = random.Random(self.dist.seed(cfg.seed))  # rank 0: cfg.seed; the other ranks their own
        self.gen = torch.Generator(device=self.device).manual_seed(self.dist.seed(cfg.seed))  # on the model's device
        self.step_count = 0
        self.state = TrainerState(max_steps=cfg.max_steps)  #: TRL's trainer_state for reward functions
        self.history: dict[str, list] = {}  #: one entry per step, kept by train() (and saved in checkpoints)
        self.evals: list[dict] = []  #: held-out metrics with the step they were taken at

    def autocast(self):
        """The forward passes' context: bf16 autocast on the model's device when ``bf16``, else a no-op."""
        return autocast_bf16(self.device, self.cfg.bf16)

    # ------------------------------------------------------------------ one step
    def rollout(self) -> tuple[list[Problem], Generation, torch.Tensor, dict]:
        """Generate + score: ``(problems, generation, rewards [B], info)``, B = prompts_per_step × G. The task gets
        the texts, the finished flags, the sampled ids (up to and including the end-of-turn token) and the state."""
        cfg, G = self.cfg, self.cfg.num_generations
        problems = [self.task.sample(self.rng) for _ in range(cfg.prompts_per_step)]
        self.model.eval()  # no dropout while sampling (and scoring): one policy, one distribution
        with self.autocast():
            gen = self.sample_completions(self.model, self.tokenizer, [p.prompt for p in problems], G, self.max_len,
                               cfg.temperature, generator=self.gen, use_chat_template=cfg.use_chat_template,
                               system_prompt=cfg.system_prompt)
        per_row = [p for p in problems for _ in range(G)]
        ids = [row[:n] for row, n in zip(gen.completion_ids.tolist(), gen.completion_mask.sum(1).tolist())]
        self.state.global_step = self.step_count  # what TRL hands reward functions as trainer_state
        rewards, info = self.task.score(per_row, gen.texts(self.tokenizer), gen.finished.tolist(), ids, self.state)
        rewards = torch.tensor(rewards, dtype=torch.float32, device=gen.completion_ids.device)
        if not torch.isfinite(rewards).all():
            raise ValueError("a reward function returned NaN or inf")
        return problems, gen, rewards, info

    def kept_rows(self, gen: Generation, group_std: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``(rows that get a loss, num_sequences)``: every row, or with ``filter_zero_std_groups`` the rows of
        groups with a spread; ``mask_truncated_completions`` then drops the unfinished rows from the loss while
        ``num_sequences`` still counts them (TRL zeroes their mask: same loss, less work)."""
        cfg, G = self.cfg, self.cfg.num_generations
        keep = torch.ones(gen.finished.shape[0], dtype=torch.bool, device=gen.finished.device)
        if cfg.filter_zero_std_groups:
            keep = (group_std > 0).repeat_interleave(G)
        num_sequences = int(keep.sum())
        if cfg.mask_truncated_completions:
            keep = keep & gen.finished
        return torch.nonzero(keep).squeeze(-1), num_sequences

    @torch.no_grad()
    def prepare(self, problems: list[Problem], gen: Generation, rewards: torch.Tensor, info: dict) -> GRPOBatch:
        """Advantages, the kept rows (``filter_zero_std_groups``), normalisers, and π_old / π_ref when needed."""
        cfg, G = self.cfg, self.cfg.num_generations
        everyone = self.dist.gather(rewards)  # every rank's whole groups ("batch" scaling needs the global std)
        mine = self.dist.local(rewards.numel())
        adv = group_advantages(everyone, G, cfg.scale_rewards)[mine]
        metrics, group_std = reward_metrics(everyone, G)
        keep, num_sequences = self.kept_rows(gen, group_std[mine.start // G:mine.stop // G])
        metrics.update(info)
        metrics["completions/mean_length"] = gen.completion_mask.sum(1).float().mean().item()
        metrics["completions/clipped_ratio"] = 1.0 - gen.finished.float().mean().item()  # TRL's name: truncated share
        micro = [r for r in torch.tensor_split(keep, cfg.gradient_accumulation_steps) if r.numel()]
        num_tokens = self.dist.sum(int(gen.completion_mask[keep].sum()))  # the normalisers count every rank's rows
        batch = GRPOBatch(gen, adv, micro, self.dist.sum(num_sequences), num_tokens, metrics=metrics)
        if keep.numel() == 0:
            return batch
        shared = not cfg.gradient_checkpointing
        with self.autocast():
            if cfg.num_iterations > 1:  # the policy changes between iterations: store π_old now
                batch.old_logp = torch.cat([completion_logprobs(self.model, gen, r, cfg.temperature, shared_prefix=shared)
                                            for r in batch.micro_batches])
            if cfg.beta > 0:
                with reference_policy(self.model, self.ref) as ref:  # a frozen copy, or the adapters switched off
                    batch.ref_logp = torch.cat([completion_logprobs(ref, gen, r, cfg.temperature, shared_prefix=shared)
                                                for r in batch.micro_batches])
        return batch

    def optimizer_step(self) -> float:
        """Clip the global gradient norm, step AdamW; returns the norm before clipping."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm).item()
        self.opt.step()
        return grad_norm

    def step(self) -> dict[str, float]:
        """One GRPO step: rollout, then μ optimizer steps on it; returns the step's metrics."""
        t0 = time.perf_counter()
        return self.update(self.prepare(*self.rollout()), t0)

    def update(self, batch: GRPOBatch, t0: float | None = None) -> dict[str, float]:
        """μ optimizer steps on a prepared batch (its gradients summed over the processes, if several); returns the
        step's metrics, reduced over the processes. ``t0``: when the step began (for ``step_time``)."""
        cfg, t0 = self.cfg, time.perf_counter() if t0 is None else t0
        metrics = batch.metrics
        if not self.dist.sum(len(batch.micro_batches)):  # every group uninformative
            metrics.update(skipped=1.0, step_time=time.perf_counter() - t0)
            self.step_count += 1
            return self.dist.reduce_metrics(metrics)
        per_iteration = []
        self.model.train()
        for _ in range(cfg.num_iterations):
            self.opt.zero_grad()
            stats = []
            for rows, sl in batch.slices():
                loss, st = self.compute_loss(batch, rows, sl)
                loss.backward()
                stats.append(st)
            per_iteration.append(stats)
            self.dist.sum_gradients(self.model)  # each rank's loss is its share of the global one: sum them
            grad_norm = self.optimizer_step()
        self.model.eval()
        self.step_count += 1
        if batch.micro_batches:  # a rank whose rows were all filtered out has no loss statistics
            metrics.update(step_metrics(per_iteration, with_kl=batch.ref_logp is not None))
        metrics.update(grad_norm=grad_norm, skipped=0.0, step_time=time.perf_counter() - t0)
        return self.dist.reduce_metrics(metrics)

    # ------------------------------------------------------------------ the loop
    def evaluate(self) -> dict[str, float]:
        cfg = self.cfg
        return evaluate_task(self.model, self.tokenizer, self.task, num_generations=cfg.eval_generations,
                             temperature=cfg.temperature, seed=1, use_chat_template=cfg.use_chat_template,
                             system_prompt=cfg.system_prompt, bf16=cfg.bf16)

    def save(self, folder: str | Path) -> None:
        """The model, tokenizer and config (loadable with ``from_pretrained``); no trainer state. With LoRA the
        model part is the adapter folder (``PeftModel.from_pretrained(base_model, folder)`` loads it)."""
        with atomic_folder(folder) as tmp:  # written beside, then renamed into place: whole or not at all
            self._write_model(tmp)

    def _write_model(self, folder: Path) -> None:
        save_weights(self.model, folder)
        self.tokenizer.save_pretrained(folder)
        (folder / "grpo_config.json").write_text(json.dumps(asdict(self.cfg), indent=2, default=str))

    def save_checkpoint(self, folder: str | Path | None = None) -> Path:
        """A resumable checkpoint (default: ``output_dir/checkpoint-<step>``): :meth:`save`, plus the
        optimizer, every random state, the step and the history in ``trainer_state.pt``."""
        if folder is None and self.cfg.output_dir is None:
            raise ValueError("save_checkpoint() needs a folder, or GRPOConfig.output_dir to put checkpoint-<step> in")
        folder = Path(folder) if folder is not None else checkpoint_folder(self.cfg.output_dir, self.step_count)
        with atomic_folder(folder) as tmp:  # a crash mid-save leaves the previous checkpoint, never half of one
            self._write_model(tmp)
            save_state(tmp, trainer_state(self, evals=self.evals))
        return folder

    def load_checkpoint(self, folder: str | Path) -> None:
        """Continue from a :meth:`save_checkpoint` folder: weights, optimizer, random states, step, history.
        Build the trainer as the first run did (same base model, so the reference model is the same). Under a
        launcher the checkpoint holds rank 0's random states: the other ranks reseed theirs (apart, reproducibly)."""
        self.evals = restore_trainer(self, folder)["evals"]
        if self.dist.rank > 0:
            seed = self.dist.seed(self.cfg.seed + self.step_count)
            self.rng.seed(seed)
            self.gen.manual_seed(seed)

    def train(self, progress: bool = True, resume_from_checkpoint: str | Path | bool | None = None) -> GRPOResult:
        """Run up to ``max_steps`` steps (resuming first if asked, here or in the config); log, evaluate, save."""
        cfg = self.cfg
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else cfg.resume_from_checkpoint
        folder = resolve_checkpoint(cfg, resume)
        if folder is not None:
            self.load_checkpoint(folder)
        if cfg.eval_every and not self.evals and self.dist.is_main:
            self.evals.append({"step": 0, **self.evaluate()})
        bar = tqdm(range(self.step_count + 1, cfg.max_steps + 1), desc=f"GRPO {self.task.name}",
                   disable=not progress or not self.dist.is_main, initial=self.step_count, total=cfg.max_steps)
        with Tracker(cfg.report_to, cfg.logging_dir, "grpo", asdict(cfg)) as tracker:
            for step in bar:
                metrics = self.step()  # step_count becomes `step`
                self.history.setdefault("step", []).append(step)
                for k, v in metrics.items():
                    self.history.setdefault(k, []).append(v)
                if should_log(step, cfg.logging_steps, cfg.max_steps):
                    tracker.log(metrics, step, prefix="train/")
                bar.set_postfix(self._after_step(step, tracker))
        return GRPOResult(self.model, self.history, self.evals, asdict(cfg))

    def _after_step(self, step: int, tracker: Tracker) -> dict[str, str]:
        """Evaluate and save when due; returns the progress bar's postfix."""
        cfg = self.cfg
        post = {"reward": f"{self.history['reward'][-1]:.2f}"}
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.max_steps) and self.dist.is_main:
            ev = {"step": step, **self.evaluate()}
            self.evals.append(ev)
            tracker.log({k: v for k, v in ev.items() if k != "step"}, step, prefix="eval/")
            post["pass@1"] = f"{ev['pass@1']:.2f}"
        if cfg.output_dir is not None and should_save(step, cfg.save_steps, cfg.max_steps) and self.dist.is_main:
            self.save_checkpoint()
        return post


def _distributed(cfg: GRPOConfig, model: torch.nn.Module) -> Distributed:
    """The trainer's view of the other processes (``minigrpo.infra.distributed``); every rank starts from rank 0's weights."""
    d = Distributed()
    if d.active and cfg.loss_type == "bnpo" and cfg.gradient_accumulation_steps > 1:
        raise ValueError("GRPOConfig.loss_type='bnpo' normalises each micro-batch by its own tokens, which across "
                         "processes differs from one process: use 'dapo', or gradient_accumulation_steps=1")
    d.broadcast_parameters(model)
    return d


def step_metrics(per_iteration: list[list[dict]], with_kl: bool) -> dict[str, float]:
    """A step's loss statistics from ``per_iteration[i][j]``, the stats of micro-batch j at iteration i: the KL
    averaged over every micro-batch; the clip and ratio statistics and the entropy of the last iteration (after
    μ − 1 updates: where the clip acts); the sampler gap and importance weights of the first (before any update)."""
    first, last = per_iteration[0], per_iteration[-1]
    out = {"kl": float(np.mean([s["kl"] for it in per_iteration for s in it])) if with_kl else 0.0,
           "entropy": float(np.mean([s["entropy"] for s in last]))}
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        out[key] = float(np.mean([s[key] for s in last]))
    out.update(ratio_min=min(s["ratio_min"] for s in last), ratio_mean=float(np.mean([s["ratio_mean"] for s in last])),
               ratio_max=max(s["ratio_max"] for s in last))
    out["sampling/sampling_logp_difference/max"] = max(s["sampling/sampling_logp_difference/max"] for s in first)
    out["sampling/sampling_logp_difference/mean"] = sum(s["gap_sum"] for s in first) / max(
        sum(s["gap_count"] for s in first), 1)
    if "is_weights" in first[0]:
        w_all = torch.cat([s["is_weights"] for s in first])
        out.update({"sampling/importance_sampling_ratio/mean": w_all.mean().item(),
                    "sampling/importance_sampling_ratio/min": w_all.min().item(),
                    "sampling/importance_sampling_ratio/max": w_all.max().item()})
    return out


def train_grpo(model, tokenizer, task: Task, config: GRPOConfig | None = None, ref_model=None,
               progress: bool = True, peft_config=None) -> GRPOResult:
    """Fine-tune ``model`` in place with GRPO on ``task`` (its LoRA adapters with ``peft_config``: then
    ``result.model`` is the adapted model); returns the dashboard history and evals."""
    return GRPOTrainer(model, tokenizer, task, config, ref_model, peft_config).train(progress)


__all__ = ["GRPOBatch", "GRPOConfig", "GRPOResult", "GRPOTrainer", "LOSS_TYPES", "completion_logprobs",
           "step_metrics", "train_grpo"]
