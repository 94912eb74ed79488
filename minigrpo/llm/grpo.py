"""GRPO for a causal language model (Shao et al. 2024; DAPO, Yu et al. 2025; Dr. GRPO, Liu et al. 2025).

One step:
1. draw ``prompts_per_step`` prompts and sample ``num_generations`` (G) completions for each,
   recording the sampler's log-probs;
2. score every completion with the task's reward functions;
3. advantages: ``group_advantages(rewards, G, scale_rewards)`` — each completion against its
   group; one scalar per completion, broadcast over its tokens (outcome supervision);
4. ``num_iterations`` (μ) optimizer steps on the same batch, each minimising, per token,
   ``−min(ρ·A, clip(ρ, 1 − ε, 1 + ε_high)·A) + β·k3(π_θ, π_ref)`` with ρ = π_θ / π_old, aggregated
   by ``loss_type``. With μ = 1 the batch is used once and ``old = current.detach()``: ρ = 1
   exactly, and the gradient is the plain policy gradient with the group baseline.

Truncated importance sampling (``vllm_importance_sampling_correction``, off by default; lesson 07).
When the tokens come from a sampler whose log-probs differ from the trainer's (another engine, other
kernels, bf16, stale weights), the batch is *not* on-policy for the trainer, and treating it as if it
were biases the gradient. Each token's loss is then weighted by
``w = min(π_θold(trainer) / π_sampler, C)`` (detached; ``C = vllm_importance_sampling_clip_max``),
which re-weights the sampler's tokens toward the trainer's policy and caps the variance. It weights the
clipped surrogate only, not the KL term (as TRL's ``token_truncate`` mode does).

``loss_type`` decides how tokens are weighted (all kept exact under gradient accumulation, since the
normalisers are counted over the whole batch before any micro-batch is processed):
- ``"grpo"``: mean over each completion's tokens, then mean over completions (DeepSeekMath). A
  long completion's tokens weigh less: a length bias (long wrong answers are punished less).
- ``"dapo"``: one mean over all completion tokens of the batch (DAPO's token-level loss).
- ``"dr_grpo"``: sum over tokens divided by a constant, completions × ``max_completion_length``
  (Dr. GRPO): no dependence on lengths at all.

Config names follow TRL's ``GRPOConfig`` where the concept is the same (num_generations, beta,
epsilon, epsilon_high, loss_type, scale_rewards, num_iterations, temperature,
max_completion_length, learning_rate, max_grad_norm, gradient_accumulation_steps, max_steps).
"""

from __future__ import annotations

import copy
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo._checks import at_least, check_config_types, config_error, non_negative, one_of, positive
from minigrpo.advantages import SCALES, group_advantages
from minigrpo.llm.sampling import Generation, completion_logits, generate
from minigrpo.llm.sft import evaluate_task
from minigrpo.llm.tasks import Problem, Task
from minigrpo.losses import aligned_logprobs, clip_statistics, clipped_surrogate_terms, kl_estimate

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")
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
    loss_type: str = "dapo"  #: "grpo" (per-sequence mean), "dapo" (token mean), "dr_grpo" (constant)
    scale_rewards: str = "group"  #: "group", "batch" or "none" (see group_advantages)
    num_iterations: int = 1  #: μ, optimizer steps per sampled batch
    gradient_accumulation_steps: int = 1  #: micro-batches per optimizer step (same result, less memory)
    max_grad_norm: float = 1.0  #: global gradient-norm clip
    filter_zero_std_groups: bool = False  #: drop groups whose rewards are all equal (zero advantage)
    #: truncated importance sampling: weight each token's surrogate by min(π_old(trainer) / π_sampler, C)
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_clip_max: float = 3.0  #: C, the cap on the sampler-to-trainer weight
    seed: int = 0  #: seeds the prompt stream and sampling
    eval_every: int = 25  #: evaluate on the held-out set every this many steps (0: never)
    eval_generations: int = 8  #: samples per held-out prompt for pass@1 / pass@G
    checkpoint_dir: str | Path | None = None  #: save the model (save_pretrained) here every checkpoint_every steps
    checkpoint_every: int = 0  #: 0: only at the end (when checkpoint_dir is set)

    def __post_init__(self):
        check_config_types(self)
        one_of(self, "loss_type", LOSS_TYPES)
        one_of(self, "kl_estimator", KL_ESTIMATORS)
        one_of(self, "scale_rewards", SCALES)
        if self.num_generations < 2:
            raise config_error(self, "num_generations", ">= 2", "a group needs a spread")
        at_least(self, 1, "max_steps", "prompts_per_step", "max_completion_length", "num_iterations",
                 "gradient_accumulation_steps", "eval_generations")
        at_least(self, 0, "eval_every", "checkpoint_every")
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


