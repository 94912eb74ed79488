"""The ``minigrpo`` command: run lessons, grade exercises, regenerate exercises/, practise interviews."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from minigrpo.utils import SMOKE_ENV_VAR


def _lesson_path(lesson: str, folder: str) -> Path:
    from minigrpo.grading.notebooks import find_notebook, repo_root

    candidate = Path(lesson)
    if candidate.suffix == ".ipynb":
        return candidate
    return find_notebook(lesson.zfill(2), repo_root() / folder)


def cmd_run(args: argparse.Namespace) -> int:
    import nbformat
    from nbclient import NotebookClient

    path = _lesson_path(args.lesson, args.folder)
    if args.smoke:
        os.environ[SMOKE_ENV_VAR] = "1"
    mode = "smoke" if args.smoke else "full"
    print(f"executing {path.name} in {mode} mode (outputs are saved in place)...", flush=True)
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    out = Path(args.output) if args.output else path
    nbformat.write(nb, out)
    print(f"done in {time.perf_counter() - start:.0f} s -> {out}")
    return 0


def cmd_grade(args: argparse.Namespace) -> int:
    from minigrpo.grading import grade

    exercise = args.exercise.zfill(2) if args.exercise else None
    return grade.main(exercise, args.path, notebook=not args.no_notebook, verbose=args.verbose)


def cmd_make_exercises(args: argparse.Namespace) -> int:
    from minigrpo.grading.notebooks import sync_exercises

    changed = sync_exercises(check=args.check)
    if args.check:
        for p in changed:
            print(f"out of date: exercises/{p.name}")
        return 1 if changed else 0
    print("\n".join(f"wrote exercises/{p.name}" for p in changed) or "exercises/ already up to date")
    return 0


def cmd_interview(args: argparse.Namespace) -> int:
    from minigrpo.interview.practice import run as run_interview

    return run_interview(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minigrpo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="execute a lesson notebook top to bottom, saving its outputs")
    run.add_argument("lesson", help="lesson number (e.g. 01) or a path to a notebook")
    run.add_argument("--folder", default="notebooks", help="notebooks (default), solutions or exercises")
    run.add_argument("--smoke", action="store_true", help=f"tiny configuration (sets {SMOKE_ENV_VAR}=1)")
    run.add_argument("--output", help="write the executed notebook here instead of in place")
    run.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell")
    run.set_defaults(func=cmd_run)

    grade = sub.add_parser("grade", help="grade your exercises and print a score table")
    grade.add_argument("exercise", nargs="?", help="exercise number, e.g. 01 (default: all)")
    grade.add_argument("--path", help="grade this notebook instead of exercises/NN_*.ipynb")
    grade.add_argument("--no-notebook", action="store_true", help="skip running the notebook under nbval")
    grade.add_argument("-v", "--verbose", action="store_true", help="print every item's full verdict")
    grade.set_defaults(func=cmd_grade)

    make = sub.add_parser("make-exercises", help="regenerate exercises/ from solutions/")
    make.add_argument("--check", action="store_true", help="only report out-of-date files (exit 1 if any)")
    make.set_defaults(func=cmd_make_exercises)

    from minigrpo.interview.practice import add_arguments as interview_arguments

    interview = sub.add_parser("interview", help="practise interview questions, with spaced review of weak ones")
    interview_arguments(interview)
    interview.set_defaults(func=cmd_interview)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
