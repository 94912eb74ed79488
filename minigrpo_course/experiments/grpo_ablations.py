"""Lesson 06's ablations of the GRPO trainer: the knobs its main run leaves at their defaults.

- :func:`temperature_mismatch`: one trainer step with a sampler that draws at one temperature while the trainer
  scores at another. The trainer rescores π_old itself, at *its* temperature, so the ratio π_θ / π_old stays 1;
  what moves is the sampler–trainer gap (and the importance weights that would correct it).
- :func:`knob_runs`: short GRPO runs from one reference model, one changed knob each (μ > 1, clip-higher ε_high,
  β > 0), so the dashboard panels that μ = 1, β = 0 leave flat (clip fractions, ratio range, KL) have something
  to show.
- :func:`correct_counts` and :func:`pass_at_k`: the unbiased pass@k estimate of section 10 (GRPO vs best-of-N).
- :func:`length_study`: how ``loss_type`` (``"grpo"``, ``"dapo"``, ``"dr_grpo"``) moves completion lengths on a
  task whose answer length is the policy's free choice (``tasks.PrefixTask``), over several seeds;
  :func:`length_table` prints it.

Every run trains a copy of the model it is given; the caller's model never changes.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import replace

import numpy as np
import torch

from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.sampling import generate
from minigrpo.llm.sft import SFTConfig, train_sft
from minigrpo.llm.tasks import PrefixTask, Task
from minigrpo.llm.tokenizer import build_char_tokenizer


def quiet_libraries() -> None:
    """Silence library chatter in a lesson's output: Python warnings, transformers' logging and progress bars."""
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@torch.no_grad()
def correct_counts(model, tokenizer, task: Task, problems, n: int, seed: int = 7, chunk: int = 50) -> np.ndarray:
    """``[len(problems)]``: how many of ``n`` completions sampled at temperature 1 are right, per problem
    (prompts in chunks of ``chunk``, one generator seeded with ``seed`` for all of them)."""
    gen = torch.Generator().manual_seed(seed)
    counts = []
    for i in range(0, len(problems), chunk):
        part = problems[i:i + chunk]
        g = generate(model, tokenizer, [p.prompt for p in part], n, task.max_completion_length, 1.0, generator=gen)
        ok = [task.correctness_reward(part[j // n], t, f)
              for j, (t, f) in enumerate(zip(g.texts(tokenizer), g.finished.tolist()))]
        counts += np.array(ok).reshape(len(part), n).sum(1).tolist()
    return np.array(counts)


def pass_at_k(counts, n: int, k: int) -> float:
    """The unbiased pass@k estimate (Chen et al. 2021), averaged over problems: ``1 − C(n − c, k) / C(n, k)`` for a
    problem with ``c`` right completions out of ``n`` (``k ≤ n``)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n] = [1, {n}], got {k}")
    return float(np.mean([1.0 - math.comb(n - int(c), k) / math.comb(n, k) for c in counts]))


def at_temperature(temperature: float):
    """A sampler (``GRPOTrainer(sampler=...)``) that draws at ``temperature`` whatever the trainer asks for, and
    records log-probs at that temperature: an engine configured apart from the trainer."""
    def sample(model, tokenizer, prompts, num_generations, max_new_tokens, _trainer_temperature, **kwargs):
        return generate(model, tokenizer, prompts, num_generations, max_new_tokens, temperature, **kwargs)
    return sample


def temperature_mismatch(model, tokenizer, task: Task, pairs=((1.0, 1.0), (0.7, 0.7), (0.7, 1.0)),
                         config: GRPOConfig | None = None) -> list[dict[str, float]]:
    """One GRPO step (on a copy of ``model``) per ``(sampler temperature, trainer temperature)`` pair; returns each
    step's ratio range, sampler–trainer gap and the truncated-IS weights that would correct the gap."""
    cfg = config or GRPOConfig(prompts_per_step=8, num_generations=8, max_steps=1, eval_every=0)
    rows = []
    for t_sample, t_train in pairs:
        c = replace(cfg, temperature=t_train, vllm_importance_sampling_correction=True)
        m = GRPOTrainer(copy.deepcopy(model), tokenizer, task, c, sampler=at_temperature(t_sample)).step()
        rows.append({"sampler_T": t_sample, "trainer_T": t_train, "ratio_min": m["ratio_min"],
                     "ratio_max": m["ratio_max"], "gap_mean": m["sampling/sampling_logp_difference/mean"],
                     "gap_max": m["sampling/sampling_logp_difference/max"],
                     "is_min": m["sampling/importance_sampling_ratio/min"],
                     "is_mean": m["sampling/importance_sampling_ratio/mean"],
                     "is_max": m["sampling/importance_sampling_ratio/max"]})
    return rows


def run_grpo(model, tokenizer, task: Task, config: GRPOConfig) -> dict[str, np.ndarray]:
    """Train a copy of ``model`` with ``config`` (no progress bar, no evaluation); the history as arrays."""
    trainer = GRPOTrainer(copy.deepcopy(model), tokenizer, task, replace(config, eval_every=0))
    return {k: np.asarray(v, dtype=float) for k, v in trainer.train(progress=False).history.items()}


