"""minigrpo: run the lessons, grade your exercises, practise interview questions."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from minigrpo import __version__
from minigrpo_course.progress import repo_root
from minigrpo.smoke import SMOKE_ENV_VAR, is_smoke

# Nothing here may import torch, numpy or transformers at module level (or in build_parser):
# `minigrpo --help` must answer at once. Each command imports what it needs when it runs.

EXAMPLES = """\
examples:
  minigrpo list               the lessons, the exercises and your last grades
  minigrpo run 01 --smoke     run lesson 01 in smoke mode (quick); the result goes to runs/
  minigrpo grade 01           grade exercises/01_*.ipynb
  minigrpo interview          practise interview questions, with spaced review of weak ones
  minigrpo train llm --recipe gsm8k --smoke    SFT then GRPO on word problems, quickly; saved under runs/
  minigrpo train diffusion --recipe digits     GRPO on lesson 08's digits diffusion model
"""

FOLDERS = ("notebooks", "solutions", "exercises")
#: packages of the `course` extra that run/grade/make-exercises need; a library-only install lacks them
COURSE_MODULES = {"nbformat", "nbclient", "nbval", "pytest", "jupyter_core", "jupyter_client", "ipykernel",
                  "matplotlib"}
#: exit status of a command stopped with Ctrl-C (128 + SIGINT), as shells report it
INTERRUPTED = 130
#: the recipes of minigrpo.llm.recipes.RECIPES, named here so that --help imports no torch (a test keeps them equal)
LLM_RECIPES = ("countdown", "sort", "addition", "gsm8k")
#: the recipes of minigrpo.diffusion.recipes.DIFFUSION_RECIPES, named here for the same reason
DIFFUSION_RECIPES = ("digits",)


def _error(command: str, message: str) -> None:
    print(f"minigrpo {command}: {message}", file=sys.stderr)


def _notebooks(folder: Path) -> dict[str, Path]:
    """``{"01": folder/01_reinforce.ipynb, ...}`` for the numbered notebooks of a folder."""
    found: dict[str, Path] = {}
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        found.setdefault(path.name[:2], path)
    return found


def _shown(path: Path) -> str:
    """``path`` relative to the current folder when it is below it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def _title(path: Path) -> str:
    """The first markdown heading of a notebook, without its "# Lesson NN —" prefix."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return "(unreadable notebook)"
    for cell in cells:
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        for line in source.splitlines():
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
                return re.sub(r"^(Lesson|Exercise)\s+\d+\s*[—:-]\s*", "", heading)
    return "(no heading)"


# ----------------------------------------------------------------------------- run

def _find_lesson(lesson: str, folder: str) -> Path:
    """The notebook to run; ValueError (one line, listing what exists) when there is none."""
    if lesson.endswith(".ipynb"):
        path = Path(lesson)
        if not path.is_file():
            raise ValueError(f"no notebook at {lesson}")
        return path
    where = repo_root() / folder
    available = _notebooks(where)
    key = lesson.zfill(2) if lesson.isdigit() else lesson
    if key in available:
        return available[key]
    named = where / f"{lesson}.ipynb"  # e.g. 01_reinforce
    if named.is_file():
        return named
    kind = "lessons" if folder == "notebooks" else f"notebooks in {folder}/"
    raise ValueError(f"no lesson {lesson} in {folder}/; {kind}: {', '.join(available) or 'none'}")


def _output_path(args: argparse.Namespace, source: Path) -> Path:
    if args.in_place:
        return source
    if args.output:
        out = Path(args.output)
        return out / source.name if out.is_dir() or args.output.endswith(("/", os.sep)) else out
    return repo_root() / "runs" / source.name


def _one_line(text: str, limit: int = 200) -> str:
    first = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


class _Interrupted(Exception):
    """Ctrl-C arrived between two cells."""


def _save_partial(nb, out: Path, stopped_at: int | None) -> None:
    """Write what ran: the cells after ``stopped_at`` lose any outputs left from an older run, so the
    saved notebook shows where the run stopped."""
    import nbformat

    if stopped_at is not None:
        for cell in nb.cells[stopped_at + 1:]:
            if cell.cell_type == "code":
                cell.outputs = []
                cell.execution_count = None
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))


def cmd_run(args: argparse.Namespace) -> int:
    try:
        source = _find_lesson(args.lesson, args.folder)
    except ValueError as exc:
        _error("run", str(exc))
        return 2
    if args.timeout <= 0:
        _error("run", f"--timeout must be a positive number of seconds, got {args.timeout}")
        return 2
    out = _output_path(args, source)

    import asyncio
    import signal

    import nbformat
    from jupyter_core.utils import ensure_async
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    if args.smoke:
        os.environ[SMOKE_ENV_VAR] = "1"  # the kernel inherits the environment
        mode = "smoke mode (--smoke)"
    elif is_smoke():
        mode = f"smoke mode ({SMOKE_ENV_VAR}={os.environ[SMOKE_ENV_VAR]} in the environment)"
    else:
        mode = "full mode (the real configuration; --smoke for a quick check)"
    print(f"running {_shown(source)} in {mode}, at most {args.timeout} s per cell; "
          f"writing {_shown(out)}", flush=True)

    nb = nbformat.read(source, as_version=4)
    # what the outputs are made with (taken before the run), so that a test can tell when the code has moved on
    from minigrpo_course import provenance

    made_with = provenance.package_fingerprints()
    nb.cells.append(nbformat.v4.new_code_cell(provenance.PROBE))
    state = {"cell": None, "interrupted": False, "handler": False}
    too_long = f"did not finish within {args.timeout} s (--timeout)"
    # On a timeout, interrupt the kernel (the cell keeps the KeyboardInterrupt traceback showing where
    # it was) and fail the cell with our own error, instead of killing a busy kernel.
    client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3", interrupt_on_timeout=True,
                            error_on_timeout={"ename": "CellTimeout", "evalue": too_long, "traceback": []},
                            resources={"metadata": {"path": str(source.parent)}})

    def on_sigint() -> None:
        # First Ctrl-C: interrupt the kernel, so the running cell stops with a KeyboardInterrupt that
        # is kept in its outputs. Give Ctrl-C back to Python, so a second one stops at once.
        state["interrupted"] = True
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGINT)
        if client.km is not None:
            asyncio.ensure_future(ensure_async(client.km.interrupt_kernel()))

    def take_sigint() -> None:
        # nbclient installs a SIGINT handler of its own once the kernel is up; replace it with ours.
        if not state["handler"]:
            state["handler"] = True
            try:
                asyncio.get_running_loop().add_signal_handler(signal.SIGINT, on_sigint)
            except (RuntimeError, NotImplementedError, ValueError):
                pass  # not the main thread, or Windows: Ctrl-C raises KeyboardInterrupt as usual

    def on_cell_start(cell, cell_index: int) -> None:
        take_sigint()
        if state["interrupted"]:
            raise _Interrupted
        state["cell"] = cell_index

    client.on_notebook_start = lambda notebook: take_sigint()
    client.on_cell_start = on_cell_start

    def where() -> str:
        i = state["cell"]
        if i is None:
            return "before the first cell"
        # the number Jupyter shows as In [N]: nbclient counts the code cells it has sent to the kernel
        count = client.code_cells_executed if nb.cells[i].cell_type == "code" else 0
        return f"cell {i + 1} of {len(nb.cells)}" + (f" (In [{count}])" if count else "")

    start = time.perf_counter()
    try:
        client.execute()
    except (KeyboardInterrupt, _Interrupted):
        state["interrupted"] = True
        failure = None
    except CellExecutionError as exc:
        if exc.ename == "CellTimeout":
            failure = too_long
        else:
            failure = f"{exc.ename}: {_one_line(exc.evalue)}" if exc.ename else _one_line(str(exc))
    except CellTimeoutError:  # the kernel stopped sending output
        failure = too_long
    except DeadKernelError:
        failure = "the kernel died (out of memory?)"
    except Exception as exc:  # noqa: BLE001 - kernel start-up and the like: report, keep what ran
        failure = f"{type(exc).__name__}: {_one_line(exc)}"
    else:
        loaded = provenance.loaded_modules(nb.cells.pop())
        kind = "smoke" if is_smoke() else "full"
        provenance.record(nb, kind, entry={"mode": kind, "code": {m: made_with[m] for m in loaded if m in made_with}})
        _save_partial(nb, out, None)
        print(f"done in {time.perf_counter() - start:.0f} s; wrote {_shown(out)}")
        return 0

    nb.cells.pop()   # the provenance probe
    _save_partial(nb, out, state["cell"] if state["cell"] is None or state["cell"] < len(nb.cells) else None)
    if state["interrupted"]:
        print(f"\nminigrpo run: interrupted at {where()}; saved the run so far to {_shown(out)}",
              file=sys.stderr)
        return INTERRUPTED
    _error("run", f"{where()} failed: {failure}; saved the run so far to {_shown(out)}")
    return 1


# ----------------------------------------------------------------------------- grade, list

def cmd_grade(args: argparse.Namespace) -> int:
    from minigrpo_course.grading import grade

    # grade.main answers an unknown exercise or a missing notebook with exit status 2 and one line;
    # this is a safety net, so that no traceback reaches the learner for those.
    exercise = args.exercise
    if exercise is not None and exercise.isdigit():
        exercise = exercise.zfill(2)
    try:
        return grade.main(exercise, args.path, notebook=not args.no_notebook, verbose=args.verbose,
                          tests=not args.no_tests)
    except (FileNotFoundError, KeyError) as exc:
        _error("grade", _one_line(exc.args[0] if exc.args else exc))
        return 2


def cmd_list(args: argparse.Namespace) -> int:
    from minigrpo_course.progress import grades, grades_path

    root = repo_root()
    lessons, exercises = _notebooks(root / "notebooks"), _notebooks(root / "exercises")
    done = grades()
    print("lessons (notebooks/; run one with: minigrpo run NN)")
    for number, path in lessons.items():
        exercise = f"exercise {number}" if number in exercises else "-"
        print(f"  {number}  {_title(path):58s} {exercise}")
    print("\nexercises (exercises/; grade one with: minigrpo grade NN)")
    for number, path in exercises.items():
        grade = done.get(number)
        if isinstance(grade, dict) and {"score", "total"} <= grade.keys():
            status = f"graded {grade['score']}/{grade['total']}" + (f" on {grade['when']}" if grade.get("when") else "")
        else:
            status = "not graded yet"
        print(f"  {number}  {_title(path):40s} {status}")
    print(f"\nyour grades are kept in {grades_path()}")
    return 0


def cmd_make_exercises(args: argparse.Namespace) -> int:
    from minigrpo_course.grading.notebooks import sync_exercises

    changed, kept = sync_exercises(check=args.check, force=args.force)
    if args.check:
        for p in changed:
            print(f"out of date: exercises/{p.name}")
        return 1 if changed else 0
    print("\n".join(f"wrote exercises/{p.name}" for p in changed) or "exercises/ already up to date")
    for p in kept:
        print(f"kept exercises/{p.name}: it holds your answers (--force overwrites it)")
    return 0


def cmd_interview(args: argparse.Namespace) -> int:
    from minigrpo_course.interview.practice import run as run_interview

    return run_interview(args)


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



# ----------------------------------------------------------------------------- the parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minigrpo", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"minigrpo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("list", help="the lessons, the exercises and your last grades",
                   description="List the lessons (number, title, exercise) and the exercises with your "
                               "last grade of each.").set_defaults(func=cmd_list)

    run = sub.add_parser(
        "run", help="execute a lesson notebook top to bottom and save the result",
        description="Execute a lesson notebook top to bottom in a fresh kernel and save the executed "
                    "copy (by default to runs/, so the course notebooks stay as they are). If a cell "
                    "fails, or on Ctrl-C, the notebook executed so far is saved, error included.")
    run.add_argument("lesson", help="lesson number (e.g. 01) or the path of a notebook")
    run.add_argument("--smoke", action="store_true",
                     help=f"the quick configuration (about a minute per lesson); same as {SMOKE_ENV_VAR}=1")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--output", metavar="PATH",
                       help="write the executed notebook here (a file, or a folder to write into) "
                            "(default: runs/<notebook name> in the course folder)")
    where.add_argument("--in-place", action="store_true",
                       help="overwrite the source notebook (for maintainers regenerating committed outputs)")
    run.add_argument("--folder", choices=FOLDERS, default="notebooks",
                     help="where to look up a lesson number (default: %(default)s)")
    run.add_argument("--timeout", type=int, default=1800, metavar="S",
                     help="seconds any one cell may run (default: %(default)s)")
    run.set_defaults(func=cmd_run)

    grade = sub.add_parser("grade", help="grade your exercises and print a score table",
                           description="Grade exercise notebooks: every graded item, the exercise's "
                                       "property tests, then the notebook run top to bottom in smoke mode; "
                                       "one score.")
    grade.add_argument("exercise", nargs="?", help="exercise number, e.g. 01 (default: all)")
    grade.add_argument("--path", help="grade this notebook instead of exercises/NN_*.ipynb")
    grade.add_argument("--no-notebook", action="store_true", help="skip running the notebook top to bottom")
    grade.add_argument("--no-tests", action="store_true",
                       help="skip the exercise's property tests (tests/grading/test_exNN.py)")
    grade.add_argument("-v", "--verbose", action="store_true", help="print every item's full verdict")
    grade.set_defaults(func=cmd_grade)

    make = sub.add_parser("make-exercises", help="regenerate exercises/ from solutions/ (maintainers)")
    make.add_argument("--check", action="store_true", help="only report out-of-date files (exit 1 if any)")
    make.add_argument("--force", action="store_true",
                      help="also overwrite exercise notebooks that hold answers (by default they are kept)")
    make.set_defaults(func=cmd_make_exercises)

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

    from minigrpo_course.interview.practice import add_arguments as interview_arguments  # standard library only

    interview = sub.add_parser("interview", help="practise interview questions: spaced review, mock rounds, drills")
    interview_arguments(interview)
    interview.set_defaults(func=cmd_interview)
    return parser


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; ``train``'s FIELD=VALUE overrides may also come after its options (argparse
    fills a ``*`` positional at its first chance, so later ones arrive as unrecognised arguments)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "train" and not any(e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"\nminigrpo {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except ModuleNotFoundError as exc:
        if exc.name not in COURSE_MODULES:
            raise
        _error(args.command, f"this command needs the course tools ({exc.name} is missing): "
                             "pip install -e '.[course]' from the repository, or make setup")
        return 2


if __name__ == "__main__":
    sys.exit(main())
