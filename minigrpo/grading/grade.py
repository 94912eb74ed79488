"""``minigrpo grade``: grade a learner's exercise notebooks and print a score table.

Two parts per exercise: every graded item (the full set of cases, harder than the notebook's
quick checks), and the notebook itself run top to bottom in smoke mode under
``pytest --nbval-lax`` (its check cells must print what the solution printed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from minigrpo.grading import EXERCISES, items
from minigrpo.grading.core import run_item
from minigrpo.grading.notebooks import find_notebook, load_functions, repo_root
from minigrpo.utils import SMOKE_ENV_VAR

#: seconds any one notebook cell may run while grading (an infinite loop fails instead of hanging)
NOTEBOOK_CELL_TIMEOUT = 300


@dataclass
class Row:
    name: str
    passed: bool
    detail: str
    points: int


def run_nbval(path: Path, cell_timeout: int = NOTEBOOK_CELL_TIMEOUT) -> tuple[bool, str]:
    """Run a notebook under ``pytest --nbval-lax`` in smoke mode; return (passed, one-line detail)."""
    env = dict(os.environ, **{SMOKE_ENV_VAR: "1"})
    path = Path(path).resolve()  # the run starts in the notebook's folder: a relative path would miss it
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout}", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=path.parent)
    out = proc.stdout + proc.stderr
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|error)", out))
    passed, failed = counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0)
    if proc.returncode == 0:
        return True, f"ran top to bottom; {passed} cells checked"
    if passed + failed == 0:  # pytest stopped before running a cell: show why
        last = [line for line in out.splitlines() if line.strip()][-1:] or ["no output"]
        return False, f"the notebook did not run under pytest: {last[0].strip()}"
    failing = [int(n) for n in re.findall(r"^FAILED \S+::Cell (\d+)", out, flags=re.M)]
    # nbval numbers the code cells from 0; people count from 1.
    where = f" (the first is code cell {min(failing) + 1} of {passed + failed})" if failing else ""
    return False, f"{failed} of {passed + failed} cells failed{where}; run it in Jupyter to see the error"


def grade_exercise(exercise: str, path: Path | None = None, notebook: bool = True) -> list[Row]:
    path = path or find_notebook(exercise, repo_root() / "exercises")
    loaded = load_functions(path)
    rows = []
    for item in items(exercise):
        fn = loaded.get(item.function)
        result = run_item(item, fn)
        detail = result.summary()
        if fn is None and loaded.errors:
            detail = f"`{item.function}` not defined; {loaded.errors[0]}"
        rows.append(Row(f"{item.id} {item.function}", result.passed,
                        f"{result.n_passed}/{len(result.cases)} cases — {detail}", 1))
    if notebook:
        ok, detail = run_nbval(path)
        rows.append(Row(f"{exercise} notebook (nbval, smoke)", ok, detail, 1))
    return rows


def format_table(exercise: str, path: Path, rows: list[Row], width: int = 100) -> str:
    title = EXERCISES[exercise][0]
    try:
        path = path.resolve().relative_to(repo_root())
    except ValueError:
        pass
    name_w = max(len(r.name) for r in rows) + 2
    lines = [f"Exercise {exercise} — {title}   ({path})", "-" * width]
    for r in rows:
        mark = "PASS" if r.passed else "FAIL"
        wrapped = textwrap.wrap(r.detail, width=max(40, width - name_w - 6)) or [""]
        lines.append(f"{r.name:<{name_w}}{mark}  {wrapped[0]}")
        lines += [" " * (name_w + 6) + more for more in wrapped[1:]]
    score = sum(r.points for r in rows if r.passed)
    total = sum(r.points for r in rows)
    lines += ["-" * width, f"score: {score}/{total}" + ("   full marks!" if score == total else "")]
    return "\n".join(lines)


def main(exercise: str | None = None, path: str | None = None, notebook: bool = True,
         verbose: bool = False) -> int:
    """Grade one exercise (or all); print the tables; exit status 0 only with full marks."""
    if path is not None and not Path(path).is_file():
        print(f"minigrpo grade: no notebook at {path}", file=sys.stderr)
        return 2
    if path is not None and exercise is None:
        exercise = Path(path).name[:2]
    todo = [exercise] if exercise else list(EXERCISES)
    all_passed = True
    for ex in todo:
        nb_path = Path(path) if path else find_notebook(ex, repo_root() / "exercises")
        rows = grade_exercise(ex, nb_path, notebook=notebook)
        print(format_table(ex, nb_path, rows))
        if verbose:
            loaded = load_functions(nb_path)
            for item in items(ex):
                print("\n" + run_item(item, loaded.get(item.function)).report())
        print()
        all_passed &= all(r.passed for r in rows)
    return 0 if all_passed else 1
