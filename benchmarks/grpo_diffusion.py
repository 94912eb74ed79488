"""GRPO on the digits diffusion model vs best-of-4 sampling of the base model, over 3 seeds.

For each seed s: load lesson 08's base model trained with seed s (``pretrained_base(seed=s)``, cached;
trained in about a minute if missing), measure the prompt-alignment
reward (the digit classifier's probability of the prompt's class, at temperature 4) of fresh base
samples and the base model's best-of-4 (per prompt, the best of 4 samples), run GRPO, and measure
fresh samples of the fine-tuned model. Every evaluation uses the policy's own sampler (DDIM, η = 1).

    .venv/bin/python benchmarks/grpo_diffusion.py [--seeds 0 1 2] [--steps N]

Target: GRPO's single sample beats the base model's best-of-4 on every seed, in ≤ 15 minutes on
2 CPU cores (the base model and classifier are cached after the first run).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from minigrpo.diffusion.ddpm import pretrained_base
from minigrpo.diffusion.grpo import (DIGITS_RECIPE, DIGITS_REWARD, DiffusionGRPOConfig, DiffusionGRPOTrainer, best_of_n,
                                     make_process, sample_rewards)
from minigrpo.diffusion.rewards import ClassifierReward, digits_classifier
from minigrpo.utils import seed_everything

BENCH_CONFIG = DIGITS_RECIPE  #: the settings the benchmark (and lesson 09's full mode) use
EVAL_PER_CLASS = 16  #: evaluation prompts per digit (160 in all)


def evaluate(model, process, reward, seed: int, n: int = 1) -> torch.Tensor:
    """Rewards of n fresh samples for each of the evaluation prompts, ``[num_prompts * n]``."""
    labels = torch.arange(10).repeat(EVAL_PER_CLASS).repeat_interleave(n)
    return sample_rewards(model, process, reward, labels, seed=seed)[1]


def run_seed(seed: int, steps: int | None = None, progress: bool = True) -> dict:
    t0 = time.perf_counter()
    seed_everything(seed)
    unet, scheduler = pretrained_base(seed=seed, progress=progress)
    classifier, acc = digits_classifier()
    reward = ClassifierReward(classifier, **DIGITS_REWARD)
    cfg = DiffusionGRPOConfig(**{**BENCH_CONFIG, **({"max_steps": steps} if steps else {})}, seed=seed)
    process = make_process(scheduler, cfg)
    eval_seed = 10_000 + seed
    base = evaluate(unet, process, reward, eval_seed).mean().item()
    bo4 = best_of_n(evaluate(unet, process, reward, eval_seed + 1, n=4), 4).mean().item()
    model = copy.deepcopy(unet)
    t1 = time.perf_counter()
    result = DiffusionGRPOTrainer(model, scheduler, reward, cfg).train(progress=progress)
    train_s = time.perf_counter() - t1
    after = evaluate(result.model, process, reward, eval_seed + 2).mean().item()
    return {"seed": seed, "classifier_acc": acc, "base": base, "base_best_of_4": bo4, "grpo": after,
            "train_s": train_s, "total_s": time.perf_counter() - t0,
            "curve": result.history["reward"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: BENCH_CONFIG)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = [run_seed(s, args.steps, progress=not args.quiet) for s in args.seeds]
    total = time.perf_counter() - start
    print(f"\nGRPO on digits: {BENCH_CONFIG}")
    print(f"reward = classifier p(prompt | image) at temperature {DIGITS_REWARD['temperature']:g} "
          f"(classifier held-out accuracy {rows[0]['classifier_acc']:.3f}); "
          f"{10 * EVAL_PER_CLASS} evaluation prompts, DDIM {BENCH_CONFIG['num_inference_steps']} steps, η = 1\n")
    print("| seed | base mean | base best-of-4 | GRPO mean | GRPO > best-of-4 | GRPO seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['base']:.3f} | {r['base_best_of_4']:.3f} | {r['grpo']:.3f} | "
              f"{'yes' if r['grpo'] > r['base_best_of_4'] else 'no'} | {r['train_s']:.0f} |")
    print(f"\ntotal wall-clock: {total / 60:.1f} min ({len(rows)} seeds, {torch.get_num_threads()} torch thread(s))")


if __name__ == "__main__":
    main()
