"""Running a learner's code for ``minigrpo grade`` where it cannot take the grader down.

The grader never runs the learner's code in its own process. A child process (``python -m
minigrpo_course.grading.sandbox SPEC``) runs the notebook's exercise cells, grades the items, then runs the
exercise's property tests, and writes each step to a file of JSON lines as it goes. The parent watches that file
and the clock:

- every call into the learner's code (an exercise cell, one case of an item, one property test) has a soft time
  limit in the child (SIGALRM raising :class:`~minigrpo_course.grading.core.GradingTimeout`, a BaseException that
  ``except Exception`` cannot catch) and a hard one in the parent, :data:`GRACE` seconds later, that kills the
  child and everything it started (a bare ``except:`` around a loop, or a loop inside compiled code);
- a child that ends early (``os._exit``, a crash in compiled code) or is killed fails the cell, case or test it
  was in, with one line naming it, and a new child carries on with what was left; a cell that ends the process is
  left out of the notebook for the rest of the grading (the notebook row still runs it, and fails there);
- what the learner's code prints goes to a pipe the parent drains: it keeps the first :data:`OUTPUT_KEPT`
  characters and counts the rest, so a print in a loop cannot fill the memory or the terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

#: seconds past a soft limit before the parent kills the child
GRACE = 10.0
#: soft limit of one exercise cell while the notebook's functions are loaded
CELL_LIMIT = 30.0
#: soft limit of one property test (the slowest, a short A2C run, takes about 20 s on a busy core)
TEST_LIMIT = 120.0
#: at most this many seconds per case of an item (None: each item's own ``time_limit``; the grader's tests shorten it)
CASE_LIMIT: float | None = None
#: characters of the learner's printed output that are kept
OUTPUT_KEPT = 2000
#: the whole grading of one exercise, as a last resort against a hang outside the learner's code
TOTAL_LIMIT = 3600.0


@dataclass
class ItemOutcome:
    """One item's verdict, as the child reported it (or as the parent wrote it when the child died in it)."""

    id: str
    function: str
    passed: bool
    n_passed: int | None  #: None when the grading of the item was cut short
    n_cases: int
    detail: str  #: one line
    report: str = ""  #: the full verdict (``-v``)


@dataclass
class Graded:
    """What the child processes reported for one exercise."""

    items: dict[str, ItemOutcome] = field(default_factory=dict)
    load_errors: list[str] = field(default_factory=list)
    tests: tuple[bool, str] | None = None
    output_chars: int = 0  #: how many characters the child printed (the learner's code, mostly)
    output_head: str = ""  #: the first OUTPUT_KEPT of them


# ----------------------------------------------------------------------------- the parent