def completion_logprobs(model, gen: Generation, rows: torch.Tensor | slice, temperature: float,
                        with_entropy: bool = False):
    """Log-probs ``[b, C]`` of the completion tokens of ``rows`` under ``model`` (each distinct prompt run once,
    see ``sampling.completion_logits``), and optionally the per-token entropy of the temperature-scaled policy."""
    completion = gen.completion_ids[rows]
    logits = completion_logits(model, gen.prompt_ids[rows], gen.prompt_mask[rows], completion)
    logp = aligned_logprobs(logits, completion, temperature)
    if not with_entropy:
        return logp
    with torch.no_grad():
        lp_all = torch.log_softmax(logits.float() / temperature, -1)
        entropy = -(lp_all.exp() * lp_all).sum(-1)
    return logp, entropy


def token_weights(mask: torch.Tensor, loss_type: str, num_sequences: int, num_tokens: int,
                  max_completion_length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-token weights whose sum over a micro-batch gives its share of the batch loss.

    Counting ``num_sequences``/``num_tokens`` over the *whole* batch keeps gradient accumulation
    exact: the micro-batch losses add up to the full-batch loss.
    """
    m = mask.to(dtype)
    if loss_type == "grpo":
        return m / m.sum(-1, keepdim=True).clamp(min=1) / num_sequences
    if loss_type == "dapo":
        return m / max(num_tokens, 1)
    return m / (num_sequences * max_completion_length)


@dataclass
class GRPOResult:
    model: torch.nn.Module
    history: dict[str, list] = field(default_factory=dict)
    evals: list[dict] = field(default_factory=list)  #: held-out metrics, with the step they were taken at
    config: dict = field(default_factory=dict)


class GRPOTrainer:
    """Holds the policy, the frozen reference (if β > 0), the optimizer and the prompt stream."""

    def __init__(self, model, tokenizer, task: Task, config: GRPOConfig | None = None, ref_model=None):
        self.cfg = cfg = config or GRPOConfig()
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.max_len = cfg.max_completion_length or task.max_completion_length
        self.ref = None
        if cfg.beta > 0:
            self.ref = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref.eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.0, foreach=True)
        self.rng = random.Random(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step_count = 0

    # ------------------------------------------------------------------ one step
    def rollout(self) -> tuple[list[Problem], Generation, torch.Tensor, dict]:
        cfg, G = self.cfg, self.cfg.num_generations
        problems = [self.task.sample(self.rng) for _ in range(cfg.prompts_per_step)]
        self.model.eval()  # no dropout while sampling (and scoring): one policy, one distribution
        gen = generate(self.model, self.tokenizer, [p.prompt for p in problems], G, self.max_len, cfg.temperature,
                       generator=self.gen)
        texts, fin = gen.texts(self.tokenizer), gen.finished.tolist()
        rows = [(problems[i // G], t, f) for i, (t, f) in enumerate(zip(texts, fin))]
        rewards = torch.tensor([self.task.reward(p, t, f) for p, t, f in rows], dtype=torch.float32)
        if not torch.isfinite(rewards).all():
            raise ValueError("a reward function returned NaN or inf")
        info = {
            "correct": float(np.mean([self.task.correctness_reward(p, t, f) for p, t, f in rows])),
            "format": float(np.mean([self.task.format_reward(p, t, f) for p, t, f in rows])),
        }
        return problems, gen, rewards, info

    def step(self) -> dict[str, float]:
        cfg, G = self.cfg, self.cfg.num_generations
        t0 = time.perf_counter()
        problems, gen, rewards, info = self.rollout()
        adv = group_advantages(rewards, G, cfg.scale_rewards)
        group_std = rewards.view(-1, G).std(1)
        keep = torch.arange(rewards.numel())
        if cfg.filter_zero_std_groups:
            keep = torch.nonzero((group_std > 0).repeat_interleave(G)).squeeze(-1)
        metrics = {"reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
                   "zero_std_frac": (group_std == 0).float().mean().item(), **info,
                   "completion_length": gen.completion_mask.sum(1).float().mean().item()}
        if keep.numel() == 0:  # every group was uninformative: nothing to learn from this batch
            metrics.update(skipped=1.0, step_time=time.perf_counter() - t0)
            self.step_count += 1
            return metrics
        mask = gen.completion_mask[keep]
        n_seq, n_tok = keep.numel(), int(mask.sum())
        micro = torch.tensor_split(keep, cfg.gradient_accumulation_steps)

        old_logp = ref_logp = None
        with torch.no_grad():
            if cfg.num_iterations > 1:  # the policy changes between iterations: store π_old now
                old_logp = torch.cat([completion_logprobs(self.model, gen, r, cfg.temperature) for r in micro])
            if self.ref is not None:
                ref_logp = torch.cat([completion_logprobs(self.ref, gen, r, cfg.temperature) for r in micro])
        eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
        stats, kls, ents, gap = [], [], [], 0.0
        is_w, is_gap = [], []  # truncated-IS weights and |trainer − sampler| log-prob gaps (when enabled)
        self.model.train()
        for it in range(cfg.num_iterations):
            self.opt.zero_grad()
            offset = 0
            for rows in micro:
                b = rows.numel()
                sl = slice(offset, offset + b)
                offset += b
                logp, ent = completion_logprobs(self.model, gen, rows, cfg.temperature, with_entropy=True)
                m = gen.completion_mask[rows]
                old = logp.detach() if old_logp is None else old_logp[sl]
                a = adv[rows].unsqueeze(-1).expand_as(logp)
                per_tok, ratio = clipped_surrogate_terms(logp, old, a, cfg.epsilon, eps_high)
                if cfg.vllm_importance_sampling_correction:  # old: the trainer's log-probs at the rollout's weights
                    log_w = old.detach() - gen.sampler_logprobs[rows]
                    w_is = torch.exp(log_w).clamp(max=cfg.vllm_importance_sampling_clip_max)
                    per_tok = per_tok * w_is
                    if it == 0:
                        is_w.append(w_is[m.bool()])
                        is_gap.append(log_w[m.bool()].abs())
                if ref_logp is not None:
                    kl = kl_estimate(logp, ref_logp[sl], cfg.kl_estimator)
                    per_tok = per_tok + cfg.beta * kl
                    kls.append(((kl.detach() * m).sum() / m.sum().clamp(min=1)).item())
                w = token_weights(m, cfg.loss_type, n_seq, n_tok, self.max_len, per_tok.dtype)
                (per_tok * w).sum().backward()
                if it == cfg.num_iterations - 1:
                    stats.append(clip_statistics(ratio, a, cfg.epsilon, eps_high, m))
                    ents.append(((ent * m).sum() / m.sum().clamp(min=1)).item())
                if it == 0:  # the sampler-vs-trainer gap: same weights, two code paths
                    d = ((logp.detach() - gen.sampler_logprobs[rows]).abs() * m).max().item()
                    gap = max(gap, d)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm).item()
            self.opt.step()
        self.model.eval()
        self.step_count += 1
        metrics.update({
            "kl": float(np.mean(kls)) if kls else 0.0,
            "entropy": float(np.mean(ents)),
            "clip_frac_low": float(np.mean([s["clip_frac_low"] for s in stats])),
            "clip_frac_high": float(np.mean([s["clip_frac_high"] for s in stats])),
            "ratio_min": min(s["ratio_min"] for s in stats),
            "ratio_mean": float(np.mean([s["ratio_mean"] for s in stats])),
            "ratio_max": max(s["ratio_max"] for s in stats),
            "sampler_trainer_gap": gap,
            "grad_norm": grad_norm,
            "skipped": 0.0,
            "step_time": time.perf_counter() - t0,
        })
        if is_w:
            w_all, gap_all = torch.cat(is_w), torch.cat(is_gap)
            metrics.update({"is_weight_mean": w_all.mean().item(), "is_weight_min": w_all.min().item(),
                            "is_weight_max": w_all.max().item(), "sampler_trainer_gap_mean": gap_all.mean().item()})
        return metrics

    # ------------------------------------------------------------------ the loop
    def evaluate(self) -> dict[str, float]:
        return evaluate_task(self.model, self.tokenizer, self.task, num_generations=self.cfg.eval_generations,
                             temperature=self.cfg.temperature, seed=1)

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        (folder / "grpo_config.json").write_text(json.dumps(asdict(self.cfg), indent=2))

    def train(self, progress: bool = True) -> GRPOResult:
        cfg = self.cfg
        result = GRPOResult(self.model, {}, [], asdict(cfg))
        if cfg.eval_every:
            result.evals.append({"step": 0, **self.evaluate()})
        bar = tqdm(range(1, cfg.max_steps + 1), desc=f"GRPO {self.task.name}", disable=not progress)
        for step in bar:
            metrics = self.step()
            result.history.setdefault("step", []).append(step)
            for k, v in metrics.items():
                result.history.setdefault(k, []).append(v)
            post = {"reward": f"{metrics['reward_mean']:.2f}"}
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.max_steps):
                ev = {"step": step, **self.evaluate()}
                result.evals.append(ev)
                post["pass@1"] = f"{ev['pass@1']:.2f}"
            if cfg.checkpoint_dir and ((cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
                                       or step == cfg.max_steps):
                self.save(Path(cfg.checkpoint_dir) / f"step_{step}")
            bar.set_postfix(post)
        return result


def train_grpo(model, tokenizer, task: Task, config: GRPOConfig | None = None, ref_model=None,
               progress: bool = True) -> GRPOResult:
    """Fine-tune ``model`` in place with GRPO on ``task``; returns the dashboard history and evals."""
    return GRPOTrainer(model, tokenizer, task, config, ref_model).train(progress)


__all__ = ["GRPOConfig", "GRPOResult", "GRPOTrainer", "LOSS_TYPES", "completion_logprobs", "token_weights",
           "train_grpo"]
