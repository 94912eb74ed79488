"""Lesson 07's training runs: each planted bug of the teaching step as a short GRPO run, its symptom measured.

:func:`train_teaching_step` trains a copy of a model on two-digit addition with
:func:`~minigrpo_course.debugging.buggy_step.buggy_grpo_step` (the bugs of ``bugs`` on) and logs, per step, what a
dashboard would show: reward, share right, completion length (tokens incl. EOS), share finished (EOS emitted),
the ratio at the first and the last inner step, the clip fraction, and whether any weight is NaN.
:data:`SYMPTOMS` says which bug should show in which metric and how each is run; :func:`symptom_table` runs a bug
next to the correct step on the same seeds and prints both.

:class:`StaleSampler` is a sampler for the real trainer (``GRPOTrainer(sampler=...)``) whose weights lag the
trainer's by ``lag`` rollouts (an asynchronous generate-then-train stack); :func:`stale_runs` trains with the fresh
sampler, with the stale one, and with the stale one plus truncated importance sampling.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field

import numpy as np
import torch

from minigrpo_course.debugging.buggy_step import StepConfig, buggy_grpo_step, check_bugs, make_batch
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.sampling import generate
from minigrpo.llm.sft import SFTConfig, train_sft
from minigrpo.llm.tasks import AdditionTask, PrefixTask, Task
from minigrpo.llm.tokenizer import build_char_tokenizer


@dataclass
class RunConfig:
    """A short run of the teaching step (defaults: lesson 07's section 5)."""

    steps: int = 20  #: GRPO steps (each: a fresh batch, then num_iterations inner optimizer steps)
    prompts: int = 8  #: prompts per step
    group_size: int = 8  #: G
    num_iterations: int = 2  #: μ
    temperature: float = 0.7  #: sampling temperature (0.7: the sampled policy is right more often)
    learning_rate: float = 1e-3  #: Adam
    epsilon: float = 0.2  #: clip range
    seed: int = 0  #: the prompt stream and the sampling


@dataclass
class Symptom:
    """What a bug should do to a run, and how to run it so that it can."""

    metric: str  #: the history key where it shows
    claim: str  #: what the lesson says happens
    run: dict = field(default_factory=dict)  #: RunConfig fields changed for this bug (and for its correct twin)


#: bug → its symptom. Each is run next to the correct step with the same RunConfig and seeds.
SYMPTOMS: dict[str, Symptom] = {
    "eos_masked": Symptom("length", "EOS never gets a gradient: completions run longer, fewer finish"),
    "logprob_off_by_one": Symptom("reward", "the gradient is the wrong one: the reward does not improve"),
    "batch_norm_adv": Symptom("reward", "all-right and all-wrong groups get non-zero advantages: learning is slower"),
    "old_logp_after_step": Symptom("clip_frac", "at μ = 4 the ratio is 1 at every inner step: the clip never acts",
                                   {"num_iterations": 4}),
    "no_temperature_rescoring": Symptom("ratio_first", "sampled at T = 0.7, rescored at T = 1: ρ ≠ 1 from the "
                                        "first inner step, many tokens clipped"),
}


def prefix_setup(seed: int = 0, sft_steps: int = 100, hidden_size: int = 64):
    """``(model, tokenizer, task)``: a pad == eos character tokenizer and a tiny Llama briefly fine-tuned on
    :class:`~minigrpo.llm.tasks.PrefixTask` (copy a prefix of the digits, 2 to 8 of them, its length free): right
    often but not always, and stopping is a choice it makes at every digit — the setting where masking bugs show."""
    tok = build_char_tokenizer()
    tok.pad_token = tok.eos_token
    task = PrefixTask(eval_size=20)
    model = make_tiny_model(tok, "llama", seed=seed, hidden_size=hidden_size)
    train_sft(model, tok, task, SFTConfig(steps=sft_steps, batch_size=64, learning_rate=3e-3, seed=seed),
              progress=False)
    return model.eval(), tok, task


def train_teaching_step(model, tokenizer, bugs=(), cfg: RunConfig | None = None, task: Task | None = None
                        ) -> dict[str, np.ndarray]:
    """Train a copy of ``model`` with the teaching step and ``bugs`` on ``task`` (default: two-digit addition);
    returns the per-step history (arrays). Stops early when the weights become NaN (the step after that could not
    sample)."""
    cfg, bugs = cfg or RunConfig(), check_bugs(bugs)
    m = copy.deepcopy(model)
    device = next(m.parameters()).device
    task, rng = task or AdditionTask(eval_size=20), random.Random(cfg.seed)
    opt = torch.optim.Adam(m.parameters(), lr=cfg.learning_rate)
    step_cfg = StepConfig(num_iterations=cfg.num_iterations, epsilon=cfg.epsilon)
    keys = ("reward", "correct", "length", "finished", "flat_groups", "loss", "ratio_first", "ratio_last", "clip_frac",
            "nan")
    hist = {k: [] for k in keys}
    for step in range(cfg.steps):
        problems = [task.sample(rng) for _ in range(cfg.prompts)]
        b = make_batch(m, tokenizer, [p.prompt for p in problems], cfg.group_size, task.max_completion_length,
                       cfg.temperature, seed=1000 * cfg.seed + step)
        per_row = [problems[i // cfg.group_size] for i in range(len(b.rewards))]
        texts, fin = b.gen.texts(tokenizer), b.gen.finished.tolist()
        b.rewards = torch.tensor([task.reward(p, t, f) for p, t, f in zip(per_row, texts, fin)], device=device)
        rec = buggy_grpo_step(m, None, b, opt, step_cfg, bugs)
        mask = b.gen.completion_mask.bool()
        first, last = rec.ratio[0][mask], rec.ratio[-1][mask]
        adv = rec.advantages[-1].detach().unsqueeze(-1).expand_as(mask)[mask]
        clipped = ((last > 1 + cfg.epsilon) & (adv > 0)) | ((last < 1 - cfg.epsilon) & (adv < 0))
        values = (b.rewards.mean().item(),
                  float(np.mean([task.correctness_reward(p, t, f) for p, t, f in zip(per_row, texts, fin)])),
                  mask.sum(1).float().mean().item(), b.gen.finished.float().mean().item(),
                  (b.rewards.view(-1, cfg.group_size).std(1) == 0).float().mean().item(), rec.loss[0],
                  (first - 1).abs().max().item(), (last - 1).abs().max().item(), clipped.float().mean().item(),
                  float(any(torch.isnan(p).any().item() for p in m.parameters())))
        for k, v in zip(keys, values):
            hist[k].append(v)
        if hist["nan"][-1]:
            break
    return {k: np.asarray(v, dtype=float) for k, v in hist.items()}


def symptom_runs(model, tokenizer, task: Task, bugs=tuple(SYMPTOMS), seeds=(0, 1, 2),
                 base: RunConfig | None = None) -> dict[str, dict[str, list]]:
    """For each bug, ``{"correct": [history per seed], "buggy": [history per seed]}``, both run with the bug's
    :data:`SYMPTOMS` settings on the same seeds (the correct runs are shared between bugs with the same settings)."""
    base, cache, out = base or RunConfig(), {}, {}
    for bug in bugs:
        cfgs = [_with(base, seed=s, **SYMPTOMS[bug].run) for s in seeds]
        key = tuple(sorted(SYMPTOMS[bug].run.items()))
        if key not in cache:
            cache[key] = [train_teaching_step(model, tokenizer, (), c, task) for c in cfgs]
        out[bug] = {"correct": cache[key], "buggy": [train_teaching_step(model, tokenizer, (bug,), c, task)
                                                      for c in cfgs]}
    return out


def _with(cfg: RunConfig, **changes) -> RunConfig:
    return RunConfig(**{**cfg.__dict__, **changes})


def summarise_runs(histories: list[dict[str, np.ndarray]], metric: str, window: int = 5) -> tuple[float, float, float]:
    """``(first, last, spread)``: the metric's mean over the first and over the last ``window`` steps of each run,
    averaged over the runs, and the std across runs of the last-window mean."""
    first = [np.mean(h[metric][:window]) for h in histories]
    last = [np.mean(h[metric][-window:]) for h in histories]
    return float(np.mean(first)), float(np.mean(last)), float(np.std(last))


class StaleSampler:
    """A sampler whose weights lag the trainer's by ``lag`` rollouts (asynchronous generation): it keeps the last
    ``lag`` snapshots of the policy and samples with the oldest. The first ``lag`` rollouts use the newest
    snapshot there is (not stale yet)."""

    def __init__(self, lag: int = 1):
        if lag < 1:
            raise ValueError(f"StaleSampler.lag must be >= 1, got {lag}")
        self.lag, self.snapshots = lag, []

    def __call__(self, model, *args, **kwargs):
        self.snapshots.append(copy.deepcopy(model).eval())  # the trainer's weights now
        if len(self.snapshots) > self.lag + 1:
            self.snapshots.pop(0)
        return generate(self.snapshots[0], *args, **kwargs)


#: the arms of :func:`stale_runs`: (sampler lag, truncated IS on)
STALE_ARMS = {"fresh sampler": (0, False), "stale, no correction": (None, False), "stale + TIS": (None, True)}


def stale_runs(model, tokenizer, task: Task, seeds=(0, 1, 2), steps: int = 30, lag: int = 1,
               learning_rate: float = 3e-4, clip_max: float = 3.0) -> dict[str, list[dict[str, np.ndarray]]]:
    """GRPO on ``task`` with the trainer's own (fresh) sampler, with a :class:`StaleSampler` ``lag`` rollouts behind,
    and with that sampler plus truncated IS (``clip_max``): ``{arm: [history per seed]}`` (:data:`STALE_ARMS`),
    the real trainer's metrics."""
    out = {}
    for arm, (arm_lag, correction) in STALE_ARMS.items():
        out[arm] = []
        for seed in seeds:
            cfg = GRPOConfig(prompts_per_step=8, num_generations=8, eval_every=0, max_steps=steps, seed=seed,
                             learning_rate=learning_rate, vllm_importance_sampling_correction=correction,
                             vllm_importance_sampling_clip_max=clip_max)
            sampler = None if arm_lag == 0 else StaleSampler(lag)
            trainer = GRPOTrainer(copy.deepcopy(model), tokenizer, task, cfg, sampler=sampler)
            hist = trainer.train(progress=False).history
            out[arm].append({k: np.asarray(v, dtype=float) for k, v in hist.items()})
    return out


__all__ = ["RunConfig", "STALE_ARMS", "SYMPTOMS", "StaleSampler", "Symptom", "prefix_setup", "stale_runs",
           "summarise_runs", "symptom_runs", "train_teaching_step"]
