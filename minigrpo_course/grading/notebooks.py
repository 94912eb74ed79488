"""Notebooks as exercise sources: loading a learner's functions, and generating exercises/.

Conventions:
- An exercise cell is tagged ``exercise`` in its metadata and starts with a ``# EXERCISE NN.k``
  comment. It is self-contained (its own imports), so the grader can run it alone.
- Under it, a check cell calls ``check("NN.k", fn)``: it prints the verdict and, when a check fails,
  raises, so the cell errors. Check cells carry no ``# NBVAL_CHECK_OUTPUT``: a notebook passes
  ``pytest --nbval-lax`` when every cell runs, whatever outputs it has saved.
- In ``solutions/`` the answer sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``, and the
  notebook is saved executed. ``exercises/`` is generated from it with each block replaced by a stub
  that raises NotImplementedError and every output removed: a fresh exercise shows no verdict until
  the learner runs it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from minigrpo_course.grading.core import GradingTimeout, time_limit
from minigrpo_course.progress import repo_root

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
EXERCISE_TAG = "exercise"
STUB = "# YOUR CODE HERE\nraise NotImplementedError(\"{what}\")"
_EXERCISE_COMMENT = re.compile(r"^\s*#\s*EXERCISE\b")


def find_notebook(exercise: str, folder: Path) -> Path:
    """``folder/NN_*.ipynb`` for exercise ``NN``."""
    matches = sorted(Path(folder).glob(f"{exercise}_*.ipynb"))
    if not matches:
        raise FileNotFoundError(f"no notebook for exercise {exercise} in {folder} (expected {exercise}_<topic>.ipynb)")
    return matches[0]


def is_exercise_cell(cell) -> bool:
    if cell.cell_type != "code":
        return False
    tags = cell.get("metadata", {}).get("tags", [])
    return EXERCISE_TAG in tags or bool(_EXERCISE_COMMENT.match(cell.source))


@dataclass
class LoadedNotebook:
    path: Path
    namespace: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  #: one line per exercise cell that failed to run

    def get(self, name: str):
        return self.namespace.get(name)


_CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d\d)\.\d+["']""")
_EXERCISE_NUMBER = re.compile(r"^\s*#\s*EXERCISE\s+(\d\d)\.\d+", flags=re.M)
_TITLE = re.compile(r"^#\s*Exercise\s+(\d\d)\b", flags=re.M)


def exercise_numbers(nb) -> set[str]:
    """The exercise numbers a notebook says it is: from its ``# EXERCISE NN.k`` cells, its ``check("NN.k", …)``
    calls and its ``# Exercise NN —`` title (empty for a notebook that says none)."""
    found = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            found.update(_CHECK_CALL.findall(cell.source))
            found.update(_EXERCISE_NUMBER.findall(cell.source))
        elif cell.cell_type == "markdown":
            found.update(_TITLE.findall(cell.source))
    return found


def cell_label(cell, index: int) -> str:
    """How a verdict names a notebook cell: its index and its first line (``cell 3, `# EXERCISE 01.1 …```)."""
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "(empty)")
    return f"cell {index} (`{first if len(first) <= 50 else first[:49] + '…'}`)"


