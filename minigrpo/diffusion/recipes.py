"""The diffusion recipe of ``minigrpo train diffusion``: lesson 08's digits base model, then GRPO (lesson 09).

``digits``: the class-conditional UNet that ``ddpm.pretrained_base`` trains on the digits (16×16, cached), the
digit classifier's probability of the prompt's class at temperature 4 as the reward (``DIGITS_REWARD``), and
GRPO with :data:`minigrpo.diffusion.grpo.DIGITS_RECIPE`. The reward of fresh samples (the policy's own sampler,
``EVAL_PER_CLASS`` per digit) is measured before and after GRPO, on rank 0 alone when several processes train
(``accelerate launch``: each rank samples ``prompts_per_step`` groups of its own, see
:class:`~minigrpo.diffusion.grpo.DiffusionGRPOTrainer`).

``smoke``: a base model of ``SMOKE_BASE_STEPS`` DDPM steps, a classifier of one epoch and two GRPO steps on small
batches: checks that everything runs, not that it learns.
"""

from __future__ import annotations

import time
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from minigrpo.infra.atomic import atomic_write_json
from minigrpo.diffusion.grpo import (DIGITS_RECIPE, DIGITS_REWARD, DiffusionGRPOConfig, DiffusionGRPOResult,
                                     DiffusionGRPOTrainer, make_process, sample_rewards)

DIFFUSION_RECIPES = ("digits",)
EVAL_PER_CLASS = 16  #: fresh samples per digit for the before/after reward (160 in all; 1 per digit in smoke mode)
SMOKE_BASE_STEPS = 20  #: DDPM steps of the smoke run's base model (cached apart from the real one)
SMOKE_GRPO = dict(max_steps=2, prompts_per_step=2, num_generations=4, num_inference_steps=4, num_minibatches=1)


@dataclass
class DiffusionRunResult:
    result: DiffusionGRPOResult
    before: float  #: mean reward of fresh samples of the base model
    after: float  #: the same after GRPO
    num_eval: int  #: how many samples each mean is over
    seconds: dict = field(default_factory=dict)  #: wall-clock per stage: base, grpo, eval


def digits_config(smoke: bool = False, overrides: typing.Sequence[str] = ()) -> DiffusionGRPOConfig:
    """The digits recipe's GRPO config (``smoke``: :data:`SMOKE_GRPO` on top), then ``field=value`` overrides of
    :class:`DiffusionGRPOConfig` fields (``grpo.`` prefix optional), each read by the field's type."""
    from minigrpo.llm.recipes import parse_value

    hints = typing.get_type_hints(DiffusionGRPOConfig)
    values = {**DIGITS_RECIPE, **(SMOKE_GRPO if smoke else {})}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("grpo.")
        if not sep or key not in hints:
            names = ", ".join(f.name for f in fields(DiffusionGRPOConfig))
            raise ValueError(f"override {item!r} must be FIELD=VALUE with FIELD a DiffusionGRPOConfig field: {names}")
        values[key] = parse_value(text, hints[key], key)
    return DiffusionGRPOConfig(**values)


def digits_base(seed: int, smoke: bool, progress: bool):
    """``(unet, scheduler, reward)``: the cached base model and the classifier's reward. Under a launcher rank 0
    trains what is not cached yet while the others wait, then they load it."""
    from minigrpo.diffusion.ddpm import pretrained_base
    from minigrpo.diffusion.rewards import ClassifierReward, digits_classifier
    from minigrpo.infra.distributed import Distributed

    def build():
        base_overrides = {"steps": SMOKE_BASE_STEPS} if smoke else {}
        unet, scheduler = pretrained_base(seed=seed, progress=progress, **base_overrides)
        classifier, _ = digits_classifier(**({"epochs": 1} if smoke else {}))
        return unet, scheduler, ClassifierReward(classifier, **DIGITS_REWARD)

    dist = Distributed()
    built = build() if dist.is_main else None
    dist.barrier()  # the cache is written: the other ranks load it
    return built if built is not None else build()


def run_digits(config: DiffusionGRPOConfig, seed: int = 0, smoke: bool = False, progress: bool = True,
               device: str | torch.device = "cpu") -> DiffusionRunResult:
    """Base model, reward of fresh samples, GRPO (``config``, seeded with ``seed``), reward of fresh samples again."""
    from minigrpo.infra.distributed import is_main_process

    t = time.perf_counter()
    unet, scheduler, reward = digits_base(seed, smoke, progress)
    unet.to(device)
    reward.classifier.to(device)
    seconds = {"base": time.perf_counter() - t}
    cfg = replace(config, seed=seed)
    process = make_process(scheduler, cfg)
    labels = torch.arange(10).repeat(1 if smoke else EVAL_PER_CLASS)
    main = is_main_process()

    def evaluate(model, eval_seed: int) -> float:
        return sample_rewards(model, process, reward, labels, seed=eval_seed)[1].mean().item() if main else float("nan")

    t = time.perf_counter()
    before = evaluate(unet, 10_000 + seed)
    seconds["eval"] = time.perf_counter() - t
    t = time.perf_counter()
    result = DiffusionGRPOTrainer(unet, scheduler, reward, cfg).train(progress=progress and main)
    seconds["grpo"] = time.perf_counter() - t
    t = time.perf_counter()
    after = evaluate(result.model, 10_000 + seed + 2)
    seconds["eval"] += time.perf_counter() - t
    return DiffusionRunResult(result, before, after, labels.numel(), seconds)


def save_diffusion_run(folder: str | Path, run: DiffusionRunResult, **extra) -> Path:
    """``folder/results.json``: the config, ``extra`` (seed, smoke, device), rewards before/after, times, history;
    written whole or not at all (a crash mid-write leaves the previous file)."""
    folder = Path(folder)
    record = {"recipe": "digits", "config": run.result.config, **extra, "seconds": run.seconds,
              "reward_before": run.before, "reward_after": run.after, "num_eval": run.num_eval,
              "history": run.result.history}
    return atomic_write_json(folder / "results.json", record, indent=1, default=str)


__all__ = ["DIFFUSION_RECIPES", "DiffusionRunResult", "EVAL_PER_CLASS", "SMOKE_BASE_STEPS", "digits_base",
           "digits_config", "run_digits", "save_diffusion_run"]