def knob_runs(model, tokenizer, task: Task, base: GRPOConfig, variants: dict[str, dict]) -> dict[str, dict]:
    """One short run per variant: ``base`` with the variant's fields changed (e.g. ``{"num_iterations": 4}``)."""
    return {name: run_grpo(model, tokenizer, task, replace(base, **changes)) for name, changes in variants.items()}


class LengthByCorrectness(Task):
    """A task that scores as ``task`` does and also logs the mean length (tokens incl. EOS) of the right and of the
    wrong completions of each batch (``length/correct``, ``length/wrong``; NaN when a batch has none)."""

    def __init__(self, task: Task):  # no eval set of its own: everything is delegated
        self.task, self.name = task, task.name
        self.max_completion_length, self.eval_set = task.max_completion_length, task.eval_set

    def sample(self, rng):
        return self.task.sample(rng)

    def correctness_reward(self, problem, completion, finished=True):
        return self.task.correctness_reward(problem, completion, finished)

    def score(self, problems, completions, finished, completion_ids=None, trainer_state=None):
        rewards, metrics = self.task.score(problems, completions, finished, completion_ids, trainer_state)
        right = np.array([self.task.correctness_reward(p, c, f) for p, c, f in zip(problems, completions, finished)])
        lengths = np.array([len(ids) for ids in completion_ids], dtype=float)
        metrics["length/correct"] = float(lengths[right > 0].mean()) if (right > 0).any() else float("nan")
        metrics["length/wrong"] = float(lengths[right == 0].mean()) if (right == 0).any() else float("nan")
        return rewards, metrics


def prefix_reference(seed: int = 0, sft_steps: int = 100, hidden_size: int = 64, min_len: int = 2, max_len: int = 8):
    """``(model, tokenizer, task)``: a tiny Llama briefly fine-tuned on :class:`~minigrpo.llm.tasks.PrefixTask`
    (answers of ``min_len``..``max_len`` digits, lengths drawn uniformly by the teacher). Stopped early: right
    most of the time, and the later digits of a long answer are the likeliest to be wrong."""
    tok, task = build_char_tokenizer(), PrefixTask(min_len=min_len, max_len=max_len, eval_size=50)
    model = make_tiny_model(tok, "llama", seed=seed, hidden_size=hidden_size, num_layers=2, num_heads=4,
                            num_kv_heads=2)
    train_sft(model, tok, task, SFTConfig(steps=sft_steps, batch_size=64, learning_rate=3e-3, seed=seed),
              progress=False)
    return model.eval(), tok, task


def length_study(model, tokenizer, task: Task, base: GRPOConfig, loss_types=("grpo", "dapo", "dr_grpo"),
                 seeds=(0, 1, 2), window: int = 5) -> list[dict[str, float]]:
    """For each ``loss_type`` and seed, a GRPO run from ``model``; returns one row per run: the mean completion
    length, the lengths of right and of wrong completions and the share right, over the first and the last
    ``window`` steps."""
    tracked = LengthByCorrectness(task)
    rows = []
    for loss_type in loss_types:
        for seed in seeds:
            h = run_grpo(model, tokenizer, tracked, replace(base, loss_type=loss_type, seed=seed))
            w = min(window, len(h["step"]))
            row = {"loss_type": loss_type, "seed": seed}
            for key, name in (("completions/mean_length", "length"), ("length/correct", "length_right"),
                              ("length/wrong", "length_wrong"), ("correct", "correct")):
                row[f"{name}_start"] = float(np.nanmean(h[key][:w])) if np.isfinite(h[key][:w]).any() else np.nan
                row[f"{name}_end"] = float(np.nanmean(h[key][-w:])) if np.isfinite(h[key][-w:]).any() else np.nan
            rows.append(row)
    return rows


def length_table(rows: list[dict[str, float]]) -> str:
    """One line per loss type: each quantity's mean over the seeds (± the spread across seeds, one std)."""
    cols = ["length_start", "length_end", "length_right_end", "length_wrong_end", "correct_end"]
    head = f"{'loss_type':10s} {'seeds':>5s} " + " ".join(f"{c:>18s}" for c in cols)
    lines = [head]
    for lt in dict.fromkeys(r["loss_type"] for r in rows):
        mine = [r for r in rows if r["loss_type"] == lt]
        cells = []
        for c in cols:
            v = np.array([r[c] for r in mine], dtype=float)
            cells.append(f"{np.nanmean(v):9.2f} ± {np.nanstd(v):5.2f}  " if np.isfinite(v).any() else f"{'—':>18s}")
        lines.append(f"{lt:10s} {len(mine):5d} " + " ".join(cells))
    return "\n".join(lines)


__all__ = ["LengthByCorrectness", "at_temperature", "correct_counts", "knob_runs", "length_study", "length_table",
           "pass_at_k", "prefix_reference", "quiet_libraries", "run_grpo", "temperature_mismatch"]
