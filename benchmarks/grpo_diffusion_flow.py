"""Seconds per diffusion-GRPO step on the digits model: DDPM (DDIM sampler, η = 1) vs flow matching
(Flow-GRPO's SDE sampler, noise level 0.7), same UNet, batch, chain length and GRPO settings, same run.

Both base models are lesson 08's size (``pretrained_base`` / ``pretrained_flow_base``, cached; each trains
in about two minutes if missing). The two trainers take their steps in alternation, so a busy machine slows
both alike; the table reports the median over steps of the whole step, its sampling part (chains, rewards,
advantages) and the rest (the μ × minibatch optimizer steps), and the flow / DDPM ratio.

    .venv/bin/python benchmarks/grpo_diffusion_flow.py [--steps 6] [--threads 1]

Expected: a ratio near 1. Both samplers call the same UNet once per step of the chain and train on the
same number of (chain, step) rows (4 of each chain's 10 steps: half of those with σ ≥ min_step_std = 0.05,
8 for DDIM and 9 for the SDE); the arithmetic around the network differs by a few tensor ops.

Measured on this course's 2-core CPU, shared with other jobs (1 thread, 5 steps after a warm-up):
DDPM 2.25 s/step (sampling 1.12), flow 2.38 s/step (sampling 1.16): flow / DDPM 1.06x (sampling 1.03x).
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from minigrpo.diffusion.grpo import DIGITS_REWARD, DiffusionGRPOTrainer
from minigrpo.diffusion.rewards import ClassifierReward, digits_classifier
from minigrpo_course.experiments.flow_digits import KINDS, base_model, grpo_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="GRPO steps per model (the first is a warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reward = ClassifierReward(digits_classifier()[0], **DIGITS_REWARD)
    trainers = {}
    for kind in KINDS:
        unet, scheduler = base_model(kind, args.seed)
        trainers[kind] = DiffusionGRPOTrainer(copy.deepcopy(unet), scheduler, reward,
                                              grpo_config(kind, args.seed, steps=args.steps))
    times = {kind: [] for kind in KINDS}
    for i in range(args.steps):
        for kind in KINDS:
            m = trainers[kind].step()
            if i > 0:  # the first step warms up allocators and caches
                times[kind].append((m["step_time"], m["sample_time"]))
    cfg = trainers["flow"].cfg
    print(f"digits GRPO step: {cfg.prompts_per_step} prompts x G = {cfg.num_generations}, "
          f"{cfg.num_inference_steps} sampler steps, timestep_fraction {cfg.timestep_fraction}, "
          f"{cfg.num_minibatches} minibatches, {torch.get_num_threads()} torch thread(s), "
          f"median of {args.steps - 1} steps after 1 warm-up\n")
    print("| model | sampler | s/step | sampling s | update s |")
    print("|---|---|---|---|---|")
    med = {}
    for kind in KINDS:
        step = statistics.median(t for t, _ in times[kind])
        sample = statistics.median(s for _, s in times[kind])
        med[kind] = (step, sample)
        name = "DDIM, η = 1" if kind == "ddpm" else f"SDE, a = {trainers[kind].process.noise_level:g}"
        print(f"| {kind} | {name} | {step:.3f} | {sample:.3f} | {step - sample:.3f} |")
    print(f"\nflow / DDPM: step {med['flow'][0] / med['ddpm'][0]:.2f}x, "
          f"sampling {med['flow'][1] / med['ddpm'][1]:.2f}x")


if __name__ == "__main__":
    main()