def load_functions(path: str | Path, seconds: float = 30.0, on_cell: Callable | None = None) -> LoadedNotebook:
    """Run the exercise cells of a notebook (only those) and return what they define.

    A cell that raises, calls ``sys.exit()`` or runs past ``seconds`` is reported in ``errors`` (one line naming
    the cell) and the next cells still run. ``on_cell(index)``, when given, is a context manager around each cell
    (the grader's child process tells its parent which cell runs, in case one ends the process)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    loaded = LoadedNotebook(path, {"__name__": f"notebook_{path.stem}"})
    for i, cell in enumerate(nb.cells):
        if not is_exercise_cell(cell):
            continue
        where = cell_label(cell, i)
        try:
            code = compile(cell.source, f"{path.name}[cell {i}]", "exec")
            with on_cell(i) if on_cell else nullcontext(), time_limit(seconds):
                exec(code, loaded.namespace)  # noqa: S102 - running the learner's own notebook
        except GradingTimeout:
            loaded.errors.append(f"{where} did not finish within {seconds:g} s")
        except SystemExit as exc:
            code_text = "" if exc.code is None else repr(exc.code)
            loaded.errors.append(f"{where} called sys.exit({code_text}): remove it, the notebook must run to the end")
        except Exception as exc:  # noqa: BLE001
            loaded.errors.append(f"{where} raised {type(exc).__name__}: {exc}")
    return loaded


def _stub_source(source: str, what: str) -> str:
    """Replace every BEGIN/END SOLUTION block with an indented stub."""
    out, lines, i = [], source.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == BEGIN:
            indent = line[: len(line) - len(line.lstrip())]
            j = i + 1
            while j < len(lines) and lines[j].strip() != END:
                j += 1
            if j == len(lines):
                raise ValueError(f"{what}: '{BEGIN}' without a matching '{END}'")
            out += [indent + s for s in STUB.format(what=what).split("\n")]
            i = j + 1
            continue
        if line.strip() == END:
            raise ValueError(f"{what}: '{END}' without a matching '{BEGIN}'")
        out.append(line)
        i += 1
    return "\n".join(out)


def make_exercise_notebook(solution):
    """The learner's copy of a solution notebook (a new ``NotebookNode``): answers stubbed, no outputs."""
    nb = copy.deepcopy(solution)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if BEGIN in cell.source:
            name = re.search(r"def\s+(\w+)", cell.source)
            cell.source = _stub_source(cell.source, f"implement {name.group(1)}" if name else "your code here")
        cell.execution_count = None
        cell.outputs = []
    return nb


def exercise_text(solution_path: Path) -> str:
    """The exact file content ``exercises/`` should hold for a solution notebook: its Colab cells
    (:mod:`minigrpo_course.colab`) name the exercise, not the solution."""
    from minigrpo_course.colab import retarget

    nb = nbformat.read(solution_path, as_version=4)
    return nbformat.writes(retarget(make_exercise_notebook(nb), f"exercises/{Path(solution_path).name}")) + "\n"


def has_learner_work(path: Path) -> bool:
    """True when an exercise notebook holds answers: an exercise cell without the stub's
    ``raise NotImplementedError`` (the learner replaced it), or any saved output."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.get("outputs") or (is_exercise_cell(cell) and "raise NotImplementedError" not in cell.source):
            return True
    return False


def sync_exercises(root: Path | None = None, check: bool = False, force: bool = False) -> tuple[list[Path], list[Path]]:
    """Regenerate ``exercises/`` from ``solutions/``.

    Returns ``(changed, kept)``: the files that were (or, with ``check``, would be) rewritten, and
    those left alone because they hold a learner's answers (``force`` overwrites them too).
    """
    root = root or repo_root()
    changed, kept = [], []
    for sol in sorted((root / "solutions").glob("*.ipynb")):
        target = root / "exercises" / sol.name
        text = exercise_text(sol)
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        if target.exists() and not (check or force) and has_learner_work(target):
            kept.append(target)
            continue
        changed.append(target)
        if not check:
            target.write_text(text, encoding="utf-8")
    return changed, kept


def committed_text(path: Path, root: Path) -> str | None:
    """The file as committed in the checkout at ``root`` (``git show HEAD:<path>``), or None where that cannot be
    known (no git, not a checkout, an untracked file)."""
    import subprocess

    try:
        rel = Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
        proc = subprocess.run(["git", "-C", str(root), "show", f"HEAD:{rel}"], capture_output=True, timeout=60)
    except (ValueError, OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.decode("utf-8") if proc.returncode == 0 else None


def stale_exercises(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """``(stale, learners)``: the exercise notebooks that ``make-exercises`` would rewrite, and those that hold a
    learner's answers and were judged by their committed version instead.

    The suite checks that exercises/ is in sync with solutions/. A learner's notebook differs from the generated
    stubs by design, so it is judged by what the checkout committed (``git show HEAD:exercises/NN_x.ipynb``): a
    learner working through the exercises never makes the suite fail, and a stale committed stub still does.
    Outside a git checkout a learner's notebook cannot be judged and is only listed."""
    root = Path(root or repo_root())
    stale, learners = [], []
    for sol in sorted((root / "solutions").glob("*.ipynb")):
        target = root / "exercises" / sol.name
        text = exercise_text(sol)
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        if target.exists() and has_learner_work(target):
            learners.append(target)
            committed = committed_text(target, root)
            if committed is None or committed == text:
                continue
        stale.append(target)
    return stale, learners
