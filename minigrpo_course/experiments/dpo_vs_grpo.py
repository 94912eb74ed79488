"""Lesson 06's DPO section: DPO from preference pairs vs GRPO from a verifier, from the same start, same budget.

The pairs are built from the task's reward, as a preference dataset would be labelled: for each prompt, G completions
are sampled from the *reference* (the SFT model), and the highest-reward one is "chosen", the lowest-reward one
"rejected" (groups whose rewards are all equal give no pair). Sampling follows GRPO's own step for step: the same
prompts per step, the same G, the same temperature, the same number of steps — so both methods see the same number
of samples and take the same number of optimizer steps at the same learning rate. The difference is the one that
matters: DPO's samples all come from the frozen reference before training (offline), GRPO's from the current policy
(online), and DPO sees only the pair's order, not the rewards.
"""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import numpy as np
import torch

from minigrpo.llm.dpo import PairBatch, train_dpo
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.sampling import generate
from minigrpo.llm.sft import evaluate_task
from minigrpo.llm.tasks import Problem, Task


@torch.no_grad()
def preference_pairs(model, tokenizer, task: Task, steps: int, prompts_per_step: int, num_generations: int,
                     temperature: float = 1.0, seed: int = 0) -> list[PairBatch]:
    """``steps`` batches of pairs sampled from ``model``: per prompt, the best vs the worst of G samples by the
    task's reward (ties broken by the first sample), or no pair when all G rewards are equal."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    model.eval()
    batches = []
    for _ in range(steps):
        problems: list[Problem] = [task.sample(rng) for _ in range(prompts_per_step)]
        g = generate(model, tokenizer, [p.prompt for p in problems], num_generations, task.max_completion_length,
                     temperature, generator=gen)
        rewards = torch.tensor([task.reward(problems[i // num_generations], t, f) for i, (t, f) in
                                enumerate(zip(g.texts(tokenizer), g.finished.tolist()))]).view(-1, num_generations)
        keep = (rewards.max(1).values > rewards.min(1).values).nonzero().squeeze(-1)
        base = keep * num_generations
        best, worst = base + rewards[keep].argmax(1), base + rewards[keep].argmin(1)
        batches.append(PairBatch(g.prompt_ids[best], g.prompt_mask[best], g.completion_ids[best],
                                 g.completion_ids[worst], rewards.flatten()[best], rewards.flatten()[worst]))
    return batches


def held_out_reward(model, tokenizer, task: Task, problems, num_generations: int = 8, seed: int = 0) -> dict:
    """``evaluate_task``'s metrics plus the mean reward, ``pass@1 + 0.1 · format`` (the task's reward, per sample)."""
    m = evaluate_task(model, tokenizer, task, problems, num_generations=num_generations, seed=seed)
    return {**m, "reward": m["pass@1"] + 0.1 * m["format"]}


def dpo_vs_grpo(ref_model, tokenizer, task: Task, config: GRPOConfig, seeds=(0, 1, 2), dpo_variants=None,
                eval_problems=None) -> dict:
    """Per seed, GRPO (``config``) and one DPO run per variant (``{name: {"beta": ..., "learning_rate": ...}}``;
    default β = 0.1 at ``config``'s learning rate), all from copies of ``ref_model``, on pairs sampled from
    ``ref_model`` with ``config``'s prompts per step, G, temperature and steps; held-out metrics of each.
    Returns ``{"rows": [...], "dpo_history": {(name, seed): history}, "pairs": {seed: n}}``."""
    variants = dpo_variants or {"DPO": {"beta": 0.1, "learning_rate": config.learning_rate}}
    rows, dpo_hist, n_pairs = [], {}, {}
    for seed in seeds:
        cfg = replace(config, seed=seed, eval_every=0)
        grpo_model = copy.deepcopy(ref_model)
        GRPOTrainer(grpo_model, tokenizer, task, cfg).train(progress=False)
        rows.append({"method": "GRPO", "seed": seed, **held_out_reward(grpo_model, tokenizer, task, eval_problems)})
        batches = preference_pairs(ref_model, tokenizer, task, cfg.max_steps, cfg.prompts_per_step,
                                   cfg.num_generations, cfg.temperature, seed=seed)
        n_pairs[seed] = sum(b.chosen_ids.shape[0] for b in batches)
        for name, v in variants.items():
            dpo_model = copy.deepcopy(ref_model)
            dpo_hist[name, seed] = train_dpo(dpo_model, ref_model, tokenizer, batches, v["beta"], v["learning_rate"],
                                             cfg.max_grad_norm)
            rows.append({"method": name, "seed": seed, **held_out_reward(dpo_model, tokenizer, task, eval_problems)})
    return {"rows": rows, "dpo_history": dpo_hist, "pairs": n_pairs}


def mean_history(result: dict, name: str, key: str) -> np.ndarray:
    """The mean over seeds of one DPO variant's per-step ``key`` (cut to the shortest run)."""
    runs = [h[key] for (n, _), h in result["dpo_history"].items() if n == name]
    n = min(len(r) for r in runs)
    return np.mean([r[:n] for r in runs], axis=0)


def comparison_table(rows: list[dict], start: dict | None = None, cols=("reward", "pass@1", "pass@8", "format")) -> str:
    """Per method, each metric's value per seed and its mean; ``start``: the reference's metrics, as a first line."""
    seeds = sorted({r["seed"] for r in rows})
    w = max([len(r["method"]) for r in rows] + [9]) + 2
    lines = [f"{'model':{w}s}" + "".join(f"{c:>10s}" for c in cols) + "   per seed: " + cols[0]]
    if start is not None:
        lines.append(f"{'reference':{w}s}" + "".join(f"{start[c]:10.3f}" for c in cols))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = {r["seed"]: r for r in rows if r["method"] == method}
        means = [np.mean([mine[s][c] for s in seeds]) for c in cols]
        per_seed = " / ".join(f"{mine[s][cols[0]]:.3f}" for s in seeds)
        lines.append(f"{method:{w}s}" + "".join(f"{m:10.3f}" for m in means) + f"   {per_seed}")
    return "\n".join(lines)


__all__ = ["PairBatch", "comparison_table", "dpo_vs_grpo", "held_out_reward", "mean_history", "preference_pairs",
           "train_dpo"]
