"""``minigrpo grade``: grade a learner's exercise notebooks and print a score table.

Three parts per exercise, one score: every graded item (the full set of cases, harder than the
notebook's quick checks), the exercise's property tests (``tests/grading/test_exNN.py``: random inputs,
float64 oracles, a second model, μ > 1), and the notebook itself run top to bottom in smoke mode under
``pytest --nbval-lax``. The notebook is the file as saved on disk, run from a fresh kernel with its
saved outputs removed: it passes when every cell runs without error (a failing check cell raises),
whatever verdicts the learner's copy still shows. When it fails, the row names the first failing
cell and its one-line error. Each grade is remembered for ``minigrpo list`` (:mod:`minigrpo_course.progress`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat

from minigrpo_course.grading import EXERCISES, items
from minigrpo_course.grading.core import run_item
from minigrpo_course.grading.notebooks import find_notebook, load_functions
from minigrpo_course.progress import record_grade, repo_root
from minigrpo.utils import SMOKE_ENV_VAR

#: seconds any one notebook cell may run while grading (an infinite loop fails instead of hanging)
NOTEBOOK_CELL_TIMEOUT = 300


@dataclass
class Row:
    name: str
    passed: bool
    detail: str
    points: int


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

#: what the notebook row says about which file was graded, when the notebook fails
SAVED_ON_DISK = ("Graded as saved on disk, run from scratch: save it in Jupyter (Ctrl+S), make that cell "
                 "pass there, then grade again.")


def _first_line(source: str, width: int = 60) -> str:
    """The line a learner recognises a cell by: its first non-empty one, shortened."""
    lines = [ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("# NBVAL")]
    line = lines[0] if lines else "(empty cell)"
    return line if len(line) <= width else line[: width - 1] + "…"


def _cell_error(out: str, cell_num: int) -> str:
    """The one-line error of nbval's failure report for ``Cell cell_num`` (the last line of its
    traceback, which is the exception and its message; for a check cell, CheckFailed's summary)."""
    text = _ANSI.sub("", out)
    match = re.search(rf"^_+ \S+::Cell {cell_num} _+$(.*?)(?=^_{{3,}} |^=+ |\Z)", text, flags=re.M | re.S)
    section = match.group(1) if match else ""
    timeout = re.search(r"Timeout of [^\n]*", section)
    if timeout:
        return timeout.group(0).rstrip(".") + " (an infinite loop?)"
    tb = section.split("Traceback:", 1)[1] if "Traceback:" in section else ""
    lines = [ln.strip() for ln in tb.splitlines() if ln.strip()]
    return lines[-1] if lines else "the cell raised an error"


def run_nbval(path: Path, cell_timeout: int = NOTEBOOK_CELL_TIMEOUT) -> tuple[bool, str]:
    """Run a notebook top to bottom under ``pytest --nbval-lax`` in smoke mode, from a fresh kernel;
    return (passed, one-line detail).

    The run is of a copy with every output removed, so what the saved file shows (a verdict from
    before the learner's fix, or shipped outputs of an older exercise notebook whose check cells
    carried ``# NBVAL_CHECK_OUTPUT``) cannot matter: a cell passes when it runs without error. The
    copy's first cell moves the kernel into the notebook's own folder, where nbval would start it.
    """
    path = Path(path).resolve()
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - a broken file is the learner's, say so in one line
        reason = str(exc).splitlines()[0] if str(exc) else ""
        return False, f"could not read the notebook ({type(exc).__name__}: {reason}); is it saved from Jupyter?"
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    nb.cells.insert(0, nbformat.v4.new_code_cell(f"import os; os.chdir({str(path.parent)!r})"))
    env = dict(os.environ, **{SMOKE_ENV_VAR: "1"})
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("TQDM_DISABLE", "1")
    with tempfile.TemporaryDirectory(prefix="minigrpo-grade-") as tmp:
        copy = Path(tmp) / path.name
        nbformat.write(nb, copy)
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n")  # no other project's settings apply
        cmd = [sys.executable, "-m", "pytest", "-q", "--color=no", "-p", "no:cacheprovider", "-o", "addopts=",
               "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout}", copy.name]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    out = proc.stdout + proc.stderr
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|errors?|xfailed|xpassed|skipped)\b", out)}
    passed = counts.get("passed", 0)
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    # cells after a time-out are xfail/xpass; the added first cell is not the learner's
    total = passed + failed + sum(counts.get(k, 0) for k in ("xfailed", "xpassed", "skipped")) - 1
    if proc.returncode == 0:
        return True, f"ran top to bottom; {total} cells checked"
    if passed + failed == 0:  # pytest stopped before running a cell: show why
        last = [line for line in out.splitlines() if line.strip()][-1:] or ["no output"]
        return False, f"the notebook did not run under pytest: {last[0].strip()}"
    failing = sorted(int(n) for n in re.findall(r"^FAILED \S+::Cell (\d+)", out, flags=re.M))
    if not failing or failing[0] == 0:
        return False, f"{failed} of {total} cells failed. {SAVED_ON_DISK}"
    first = failing[0]
    cell = code_cells[first - 1]
    more = len(failing) - 1
    others = "" if more == 0 else f" (and {more} cell{'s' if more > 1 else ''} after it)"
    # nbval counts code cells from 0 and the added cell is its 0: code cell `first` counting from 1.
    return False, (f"code cell {first} of {total}, `{_first_line(cell.source)}`, failed: "
                   f"{_cell_error(out, first)}{others}. {SAVED_ON_DISK}")


