"""``minigrpo grade``: grade a learner's exercise notebooks and print a score table.

Three parts per exercise, one score: every graded item (the full set of cases, harder than the
notebook's quick checks), the exercise's property tests (``tests/grading/test_exNN.py``: random inputs,
float64 oracles, a second model, μ > 1), and the notebook itself run top to bottom in smoke mode under
``pytest --nbval-lax``. The notebook is the file as saved on disk, run from a fresh kernel with its
saved outputs removed: it passes when every cell runs without error (a failing check cell raises),
whatever verdicts the learner's copy still shows. When it fails, the row names the first failing
cell and its one-line error.

The learner's code never runs in this process: the items and the property tests run in a child process under
hard time limits (:mod:`minigrpo_course.grading.sandbox`), and the notebook in a kernel of its own. Each grade is
remembered for ``minigrpo list`` (:mod:`minigrpo_course.progress`), with the parts it covers.
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
from minigrpo_course.grading.notebooks import exercise_numbers, find_notebook
from minigrpo_course.grading.sandbox import OUTPUT_KEPT, grade_in_child
from minigrpo_course.progress import record_grade, repo_root
from minigrpo_course.state import StateFileError
from minigrpo.utils import SMOKE_ENV_VAR

#: seconds any one notebook cell may run while grading (an infinite loop fails instead of hanging)
NOTEBOOK_CELL_TIMEOUT = 300
#: seconds the whole notebook may run (its kernel is killed after that, even if a cell swallows the interrupt)
NOTEBOOK_TIMEOUT = 1800
#: characters of nbval's report that are read back (a cell printing in a loop makes it huge)
NBVAL_REPORT_KEPT = 2_000_000


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


#: The grader's first cell in its copy of the notebook: the kernel moves into the notebook's folder, and os._exit
#: called by a cell becomes an error of that cell (the kernel would die, and nbval would wait for the cell's time-out
#: before it noticed). Other threads (ipykernel's parent poller) still exit for real.
FIRST_CELL = """import os as _os, threading as _threading
_os.chdir({folder!r})


def _exit_from_a_cell(code=0, _real=_os._exit):
    if _threading.current_thread() is _threading.main_thread():
        raise SystemExit(f"os._exit({{code}}) was called: it would end the kernel, and the notebook must run to the end")
    _real(code)


_os._exit = _exit_from_a_cell
del _exit_from_a_cell"""


def nbval_command(notebook: str, cell_timeout: int = NOTEBOOK_CELL_TIMEOUT) -> list[str]:
    """The pytest command that runs a notebook top to bottom. ``-p no:randomly``: with pytest-randomly installed,
    the notebook's cells would otherwise run shuffled (and a correct notebook fail)."""
    return [sys.executable, "-m", "pytest", "-q", "--color=no", "-p", "no:cacheprovider", "-p", "no:randomly",
            "-o", "addopts=", "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout}", notebook]


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a child that leads its own process group (pytest, and the kernel it started)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()


def _read_capped(path: Path, keep: int = NBVAL_REPORT_KEPT) -> str:
    """A report file's text: all of it, or its first and last ``keep // 2`` bytes when it is larger."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= keep:
            data = f.read()
        else:
            data = f.read(keep // 2) + b"\n...\n"
            f.seek(size - keep // 2)
            data += f.read()
    return data.decode("utf-8", errors="replace")


def run_nbval(path: Path, cell_timeout: int = NOTEBOOK_CELL_TIMEOUT,
              total_timeout: float = NOTEBOOK_TIMEOUT) -> tuple[bool, str]:
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
    nb.cells.insert(0, nbformat.v4.new_code_cell(FIRST_CELL.format(folder=str(path.parent))))
    env = dict(os.environ, **{SMOKE_ENV_VAR: "1"})
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("TQDM_DISABLE", "1")
    with tempfile.TemporaryDirectory(prefix="minigrpo-grade-") as tmp:
        copy = Path(tmp) / path.name
        nbformat.write(nb, copy)
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n")  # no other project's settings apply
        cmd = nbval_command(copy.name, cell_timeout)
        report = Path(tmp) / "nbval-report.txt"
        with open(report, "wb") as sink:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                    cwd=tmp, start_new_session=True)
            try:
                proc.wait(timeout=total_timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return False, (f"the notebook did not finish within {total_timeout:g} s and was stopped (does a cell "
                               f"loop forever and catch the interrupt?). {SAVED_ON_DISK}")
        out = _read_capped(report)
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


@dataclass
class Graded:
    """An exercise's rows, with what ``-v`` prints and what the learner's code printed."""

    rows: list[Row]
    reports: list[str]
    output_chars: int = 0
    output_head: str = ""

    @property
    def parts(self) -> list[str]:
        """What the grade covers (:data:`minigrpo_course.progress.PARTS`)."""
        names = [r.name for r in self.rows]
        return ["items"] + [part for part, suffix in (("property tests", " property tests"),
                                                       ("notebook", " notebook (nbval, smoke)"))
                            if any(n.endswith(suffix) for n in names)]


def grade(exercise: str, path: Path | None = None, notebook: bool = True, tests: bool = True) -> Graded:
    """Grade one exercise notebook: its items and property tests in a child process, its notebook under nbval."""
    path = Path(path or find_notebook(exercise, repo_root() / "exercises"))
    with_tests = tests and property_tests(exercise) is not None
    child = grade_in_child(exercise, path, [item.id for item in items(exercise)],
                           property_tests(exercise) if with_tests else None)
    rows, reports = [], []
    for item in items(exercise):
        got = child.items[item.id]
        counted = f"{got.n_passed}/{got.n_cases} cases" if got.n_passed is not None else f"{got.n_cases} cases"
        rows.append(Row(f"{item.id} {item.function}", got.passed, f"{counted} — {got.detail}", 1))
        reports.append(got.report or f"✗ {item.id} {item.function}: {got.detail}")
    if with_tests:
        ok, detail = child.tests or (False, "the property tests did not run")
        rows.append(Row(f"{exercise} property tests", ok, detail, 1))
    if notebook:
        ok, detail = run_nbval(path)
        rows.append(Row(f"{exercise} notebook (nbval, smoke)", ok, detail, 1))
    return Graded(rows, reports, child.output_chars, child.output_head)


def grade_exercise(exercise: str, path: Path | None = None, notebook: bool = True, tests: bool = True) -> list[Row]:
    """The score table's rows of one exercise (see :func:`grade`)."""
    return grade(exercise, path, notebook, tests).rows


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