class _Drain(threading.Thread):
    """Reads a pipe to its end, keeping the first ``keep`` characters and the last line."""

    def __init__(self, pipe, keep: int = OUTPUT_KEPT):
        super().__init__(daemon=True)
        self.pipe, self.keep, self.head, self.chars, self.tail = pipe, keep, "", 0, ""

    def run(self) -> None:
        while chunk := self.pipe.read1(65536) if hasattr(self.pipe, "read1") else self.pipe.read(65536):
            text = chunk.decode("utf-8", errors="replace")
            if len(self.head) < self.keep:
                self.head += text[: self.keep - len(self.head)]
            self.chars += len(text)
            self.tail = (self.tail + text)[-2000:]

    def last_line(self) -> str:
        lines = [line.strip() for line in self.tail.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child and everything it started (it leads its own process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, OSError):
        proc.kill()
    proc.wait()


def _ended(rc: int) -> str:
    """How a child's exit status reads to a learner."""
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
        return f"was killed by {name} (a crash in compiled code, or out of memory?)"
    return f"ended the grader's process (exit status {rc}: `os._exit({rc})`, or a crash in compiled code)"


_STUCK = ("and could not be interrupted (does a `try/except` around the loop catch the time-out? Let exceptions "
          "through, or give the loop an end)")


def _run_child(spec: dict, graded: Graded) -> dict | None:
    """Run one child on ``spec`` until it finishes, dies or is killed; fold its reports into ``graded``.

    Returns None when the child finished, else what it was doing when it stopped:
    ``{"kind": "cell"|"case"|"test"|None, ..., "why": one line}``."""
    with tempfile.TemporaryDirectory(prefix="minigrpo-sandbox-") as tmp:
        events = Path(tmp) / "events.jsonl"
        events.touch()
        spec = {**spec, "events": str(events)}
        proc = subprocess.Popen([sys.executable, "-m", "minigrpo_course.grading.sandbox", json.dumps(spec)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        drain = _Drain(proc.stdout, keep=max(0, OUTPUT_KEPT - len(graded.output_head)))
        drain.start()
        current, done, killed, offset, buffer = None, False, False, 0, ""
        last_deadline = time.monotonic() + TOTAL_LIMIT
        with open(events, encoding="utf-8") as f:
            while True:
                rc = proc.poll()
                buffer += f.read()
                *lines, buffer = buffer.split("\n")
                for line in lines:
                    event = json.loads(line)
                    kind = event.pop("e")
                    if kind == "start":
                        current = {**event, "deadline": time.monotonic() + event["limit"] + GRACE}
                    elif kind == "end":
                        current = None
                    elif kind == "loaded":
                        graded.load_errors += [e for e in event["errors"] if e not in graded.load_errors]
                    elif kind == "item":
                        graded.items[event["id"]] = ItemOutcome(**event)
                    elif kind == "tests":
                        graded.tests = (event["ok"], event["detail"])
                    elif kind == "done":
                        done = True
                if rc is not None:
                    break
                now = time.monotonic()
                if (current and now > current["deadline"]) or now > last_deadline:
                    _kill(proc)
                    killed = True
                    break
                time.sleep(0.05)
        proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # what the learner's code started and left running
        drain.join(timeout=5)
        graded.output_head += drain.head
        graded.output_chars += drain.chars
    if done and not killed:
        return None
    stopped = dict(current or {"kind": None})
    if killed and current:
        stopped["why"] = f"did not finish within {current['limit']:g} s {_STUCK}"
    elif killed:
        stopped["why"] = f"the grading did not finish within {TOTAL_LIMIT:g} s"
    elif current:
        stopped["why"] = _ended(proc.returncode)
    else:
        stopped["why"] = (f"the grader's child process failed (exit status {proc.returncode})"
                          + (f": {drain.last_line()}" if drain.last_line() else ""))
    return stopped


def _without_cell(path: Path, index: int, folder: Path) -> Path:
    """A copy of the notebook whose cell ``index`` is left out (its source replaced by a comment)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.cells[index].source = f"# EXERCISE (cell {index} left out by the grader: it ended the grader's process)\n"
    copy = folder / Path(path).name
    nbformat.write(nb, copy)
    return copy


def grade_in_child(exercise: str, path: Path, item_ids: list[str], tests: Path | None,
                   cell_limit: float | None = None,
                   test_limit: float | None = None, case_limit: float | None = None) -> Graded:
    """Grade the items ``item_ids`` of ``exercise`` (and run its property tests, the file ``tests``) on the notebook
    at ``path``, in child processes; see the module's docstring. The soft limits are :data:`CELL_LIMIT` per cell,
    :data:`TEST_LIMIT` per property test and each item's own per case (at most ``case_limit`` or
    :data:`CASE_LIMIT`, when given)."""
    cell_limit = CELL_LIMIT if cell_limit is None else cell_limit
    test_limit = TEST_LIMIT if test_limit is None else test_limit
    case_limit = CASE_LIMIT if case_limit is None else case_limit
    from minigrpo_course.grading import get_item
    from minigrpo_course.grading.notebooks import cell_label

    graded = Graded()
    todo, run_tests, source = list(item_ids), tests is not None, Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="minigrpo-notebook-") as folder:
        for _ in range(len(todo) + 40):  # every restart leaves out a cell, an item or the tests
            if not todo and not run_tests:
                break
            spec = {"exercise": exercise, "path": str(source), "original": str(path), "items": todo,
                    "tests": str(tests) if run_tests else None, "cell_limit": cell_limit, "test_limit": test_limit, "case_limit": case_limit,
                    "errors": graded.load_errors}
            stopped = _run_child(spec, graded)
            todo = [i for i in todo if i not in graded.items]
            if stopped is None:
                break
            kind, why = stopped.get("kind"), stopped["why"]
            if kind == "cell":
                import nbformat

                cell = nbformat.read(source, as_version=4).cells[stopped["index"]]
                graded.load_errors.append(f"{cell_label(cell, stopped['index'])} {why}")
                source = _without_cell(source, stopped["index"], Path(tempfile.mkdtemp(dir=folder)))
            elif kind == "case":
                item = get_item(stopped["item"])
                detail = f"stopped at case '{stopped['label']}': your function {why}"
                graded.items[item.id] = ItemOutcome(item.id, item.function, False, None, len(item.cases), detail,
                                                    f"✗ {item.id} {item.function}: {detail}")
                todo = [i for i in todo if i != item.id]
            elif kind == "test":
                graded.tests = (False, f"stopped at {stopped['label']}: your code {why}")
                run_tests = False
            else:  # not in the learner's code: report it on everything left, and stop
                for item_id in todo:
                    item = get_item(item_id)
                    graded.items[item_id] = ItemOutcome(item_id, item.function, False, None, len(item.cases), why)
                if run_tests and graded.tests is None:
                    graded.tests = (False, why)
                break
            if not todo and graded.tests is not None:
                run_tests = False
    return graded


# ----------------------------------------------------------------------------- the child


class _Events:
    """Appends one JSON object a line to the events file, flushed at once (the parent reads it while we run)."""

    def __init__(self, path: str):
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the child's whole life

    def __call__(self, **event) -> None:
        self.file.write(json.dumps(event, ensure_ascii=False) + "\n")
        self.file.flush()

    @contextlib.contextmanager
    def span(self, limit: float, **what):
        """Tell the parent that the learner's code runs from here (with its soft limit), and when it stopped."""
        self(e="start", limit=limit, **what)
        try:
            yield
        finally:
            self(e="end")


def _property_plugin(events: _Events, limit: float):
    import pytest

    from minigrpo_course.grading.core import GradingTimeout, time_limit

    class Plugin:
        def __init__(self):
            self.passed: list[str] = []
            self.failed: list[tuple[str, str]] = []
            self.timed_out: str | None = None

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item):
            name = item.nodeid.split("::", 1)[-1]
            with events.span(limit, kind="test", label=name), time_limit(limit):
                outcome = yield
            exc = outcome.excinfo
            if exc is not None and issubclass(exc[0], GradingTimeout):
                self.timed_out = name
                item.session.shouldstop = "a property test ran out of time"

        def pytest_collectreport(self, report):
            if report.failed:
                self.failed.append(("collecting the tests", _error_line(report.longreprtext)))

        def pytest_runtest_logreport(self, report):
            name = report.nodeid.split("::", 1)[-1]
            if report.failed:
                self.failed.append((name, _error_line(report.longreprtext)))
            elif report.when == "call" and report.passed:
                self.passed.append(name)

    return Plugin()


def _error_line(text: str, width: int = 160) -> str:
    """The assertion message of a pytest failure: its first ``E`` lines, on one line."""
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    line = " ".join(" ".join(lines[:2]).split()) if lines else (text.strip().splitlines() or [""])[-1]
    return line if len(line) <= width else line[: width - 1] + "…"


def property_test_args(tests: Path, notebook: str, rootdir: Path | None = None) -> list[str]:
    """pytest's arguments for an exercise's property tests on a notebook: no terminal output (the plugin keeps the
    outcomes), prints not captured (they go to the parent, which caps them), no shuffling by pytest-randomly, and
    the item tests left out (the items have their own rows)."""
    return [str(tests), "--grade-source", str(notebook), "-p", "no:terminal", "-s", "-p", "no:cacheprovider",
            "-p", "no:randomly", "-o", "addopts=", "--rootdir", str(rootdir or Path(tests).parents[2]),
            "-k", "not test_item"]


def _run_property_tests(spec: dict, events: _Events) -> None:
    import pytest

    from minigrpo_course.progress import repo_root

    tests = Path(spec["tests"])
    plugin = _property_plugin(events, spec["test_limit"])
    code = pytest.main(property_test_args(tests, spec["path"], repo_root()), plugins=[plugin])
    shown = f"tests/grading/{tests.name}"
    total = len(plugin.passed) + len(plugin.failed)
    if plugin.timed_out:
        ok, detail = False, (f"stopped at {plugin.timed_out}: your code did not finish within {spec['test_limit']:g} s: "
                             f"is there an infinite loop? ({len(plugin.passed)} property tests passed before it; the "
                             f"others were not run)")
    elif code == 0:
        ok, detail = True, f"all {len(plugin.passed)} property tests ({shown}) passed"
    elif not plugin.failed:
        ok, detail = False, f"the property tests ({shown}) did not run (pytest exit status {code})"
    else:
        name, message = plugin.failed[0]
        ok, detail = False, (f"{len(plugin.failed)} of {total} property tests failed; first: {name}"
                             + (f": {message}" if message else "")
                             + f" (details: python -m pytest {shown} --grade-source {spec['original']})")
    events(e="tests", ok=ok, detail=detail)


def _child(spec: dict) -> None:
    from minigrpo_course.grading import items
    from minigrpo_course.grading.core import run_item
    from minigrpo_course.grading.notebooks import load_functions

    events = _Events(spec["events"])
    todo = spec["items"]
    if todo:
        loaded = load_functions(spec["path"], seconds=spec["cell_limit"],
                                on_cell=lambda i: events.span(spec["cell_limit"], kind="cell", index=i))
        events(e="loaded", errors=loaded.errors)
        loaded.errors[:0] = spec.get("errors", [])  # what earlier children found (a cell that ended the process)
        for item in items(spec["exercise"]):
            if item.id not in todo:
                continue
            if spec.get("case_limit") is not None and spec["case_limit"] < item.time_limit:
                item = dataclasses.replace(item, time_limit=spec["case_limit"])
            fn = loaded.get(item.function)
            result = run_item(item, fn, watch=lambda item, case: events.span(item.time_limit, kind="case",
                                                                               item=item.id, label=case.name))
            detail = result.summary()
            if fn is None and loaded.errors:
                detail = f"`{item.function}` not defined; {loaded.errors[0]}"
            events(e="item", id=item.id, function=item.function, passed=result.passed, n_passed=result.n_passed,
                   n_cases=len(result.cases), detail=detail, report=result.report())
    if spec["tests"]:
        _run_property_tests(spec, events)
    events(e="done")


if __name__ == "__main__":
    _spec = json.loads(sys.argv[1])
    _spec.setdefault("original", _spec["path"])
    _child(_spec)
    # Leave at once: a learner's thread or atexit hook must not keep the process (or its exit status) hostage.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