def property_tests(exercise: str) -> Path | None:
    """``tests/grading/test_exNN.py`` of the checkout, if there is one (an installed package has none)."""
    path = repo_root() / "tests" / "grading" / f"test_ex{exercise}.py"
    return path if path.is_file() else None


class _Reports:
    """A pytest plugin that keeps the outcome of every test (in order) instead of printing it."""

    def __init__(self):
        self.passed: list[str] = []
        self.failed: list[tuple[str, str]] = []  #: (test name, the first line of its error)

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.split("::", 1)[-1]
        if report.failed:
            self.failed.append((name, _error_line(report.longreprtext)))
        elif report.when == "call" and report.passed:
            self.passed.append(name)


def _error_line(text: str, width: int = 160) -> str:
    """The assertion message of a pytest failure: its first ``E`` lines, on one line."""
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    line = " ".join(" ".join(lines[:2]).split()) if lines else (text.strip().splitlines() or [""])[-1]
    return line if len(line) <= width else line[: width - 1] + "…"


def run_property_tests(exercise: str, path: Path) -> tuple[bool, str]:
    """Run the exercise's property tests on the notebook at ``path`` (in this process: the tests import what
    the grader has already imported); return (passed, one-line detail)."""
    import contextlib
    import io

    import pytest

    tests, path = property_tests(exercise), Path(path).resolve()
    reports = _Reports()
    args = [str(tests), "--grade-source", str(path), "-q", "--tb=short", "-p", "no:cacheprovider", "-o", "addopts=",
            "--rootdir", str(repo_root()), "-k", "not test_item"]  # the items have their own rows
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(out):
        code = pytest.main(args, plugins=[reports])
    shown = f"tests/grading/{tests.name}"
    if code == 0:
        return True, f"all {len(reports.passed)} property tests ({shown}) passed"
    if not reports.failed:
        last = [line for line in out.getvalue().splitlines() if line.strip()][-1:] or [f"pytest exit status {code}"]
        return False, f"the property tests ({shown}) did not run: {last[0].strip()}"
    name, message = reports.failed[0]
    total = len(reports.passed) + len(reports.failed)
    return False, (f"{len(reports.failed)} of {total} property tests failed; first: {name}"
                   + (f": {message}" if message else "")
                   + f" (details: python -m pytest {shown} --grade-source {path})")


def grade_exercise(exercise: str, path: Path | None = None, notebook: bool = True, tests: bool = True) -> list[Row]:
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
    if tests and property_tests(exercise) is not None:
        ok, detail = run_property_tests(exercise, path)
        rows.append(Row(f"{exercise} property tests", ok, detail, 1))
    if notebook:
        ok, detail = run_nbval(path)
        rows.append(Row(f"{exercise} notebook (nbval, smoke)", ok, detail, 1))
    return rows


def score(rows: list[Row]) -> tuple[int, int]:
    """(points earned, points possible)."""
    return sum(r.points for r in rows if r.passed), sum(r.points for r in rows)


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
    got, total = score(rows)
    lines += ["-" * width, f"score: {got}/{total}" + ("   full marks!" if got == total else "")]
    return "\n".join(lines)


def _is_reference_solution(path: Path) -> bool:
    """Grading ``solutions/`` (to see what full marks look like) is not the learner's progress."""
    return path.resolve().parent == (repo_root() / "solutions").resolve()


def main(exercise: str | None = None, path: str | None = None, notebook: bool = True,
         verbose: bool = False, tests: bool = True) -> int:
    """Grade one exercise (or all); print the tables and remember each grade
    (:mod:`minigrpo_course.progress`). Exit status 0 only with full marks; 2, with one line on stderr,
    when there is nothing to grade (no such exercise, no notebook, or a file that is not one)."""
    if path is not None and not Path(path).is_file():
        print(f"minigrpo grade: no notebook at {path}", file=sys.stderr)
        return 2
    known = ", ".join(EXERCISES)
    if exercise is not None:
        exercise = exercise.zfill(2) if exercise.isdigit() else exercise
        if exercise not in EXERCISES:
            print(f"minigrpo grade: no exercise {exercise}; exercises: {known}", file=sys.stderr)
            return 2
    elif path is not None:
        exercise = Path(path).name[:2]
        if exercise not in EXERCISES:
            print(f"minigrpo grade: cannot tell the exercise from the name {Path(path).name} (exercises: {known}); "
                  f"give it: minigrpo grade NN --path {path}", file=sys.stderr)
            return 2
    todo = [exercise] if exercise else list(EXERCISES)
    all_passed, unusable = True, False
    for ex in todo:
        try:
            nb_path = Path(path) if path else find_notebook(ex, repo_root() / "exercises")
        except FileNotFoundError as exc:
            print(f"minigrpo grade: {exc}", file=sys.stderr)
            unusable = True
            continue
        try:
            nbformat.read(nb_path, as_version=4)
        except Exception as exc:  # noqa: BLE001 - one line, not a traceback, for a damaged file
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"minigrpo grade: cannot read {nb_path} as a notebook: {reason}", file=sys.stderr)
            unusable = True
            continue
        rows = grade_exercise(ex, nb_path, notebook=notebook, tests=tests)
        print(format_table(ex, nb_path, rows))
        if verbose:
            loaded = load_functions(nb_path)
            for item in items(ex):
                print("\n" + run_item(item, loaded.get(item.function)).report())
        print()
        if not _is_reference_solution(nb_path):
            record_grade(ex, *score(rows))
        all_passed &= all(r.passed for r in rows)
    return 2 if unusable else 0 if all_passed else 1
