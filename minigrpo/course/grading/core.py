"""The grading engine: items made of cases, compared with a reference, with hints for wrong answers.

An :class:`Item` grades one function a learner writes. Each :class:`Case` says how to call it
(``run(fn) -> result``); the expected result is ``run(reference)``, so an exercise states its
inputs once and the reference implementation supplies the answers. Each :class:`WrongAnswer` is a
typical mistake written as code: when the learner's result equals the mistake's result on a case,
the verdict shows the mistake's hint. The grader's own tests check that every wrong answer fails
its item with its hint, so hints cannot rot.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


#: how a case that stopped at the stub's ``raise NotImplementedError`` is reported
NOT_IMPLEMENTED = "not implemented yet"


class GradingTimeout(Exception):
    """Raised inside a learner's code when it runs past its time limit."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block with :class:`GradingTimeout` after ``seconds`` (wall-clock).

    Uses SIGALRM, so it works in the main thread on Linux and macOS (Jupyter runs cells there).
    Elsewhere the block runs without a limit.
    """
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or seconds is None or seconds <= 0:
        yield
        return

    def _raise(signum, frame):
        raise GradingTimeout(f"did not finish within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Raised:
    """The outcome "calling it raised an exception of this type"."""

    exc_type: type[BaseException]
    message: str = ""

    def __str__(self) -> str:
        return f"raises {self.exc_type.__name__}" + (f" ({self.message})" if self.message else "")


@dataclass
class Case:
    """One input to grade on.

    ``run(fn)`` calls the function under test (fresh inputs each time) and returns what to compare:
    a tensor, number, tuple or dict of them. ``quick`` cases are the ones the notebook's check cell
    runs; the grader runs them all.
    """

    name: str
    inputs: str
    run: Callable[[Callable], Any]
    quick: bool = True
    rtol: float = 1e-5
    atol: float = 1e-6
    hint: str = ""  #: shown when the case fails and no known wrong answer explains the result


@dataclass
class WrongAnswer:
    """A typical mistake, as code, and the hint a learner who made it should read."""

    name: str
    fn: Callable
    hint: str


def checked_by(reference: Callable, mistake: Callable) -> Callable:
    """A typical mistake behind the reference's input checks: calls ``reference`` first (so it raises
    exactly where the reference raises), then returns ``mistake``'s result. The mistake's hint is
    then never shown for a missing ValueError, only for the arithmetic it gets wrong."""

    def wrapped(*args, **kwargs):
        reference(*args, **kwargs)
        return mistake(*args, **kwargs)

    return wrapped


@dataclass
class Item:
    exercise: str  #: "01"
    number: int  #: 1 for item "01.1"
    function: str  #: the name the learner defines in the notebook
    title: str
    reference: Callable
    cases: list[Case]
    wrong_answers: list[WrongAnswer] = field(default_factory=list)
    time_limit: float = 10.0  #: seconds per case

    @property
    def id(self) -> str:
        return f"{self.exercise}.{self.number}"


@dataclass
class CaseResult:
    case: Case
    passed: bool
    message: str = ""
    hint: str = ""


@dataclass
class ItemResult:
    item: Item
    cases: list[CaseResult]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def n_passed(self) -> int:
        return sum(c.passed for c in self.cases)

    @property
    def first_failure(self) -> CaseResult | None:
        """The failing case to show: the first one with a hint, else the first one."""
        failed = [c for c in self.cases if not c.passed]
        with_hint = [c for c in failed if c.hint]
        return (with_hint or failed or [None])[0]

    def summary(self) -> str:
        """One line: the verdict, or the reason of the first failure."""
        if self.passed:
            return "all checks passed"
        f = self.first_failure
        reason = f.message.splitlines()[0] if f.message else "failed"
        return f"case '{f.case.name}': {reason}" + (f" Hint: {f.hint}" if f.hint else "")

    @property
    def not_implemented(self) -> bool:
        """Every case stopped at ``raise NotImplementedError``: the learner has not started."""
        return all(c.message.startswith(NOT_IMPLEMENTED) for c in self.cases)

    def report(self) -> str:
        """The full verdict a learner reads: input, expected, got, hint."""
        head = f"{self.item.id} {self.item.function}"
        if self.passed:
            return f"✓ {head}: all {len(self.cases)} checks passed"
        if self.not_implemented:
            return f"✗ {head}: {self.cases[0].message}"
        f = self.first_failure
        lines = [f"✗ {head}: {self.n_passed}/{len(self.cases)} checks passed", f"  failed case: {f.case.name}",
                 f"  input:       {f.case.inputs}"]
        lines += ["  " + line for line in f.message.splitlines()]
        if f.hint:
            lines.append(f"  hint:        {f.hint}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Comparing results
# ---------------------------------------------------------------------------------------------

def _to_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple, np.ndarray, float, int, np.floating, np.integer)) and not isinstance(x, bool):
        try:
            return torch.as_tensor(np.asarray(x, dtype=np.float64))
        except (TypeError, ValueError):
            return None
    return None


def format_value(x: Any, max_items: int = 8) -> str:
    """A short, stable rendering of a result for a verdict."""
    if isinstance(x, Raised):
        return str(x)
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {format_value(v, max_items)}" for k, v in x.items()) + "}"
    if x is None:
        return "None"
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.ndim == 0:
            return f"tensor({t.item():.4g})"
        flat = [f"{v:.4g}" for v in t.double().reshape(-1)[:max_items].tolist()]
        more = ", …" if t.numel() > max_items else ""
        values = "[" + ", ".join(flat) + more + "]"
        return f"tensor({values}, shape={tuple(t.shape)})" if t.ndim > 1 or more else f"tensor({values})"
    return repr(x)


def compare(got: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-6) -> str | None:
    """None when ``got`` matches ``expected``; otherwise a sentence saying how it differs."""
    if isinstance(expected, Raised):
        if isinstance(got, Raised):
            return None if issubclass(got.exc_type, expected.exc_type) else (
                f"raised {got.exc_type.__name__}, expected a {expected.exc_type.__name__}")
        return f"expected a {expected.exc_type.__name__} to be raised, but it returned {format_value(got)}"
    if isinstance(got, Raised):
        return f"raised {got.exc_type.__name__}: {got.message}"
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"expected a dict with keys {list(expected)}, got {type(got).__name__}"
        for key, exp in expected.items():
            if key not in got:
                return f"missing '{key}'"
            diff = compare(got[key], exp, rtol, atol)
            if diff:
                return f"{key}: {diff}"
        return None
    if expected is None:
        return None if got is None else f"expected None, got {format_value(got)}"
    if isinstance(expected, (bool, str, tuple)) and not isinstance(expected, torch.Tensor):
        if isinstance(expected, tuple) and all(isinstance(e, (int, float)) for e in expected):
            pass  # numeric tuples are compared as tensors below
        else:
            return None if got == expected else f"expected {expected!r}, got {got!r}"
    exp_t, got_t = _to_tensor(expected), _to_tensor(got)
    if got_t is None:
        return f"expected a tensor, got {type(got).__name__}: {format_value(got)}"
    if tuple(got_t.shape) != tuple(exp_t.shape):
        return f"shape {tuple(got_t.shape)} but expected shape {tuple(exp_t.shape)}"
    g, e = got_t.double().cpu(), exp_t.double().cpu()
    if torch.isnan(g).any() and not torch.isnan(e).any():
        return "the result contains NaN"
    if torch.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
        return None
    if not torch.equal(torch.isfinite(g), torch.isfinite(e)):
        return "NaN or inf where the expected result has none (or the other way round)"
    err = torch.where(torch.isfinite(e), (g - e).abs(), torch.zeros_like(e))
    idx = tuple(int(i) for i in (err == err.max()).nonzero()[0]) if err.ndim else ()
    where = f" at index {idx}" if idx else ""
    return f"values differ: max |got − expected| = {err.max().item():.4g}{where}"


def _call(case: Case, fn: Callable, seconds: float) -> Any:
    """Run a case; exceptions become :class:`Raised` (timeouts and NotImplementedError re-raise)."""
    try:
        with time_limit(seconds):
            return case.run(fn)
    except (GradingTimeout, NotImplementedError):
        raise
    except Exception as exc:  # noqa: BLE001 - any exception of the learner's code is a result
        return Raised(type(exc), str(exc).splitlines()[0] if str(exc) else "")


def run_case(item: Item, case: Case, fn: Callable) -> CaseResult:
    expected = _call(case, item.reference, seconds=0)
    try:
        got = _call(case, fn, item.time_limit)
    except NotImplementedError:
        return CaseResult(case, False, f"{NOT_IMPLEMENTED}: replace `raise NotImplementedError` with your code")
    except GradingTimeout:
        return CaseResult(case, False, f"did not finish within {item.time_limit:g} s: is there an infinite loop?")
    diff = compare(got, expected, case.rtol, case.atol)
    if diff is None:
        return CaseResult(case, True)
    message = f"expected:    {format_value(expected)}\ngot:         {format_value(got)}\nproblem:     {diff}"
    hint = case.hint
    for wrong in item.wrong_answers:
        try:
            wrong_result = _call(case, wrong.fn, seconds=0)
        except Exception:  # noqa: BLE001
            continue
        if compare(wrong_result, expected, case.rtol, case.atol) is not None and \
                compare(got, wrong_result, case.rtol, case.atol) is None:
            hint = wrong.hint
            break
    return CaseResult(case, False, message, hint)


def run_item(item: Item, fn: Callable | None, quick: bool = False) -> ItemResult:
    """Grade ``fn`` on the item's cases (only the quick ones if ``quick``)."""
    cases = [c for c in item.cases if c.quick or not quick]
    if fn is None:
        msg = f"no function named `{item.function}` was defined (did its cell run without errors?)"
        return ItemResult(item, [CaseResult(c, False, msg) for c in cases])
    results: list[CaseResult] = []
    for case in cases:
        if results and results[-1].message.startswith("did not finish"):
            # One time-out is enough: don't make the learner wait for every remaining case.
            results.append(CaseResult(case, False, "not run: an earlier case ran out of time"))
        else:
            results.append(run_case(item, case, fn))
    return ItemResult(item, results)
