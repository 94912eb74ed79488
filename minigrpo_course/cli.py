"""minigrpo: run the lessons, grade your exercises, practise interview questions."""

# The course's `minigrpo` command (the console script; also `python -m minigrpo_course`): list, run, grade,
# make-exercises and interview live here; `train` is the library's (minigrpo.cli.add_train_parser).

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from minigrpo import __version__
from minigrpo.cli import (INTERRUPTED, _error, _one_line, _shown, add_models_parser, add_train_parser,
                          parse_args, run)
from minigrpo.smoke import SMOKE_ENV_VAR, is_smoke
from minigrpo_course.progress import repo_root

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

exit status: 0 done, 1 a run or grade that failed, 2 bad input (one line says why), 130 Ctrl-C;
output cut short by its reader (minigrpo list | head -1) ends quietly with 0
"""

FOLDERS = ("notebooks", "solutions", "exercises")
#: packages of the `course` extra that run/grade/make-exercises need; a library-only install lacks them
COURSE_MODULES = {"nbformat", "nbclient", "nbval", "pytest", "jupyter_core", "jupyter_client", "ipykernel",
                  "matplotlib"}


def _notebooks(folder: Path) -> dict[str, Path]:
    """``{"01": folder/01_reinforce.ipynb, ...}`` for the numbered notebooks of a folder."""
    found: dict[str, Path] = {}
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        found.setdefault(path.name[:2], path)
    return found


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
        out = Path(args.output).expanduser()
        return out / source.name if out.is_dir() or args.output.endswith(("/", os.sep)) else out
    return repo_root() / "runs" / source.name


def _read_notebook(path: Path):
    """The notebook at ``path``, validated; a ValueError of one sentence when it is empty, not JSON or not a
    notebook (read before anything runs)."""
    import nbformat

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {_shown(path)} ({exc.strerror or exc})") from None
    if not raw.strip():
        raise ValueError(f"{_shown(path)} is empty, not a notebook")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{_shown(path)} is not a notebook: it is not UTF-8 text") from None
    except ValueError:
        raise ValueError(f"{_shown(path)} is not a notebook: it is not JSON") from None
    missing = [k for k in ("cells", "metadata", "nbformat") if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{_shown(path)} is JSON but not a notebook: it has no {', '.join(map(repr, missing))} "
                         "(a notebook is an object with cells, metadata and nbformat)")
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # noqa: BLE001 - jsonschema, NBFormatError, or a shape nbformat trips over
        raise ValueError(f"{_shown(path)} is not a valid Jupyter notebook ({_one_line(exc, 160)})") from None
    return nb


class _Interrupted(Exception):
    """Ctrl-C arrived between two cells."""


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def strip_widgets(nb) -> int:
    """Drop widget views from ``nb`` (in place), with the notebook's saved widget state: an output that is only a
    widget and its text/plain stand-in (a tqdm bar drawn by ipywidgets, which without the live kernel shows only
    "0%| |") goes; one with a real fallback (HTML, an image) keeps the fallback. Returns the number of outputs
    removed. Committed outputs stay lean and show the same with or without ipywidgets."""
    removed = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.outputs:
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
                if set(data) <= {"text/plain"}:
                    removed += 1
                    continue
            kept.append(output)
        cell.outputs = kept
    nb.metadata.pop("widgets", None)
    return removed


def _save_partial(nb, out: Path, stopped_at: int | None) -> None:
    """Write what ran, without progress-bar widgets (:func:`strip_widgets`), its figures compacted
    (:mod:`minigrpo_course.figures`): the cells after ``stopped_at`` lose
    any outputs left from an older run, so the saved notebook shows where the run stopped."""
    import nbformat

    from minigrpo_course.figures import compact_figures
    from minigrpo_course.state import atomic_write_text

    strip_widgets(nb)
    compact_figures(nb)  # figures as palette PNGs: a third of the bytes, the same picture
    if stopped_at is not None:
        for cell in nb.cells[stopped_at + 1:]:
            if cell.cell_type == "code":
                cell.outputs = []
                cell.execution_count = None
    text = nbformat.writes(nb)
    atomic_write_text(out, text if text.endswith("\n") else text + "\n")  # all or nothing: never half a notebook


def cmd_run(args: argparse.Namespace) -> int:
    try:
        source = _find_lesson(args.lesson, args.folder)
    except ValueError as exc:
        _error("run", str(exc))
        return 2
    if args.timeout <= 0:
        _error("run", f"--timeout must be a positive number of seconds, got {args.timeout}")
        return 2
    from minigrpo_course.state import check_writable

    try:
        nb = _read_notebook(source)
        # checked now, not after the run: an unusable output path must not cost the run
        out = check_writable(_output_path(args, source), "output notebook")
    except ValueError as exc:
        _error("run", str(exc))
        return 2

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
    # the kernel inherits the environment: committed figures at 72 dpi (minigrpo_course/matplotlibrc)
    os.environ.setdefault("MATPLOTLIBRC", str(Path(__file__).with_name("matplotlibrc")))
    print(f"running {_shown(source)} in {mode}, at most {args.timeout} s per cell; "
          f"writing {_shown(out)}", flush=True)

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
        # and what the cells import in a branch this run did not take (a GPU-only import): their code is recorded
        # too, so the record names every module a cell names
        loaded = set(loaded) | provenance.code_imports(provenance.notebook_code(nb))
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


def _grade_status(grade) -> str:
    """What `list` says about an exercise's recorded grade (and the latest partial one kept beside it)."""
    from minigrpo_course.progress import PARTS, covers

    def one(g: dict) -> str:
        parts = covers(g)
        text = f"{g['score']}/{g['total']}" + (f" on {g['when']}" if g.get("when") else "")
        if parts != PARTS:
            text += f" ({' and '.join(parts)} only)" if len(parts) < 3 else ""
        return text

    if not (isinstance(grade, dict) and {"score", "total"} <= grade.keys()):
        return "not graded yet"
    status = f"graded {one(grade)}"
    partial = grade.get("partial")
    if isinstance(partial, dict) and {"score", "total"} <= partial.keys():
        status += f"; since then {one(partial)}"
    return status