def _which_exercise(exercise: str | None, path: Path) -> tuple[str | None, str | None]:
    """(the exercise to grade ``path`` as, None) or (None, the one-sentence refusal). The notebook must say it is
    that exercise: its ``# EXERCISE NN.k`` cells, ``check("NN.k", …)`` calls or ``# Exercise NN`` title."""
    try:
        says = exercise_numbers(nbformat.read(path, as_version=4))
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, for a damaged file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"cannot read {path} as a notebook: {reason}"
    known = ", ".join(EXERCISES)
    if exercise is None:
        named = path.name[:2]
        graded_ones = sorted(n for n in says if n in EXERCISES)
        exercise = named if named in EXERCISES else graded_ones[0] if len(graded_ones) == 1 else None
        if exercise is None:
            return None, (f"cannot tell the exercise from the name {path.name} or its cells (exercises: {known}); "
                          f"give it: minigrpo grade NN --path {path}")
    if not says:
        return None, (f"{path} does not look like exercise {exercise}'s notebook: it has no `# EXERCISE {exercise}.k` "
                      f"cell, no `check(\"{exercise}.k\", …)` call and no \"# Exercise {exercise}\" title")
    if exercise not in says:
        other = ", ".join(sorted(says))
        return None, (f"{path} is exercise {other}'s notebook, not exercise {exercise}'s: grade it with "
                      f"`minigrpo grade {sorted(says)[0]} --path {path}`, or give exercise {exercise}'s notebook")
    return exercise, None


def main(exercise: str | None = None, path: str | None = None, notebook: bool = True,
         verbose: bool = False, tests: bool = True) -> int:
    """Grade one exercise (or all); print the tables and remember each grade
    (:mod:`minigrpo_course.progress`). Exit status 0 only with full marks; 2, with one line on stderr,
    when there is nothing to grade (no such exercise, no notebook, a file that is not one, or a notebook of
    another exercise). A grade that cannot be recorded says so in one line; its table is printed all the same."""
    if path is not None and not Path(path).is_file():
        print(f"minigrpo grade: no notebook at {path}", file=sys.stderr)
        return 2
    if exercise is not None:
        exercise = exercise.zfill(2) if exercise.isdigit() else exercise
        if exercise not in EXERCISES:
            print(f"minigrpo grade: no exercise {exercise}; exercises: {', '.join(EXERCISES)}", file=sys.stderr)
            return 2
    if path is not None:
        exercise, refusal = _which_exercise(exercise, Path(path))
        if refusal:
            print(f"minigrpo grade: {refusal}", file=sys.stderr)
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
        graded = grade(ex, nb_path, notebook=notebook, tests=tests)
        print(format_table(ex, nb_path, graded.rows))
        if graded.output_chars > OUTPUT_KEPT:
            print(f"(your code printed {graded.output_chars:,} characters while it was graded; "
                  + ("the first " + f"{OUTPUT_KEPT:,} are below)" if verbose else "-v shows the first "
                     f"{OUTPUT_KEPT:,})"))
        if verbose:
            for report in graded.reports:
                print("\n" + report)
            if graded.output_head.strip():
                print("\nwhat your code printed while it was graded (the first "
                      f"{OUTPUT_KEPT:,} characters):\n{graded.output_head}")
        print(flush=True)
        if not _is_reference_solution(nb_path):
            earned, total = score(graded.rows)
            try:
                record_grade(ex, earned, total, graded.parts)
            except StateFileError as exc:
                print(f"minigrpo grade: {exc}; this grade ({earned}/{total}) was not recorded", file=sys.stderr)
        all_passed &= all(r.passed for r in graded.rows)
    return 2 if unusable else 0 if all_passed else 1