def cmd_list(args: argparse.Namespace) -> int:
    try:
        return _list()
    except BrokenPipeError:  # `minigrpo list | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _list() -> int:
    from minigrpo_course.exercise_items import exercise_items
    from minigrpo_course.progress import grades, grades_path
    from minigrpo_course.state import StateFileError

    root = repo_root()
    lessons, exercises = _notebooks(root / "notebooks"), _notebooks(root / "exercises")
    try:
        done, unreadable = grades(), None
    except StateFileError as exc:
        done, unreadable = {}, str(exc)
    graded_items = exercise_items()
    print("lessons (notebooks/; run one with: minigrpo run NN)")
    for number, path in lessons.items():
        exercise = f"exercise {number}" if number in exercises else "-"
        print(f"  {number}  {_title(path):58s} {exercise}")
    print("\nexercises (exercises/; grade one with: minigrpo grade NN)")
    for number, path in exercises.items():
        status = "grades unreadable (see below)" if unreadable else _grade_status(done.get(number))
        print(f"  {number}  {_title(path):40s} {status}")
        for item in graded_items.get(number, ("", []))[1]:
            print(f"        {item.id:5s} {item.function:27s} {item.title}")
    if unreadable:
        print(f"\nyour grades: {unreadable}")
    else:
        print(f"\nyour grades are kept in {grades_path()}")
    sys.stdout.flush()
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


def cmd_colab(args: argparse.Namespace) -> int:
    from minigrpo_course.colab import main as colab_main

    return colab_main(args.paths, check=args.check, ref=args.ref)


def cmd_interview(args: argparse.Namespace) -> int:
    from minigrpo_course.interview.practice import run as run_interview

    return run_interview(args)


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

    colab = sub.add_parser(
        "colab", help="put the Open-in-Colab badge and setup cell at the top of every notebook (maintainers)",
        description="Insert or update, under the title of each notebook, an 'Open in Colab' badge and a setup cell "
                    "that installs the course (pinned to the release, [project.urls] Repository at v<version>) when "
                    "the notebook runs outside it, and does nothing inside it. Idempotent.")
    colab.add_argument("paths", nargs="*", metavar="PATH",
                       help="notebooks to update (default: notebooks/, notebooks/deep_dives/, solutions/, exercises/)")
    colab.add_argument("--check", action="store_true",
                       help="only list the notebooks a run would change (exit status 1 if any)")
    colab.add_argument("--ref", help="pin this git ref (a commit, a tag) instead of v<version>")
    colab.set_defaults(func=cmd_colab)

    add_train_parser(sub)
    add_models_parser(sub)

    from minigrpo_course.interview.practice import add_arguments as interview_arguments  # standard library only

    interview = sub.add_parser("interview", help="practise interview questions: spaced review, mock rounds, drills")
    interview_arguments(interview)
    interview.set_defaults(func=cmd_interview)
    return parser


#: exit status when the reader of our output went away (``minigrpo list | head -1``): 0, the reader had what it
#: wanted; not 141 (128 + SIGPIPE), which would fail every ``set -o pipefail`` script that pipes us into head
BROKEN_PIPE = 0


def _quiet_stdout() -> None:
    """Send what is left of stdout to /dev/null, so that the interpreter's last flush at exit cannot fail
    with a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    """The ``minigrpo`` command. Exit status: 0 done, 1 a run or grade that failed, 2 bad input (one line), 130
    Ctrl-C; output cut short by its reader (``| head``) ends quietly with 0."""
    try:
        try:
            args = parse_args(build_parser(), argv)
        except SystemExit:  # --help, --version, a usage error: printed already; a closed pipe shows up here
            sys.stdout.flush()
            raise
        try:
            status = run(args)   # Ctrl-C: one line, exit status 130
        except ModuleNotFoundError as exc:
            if exc.name not in COURSE_MODULES:
                raise
            _error(args.command, f"this command needs the course tools ({exc.name} is missing): "
                                 "pip install -e '.[course]' from the repository, or make setup")
            return 2
        sys.stdout.flush()  # a pipe closed early shows up here, inside the handler below, not at exit
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
