"""The grading engine: items made of cases, compared with a reference, with hints for wrong answers.

An :class:`Item` grades one function a learner writes. A :class:`Case` is data: the arguments to call
it with. From that one piece of data the engine both makes the call and writes the verdict's "input"
line, so the two cannot drift apart:

    Case("discounting, γ = 0.5", (torch.tensor([1.0, 1.0, 1.0]), 0.5))
    # input:  rewards=tensor([1., 1., 1.]), gamma=0.5          (names from the reference's signature)

- Every call gets fresh copies (tensors cloned): a function that edits its inputs in place cannot
  change the reference's answer, a typical mistake's, or the next case's inputs.
- An input too large to show is :class:`Made` by a builder, shown as the call that builds it
  (``randn(64, 4, seed=1)``) and built afresh for every call; a :class:`Spread` builder returns several
  arguments at once (``(logp, old_logp, advantages) = ppo_batch(seed=1)``).
- A case that needs more than "call it, compare what it returns" names a :class:`Call` (e.g.
  :func:`grads`: compare the loss and its gradient), which says in words what it does.

The expected result is the reference's. Numbers are compared with ``torch.testing.assert_close``
(``rtol``/``atol`` per case); its report (mismatched elements, greatest absolute and relative
difference) goes into the verdict under "expected" and "got". Each :class:`WrongAnswer` is a typical
mistake written as code: when the learner's results equal the mistake's on every case (a hint must
not name a mistake the learner did not make), the verdict shows the mistake's hint; a result that is
right but for float32 rounding gets a precision hint instead of a case's own. The grader's own tests
check that every wrong answer fails its item with its hint, so hints cannot rot.

The learner's call gets fresh copies too, and the engine checks them afterwards: a function that
returns the right result but overwrote its caller's tensor (``rewards -= rewards.mean()``) fails.
"""

from __future__ import annotations

import copy
import inspect
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

#: how a case that stopped at the stub's ``raise NotImplementedError`` is reported
NOT_IMPLEMENTED = "not implemented yet"

#: a tensor with more elements is shown by its first ones and its shape
SHOW_ITEMS = 12


class GradingTimeout(BaseException):
    """Raised inside a learner's code when it runs past its time limit.

    A BaseException, like KeyboardInterrupt, so that a learner's ``try: ... except Exception:`` (around a loop that
    never ends, say) cannot swallow it. A bare ``except:`` still can: ``minigrpo grade`` therefore runs the learner's
    code in a child process that it kills past the limit (:mod:`minigrpo_course.grading.sandbox`)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block with :class:`GradingTimeout` after ``seconds`` (wall-clock), and again every second
    after that until the block ends (in case the first one was swallowed).

    Uses SIGALRM, so it works in the main thread on Linux and macOS (Jupyter runs cells there).
    Elsewhere the block runs without a limit.
    """
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or seconds is None or seconds <= 0:
        yield
        return

    def _raise(signum, frame):
        raise GradingTimeout(f"did not finish within {seconds:g} s")

    # Nested limits (a property test's, around the cells the learner's notebook runs inside it): the inner one
    # never outlasts the outer one, and the outer one resumes with what is left of it.
    outer, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer) if outer > 0 else seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-3), outer_interval)


# --- Showing values (inputs and results alike)

def _number(v: Any, whole: str = ".") -> str:
    """4 significant digits; a whole float keeps a mark of being one (``1.`` in a tensor, ``1.0`` alone)."""
    if isinstance(v, bool) or not isinstance(v, float):
        return repr(v)
    text = f"{v:.4g}"
    return text if any(c in text for c in ".ein") else text + whole


def _nested(values: Any) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v) for v in values) + "]"
    return _number(values)


def _show_tensor(x: torch.Tensor) -> str:
    t = x.detach().cpu()
    dtype = "" if t.dtype in (torch.float32, torch.int64, torch.bool) else ", " + str(t.dtype).removeprefix("torch.")
    if t.numel() <= SHOW_ITEMS:
        return f"tensor({_nested(t.tolist())}{dtype})"
    first = ", ".join(_number(v) for v in t.reshape(-1)[:SHOW_ITEMS].tolist())
    return f"tensor([{first}, …], shape={tuple(t.shape)}{dtype})"


def show(x: Any) -> str:
    """A short, stable rendering of an input or a result: values of small tensors, with their dtype
    when it is not the default; the first values and the shape of large ones; builders as calls."""
    if isinstance(x, torch.Tensor):
        return _show_tensor(x)
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in x.items()) + "}"
    if isinstance(x, tuple):
        return "(" + ", ".join(show(v) for v in x) + ("," if len(x) == 1 else "") + ")"
    if isinstance(x, list):
        return "[" + ", ".join(show(v) for v in x) + "]"
    if isinstance(x, (Made, Raised)):
        return str(x)
    if isinstance(x, float):
        return _number(x, whole=".0")
    if callable(x):
        return getattr(x, "__name__", type(x).__name__)
    return repr(x)


# --- Cases as data

class Made:
    """An input built afresh each time a case runs, shown as the call that builds it:
    ``Made(randn, 60, seed=1)`` is shown ``randn(60, seed=1)``."""

    spread = False

    def __init__(self, fn: Callable, *args, **kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def build(self) -> Any:
        return self.fn(*fresh(self.args), **fresh(self.kwargs))

    def __str__(self) -> str:
        shown = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs.items()]
        return f"{self.fn.__name__}({', '.join(shown)})"

    __repr__ = __str__


class Spread(Made):
    """A :class:`Made` whose builder returns a tuple: its items fill consecutive positional arguments."""

    spread = True


def fresh(x: Any) -> Any:
    """A copy of a case's data for one call: builders run, tensors cloned, containers copied."""
    if isinstance(x, Made):
        return x.build()
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(fresh(v) for v in x)
    if isinstance(x, dict):
        return {k: fresh(v) for k, v in x.items()}
    return copy.deepcopy(x)  # numbers and strings; functions are returned as they are


@dataclass
class Inputs:
    """A case's arguments, made afresh for one call, and the reference's names for the positional ones."""

    args: list
    kwargs: dict
    names: list[str]

    def __call__(self, fn: Callable) -> Any:
        return fn(*self.args, **self.kwargs)

    def __getitem__(self, name: str) -> Any:
        return self.kwargs[name] if name in self.kwargs else self.args[self.names.index(name)]


@dataclass(frozen=True)
class Call:
    """How a case uses the function when "call it, compare what it returns" is not the whole story:
    ``run(fn, inputs)`` returns what to compare; ``text`` says what it does, after the inputs."""

    run: Callable[[Callable, Inputs], Any]
    text: str


def grads(*compared: str, value: bool = True, requires_grad: tuple[str, ...] | None = None) -> Call:
    """Call with the arguments ``requires_grad`` (default: ``compared``) requiring grad, backpropagate
    from the returned loss, and compare the loss (if ``value``) and d loss / d each ``compared``
    argument (zeros where no gradient arrived, as for a detached input)."""
    leaves = tuple(requires_grad or compared)

    def run(fn: Callable, inputs: Inputs) -> dict:
        for name in leaves:
            inputs[name].requires_grad_(True)
        loss = inputs(fn)
        loss.backward()
        out = {"loss": loss.detach()} if value else {}
        for name in compared:
            grad = inputs[name].grad
            out[f"d loss / d {name}"] = torch.zeros_like(inputs[name]) if grad is None else grad
        return out

    what = (["the loss"] if value else []) + [f"d loss / d {name}" for name in compared]
    extra = f"with {', '.join(leaves)} requiring grad; " if set(leaves) != set(compared) else ""
    return Call(run, f"{extra}compared: {' and '.join(what)}")


@dataclass
class Case:
    """One input to grade on: ``fn(*args, **kwargs)``, or ``call.run(fn, inputs)`` when given.

    ``quick`` cases are the ones the notebook's check cell runs; the grader runs them all. ``hint`` is
    shown when the case fails and no known wrong answer explains the result.
    """

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    call: Call | None = None
    quick: bool = True
    rtol: float = 1e-5
    atol: float = 1e-6
    hint: str = ""


# --- Builders shared by the exercises (deterministic: seeded, float64)

def f64(data) -> torch.Tensor:
    return torch.tensor(data, dtype=torch.float64)


def randn(*shape: int, seed: int) -> torch.Tensor:
    """Standard-normal float64 values from their own generator."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def with_ratios(old_logp, ratios) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, old_logp) with logp = old_logp + log(ratios), so that the ratios are known exactly
    (float32 from lists; a tensor ``old_logp`` keeps its dtype)."""
    old = torch.as_tensor(old_logp)
    return old + torch.log(torch.as_tensor(ratios, dtype=old.dtype)), old


def random_flags(*shape: int, p: float, seed: int) -> torch.Tensor:
    """A bool tensor, each entry True with probability ``p``."""
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < p


# --- Items, wrong answers, results

@dataclass(frozen=True)
class Raised:
    """The outcome "calling it raised an exception of this type"."""

    exc_type: type[BaseException]
    message: str = ""

    def __str__(self) -> str:
        return f"raises {self.exc_type.__name__}" + (f" ({self.message})" if self.message else "")


@dataclass
class WrongAnswer:
    """A typical mistake, as code, and the hint a learner who made it should read.

    ``quick``: the check cell's quick cases catch it; False for a mistake only the grader's full set of
    cases (``quick=False`` cases: μ > 1, a moved reference, integer inputs, ...) can see."""

    name: str
    fn: Callable
    hint: str
    quick: bool = True


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
    #: outcomes of the reference and of the typical mistakes, by (case, function): they are deterministic
    #: (fresh inputs each call), and a failing item compares the learner with every mistake on every case
    _outcomes: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def id(self) -> str:
        return f"{self.exercise}.{self.number}"

    def names(self, n: int) -> list[str]:
        """The reference's names for ``n`` positional arguments."""
        try:
            params = [p.name for p in inspect.signature(self.reference).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        return [params[i] if i < len(params) else f"arg{i}" for i in range(n)]

    def inputs(self, case: Case) -> Inputs:
        """Fresh arguments for one call of ``case``."""
        args = []
        for a in case.args:
            if isinstance(a, Made) and a.spread:
                args.extend(a.build())
            else:
                args.append(fresh(a))
        return Inputs(args, fresh(case.kwargs), self.names(len(args)))

    def input_parts(self, case: Case) -> list[tuple[str | tuple[str, ...], str]]:
        """The case's arguments as (name, shown value) pairs; a :class:`Spread` fills a tuple of names."""
        sizes = [len(a.build()) if isinstance(a, Made) and a.spread else 0 for a in case.args]  # 0: not spread
        names = iter(self.names(sum(max(k, 1) for k in sizes)))
        parts = [(tuple(next(names) for _ in range(k)), str(a)) if k else (next(names), show(a))
                 for a, k in zip(case.args, sizes)]
        return parts + [(name, show(v)) for name, v in case.kwargs.items()]

    def describe(self, case: Case) -> str:
        """The verdict's "input" line, made from the same data as the call."""
        shown = [f"{name}={text}" if isinstance(name, str) else f"({', '.join(name)}) = {text}"
                 for name, text in self.input_parts(case)]
        text = ", ".join(shown)
        if case.call:
            return f"{text}; {case.call.text}" if text else case.call.text
        return text or "no arguments"


@dataclass
class CaseResult:
    case: Case
    passed: bool
    message: str = ""  #: the lines under "input" in the verdict
    hint: str = ""
    reason: str = ""  #: one line: why it failed
    got: Any = None  #: what the learner's function gave (for the diagnosis of the whole item)
    expected_text: str = ""  #: the reference's result, shown
    got_text: str = ""  #: the learner's result, shown
    diagnosed: bool = False  #: the hint is a typical mistake's that reproduces the learner's results


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
        """The failing case to show, with a hint only where the hint explains the failures: a hint that every failing
        case shares; else the first case of the typical mistake that reproduces every value the learner's function
        returned; else simply the first failing case (with its own hint, if it has one). Never a later case picked
        for having a hint, which would explain one case and not the others."""
        failed = [c for c in self.cases if not c.passed]
        if not failed:
            return None
        for c in failed:
            if c.hint and all(d.hint == c.hint for d in failed):
                return c
        diagnosed = [c for c in failed if c.diagnosed]
        return (diagnosed or failed)[0]

    def summary(self) -> str:
        """One line: the verdict, or the reason of the first failure."""
        if self.passed:
            return "all checks passed"
        f = self.first_failure
        reason = f.reason or (f.message.splitlines()[0] if f.message else "failed")
        shown = f" Yours: {_short(f.got_text)}; expected: {_short(f.expected_text)}." if f.got_text else ""
        stop = "" if reason.endswith((".", ":", "?", "!")) else "."
        return f"case '{f.case.name}': {reason}{stop}{shown}" + (f" Hint: {f.hint}" if f.hint else "")

    @property
    def not_implemented(self) -> bool:
        """Every case stopped at ``raise NotImplementedError``: the learner has not started."""
        return all(c.message.startswith(NOT_IMPLEMENTED) for c in self.cases)

    def report(self) -> str:
        """The full verdict a learner reads: input, expected, got, what differs, hint."""
        head = f"{self.item.id} {self.item.function}"
        if self.passed:
            return f"✓ {head}: all {len(self.cases)} checks passed"
        if self.not_implemented:
            return f"✗ {head}: {self.cases[0].message}"
        f = self.first_failure
        lines = [f"✗ {head}: {self.n_passed}/{len(self.cases)} checks passed", f"  failed case: {f.case.name}",
                 f"  input:       {self.item.describe(f.case)}"]
        lines += ["  " + line for line in f.message.splitlines()]
        if f.hint:
            lines.append(f"  hint:        {f.hint}")
        return "\n".join(lines)


# --- Comparing results

def _as_tensor(x: Any) -> torch.Tensor | None:
    """A tensor, number or (nested) list of numbers as a tensor (Python numbers as float64); else None."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, bool) or x is None or isinstance(x, (str, dict, set, frozenset)):
        return None
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError):
        return None
    if arr.dtype.kind == "b":
        return torch.as_tensor(arr)
    return torch.as_tensor(arr, dtype=torch.float64) if arr.dtype.kind in "iuf" else None


def _is_numeric(x: Any) -> bool:
    if isinstance(x, tuple):  # a tuple of labels (a sorted answer) is compared for equality
        return bool(x) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)
    return _as_tensor(x) is not None


_LONG_FLOAT = re.compile(r"-?\d+\.\d{5,}(?:e[-+]?\d+)?")


def _not_close(got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> str | None:
    """None when ``torch.testing.assert_close`` accepts ``got``; else its report, one finding a line
    (numbers to 4 digits), after a sentence that names NaN or inf where they differ."""
    try:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False)
        return None
    except AssertionError as exc:
        report = [line for line in str(exc).splitlines()[1:] if line.strip() and not line.startswith("Expected ")]
    lines = [_LONG_FLOAT.sub(lambda m: f"{float(m.group()):.4g}", line[0].lower() + line[1:]) for line in report]
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        head = "the result contains NaN"
    elif not torch.equal(torch.isfinite(got), torch.isfinite(expected)):
        head = "NaN or inf where the expected result has none (or the other way round)"
    else:
        head = "values differ"
    return "\n".join([f"{head}: {lines[0]}", *lines[1:]]) if lines else head


def compare(got: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-6) -> str | None:
    """None when ``got`` matches ``expected``; otherwise what differs (first line: a sentence)."""
    if isinstance(expected, Raised):
        if isinstance(got, Raised):
            return None if issubclass(got.exc_type, expected.exc_type) else (
                f"raised {got.exc_type.__name__}, expected a {expected.exc_type.__name__}")
        return f"expected a {expected.exc_type.__name__} to be raised, but it returned {show(got)}"
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
        return None if got is None else f"expected None, got {show(got)}"
    if not _is_numeric(expected):
        return None if got == expected else f"expected {expected!r}, got {got!r}"
    e, g = _as_tensor(expected), _as_tensor(got)
    if g is None:
        return f"expected a tensor or a number, got {type(got).__name__}: {show(got)}"
    if g.shape != e.shape:
        return f"shape {tuple(g.shape)}, but expected shape {tuple(e.shape)}"
    if (g.dtype == torch.bool) != (e.dtype == torch.bool):
        return f"dtype {g.dtype}, but expected {e.dtype}"
    return _not_close(g, e, rtol, atol)


# --- Running cases

def outcome(item: Item, case: Case, fn: Callable, seconds: float = 0, inputs: Inputs | None = None) -> Any:
    """What ``fn`` gives on fresh inputs of ``case`` (or on ``inputs``): its result, or a :class:`Raised`
    (timeouts and NotImplementedError re-raise)."""
    inputs = item.inputs(case) if inputs is None else inputs
    try:
        with time_limit(seconds):
            return case.call.run(fn, inputs) if case.call else inputs(fn)
    except (GradingTimeout, NotImplementedError):
        raise
    except SystemExit as exc:  # sys.exit() in the learner's function: a failure of that case, not the grader's end
        return Raised(SystemExit, f"the function called sys.exit({'' if exc.code is None else repr(exc.code)})")
    except Exception as exc:  # noqa: BLE001 - any exception of the learner's code is a result
        return Raised(type(exc), str(exc).splitlines()[0] if str(exc) else "")


def _short(text: str, width: int = 60) -> str:
    """A shown result cut to one short line for the score table."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _cached(item: Item, case: Case, key: str, fn: Callable) -> Any:
    """``outcome(item, case, fn)``, computed once per item, case and function (``key`` names the function)."""
    slot = (id(case), key)
    if slot not in item._outcomes:
        try:
            item._outcomes[slot] = outcome(item, case, fn)
        except (Exception, GradingTimeout) as exc:  # noqa: BLE001 - a mistake that times out or stops explains nothing
            item._outcomes[slot] = Raised(type(exc), "")
    return item._outcomes[slot]


def _same_data(a: Any, b: Any) -> bool:
    """Exactly equal input data (NaN equal to NaN); functions and other objects are not compared."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = a.detach(), b.detach()
        if a.is_floating_point() or a.is_complex():
            return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same_data(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_data(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, (int, float, str, bool)) or a is None:
        return a == b
    return True


def _edited_inputs(item: Item, case: Case, used: Inputs) -> list[str]:
    """The names of the arguments that the call changed in place (compared with freshly made ones)."""
    pristine = item.inputs(case)
    names = [*used.names, *used.kwargs]
    values = [*used.args, *used.kwargs.values()]
    before = [*pristine.args, *pristine.kwargs.values()]
    return [name for name, now, then in zip(names, values, before) if not _same_data(now, then)]


IN_PLACE_HINT = ("work on a copy: `x = x.clone()` first, or out-of-place operations (`x = x + 1`, not `x += 1`, "
                 "`x.add_(1)` or `x[i] = …`). The caller still needs its tensor: a rollout's rewards or masks are "
                 "used again after your function returns.")

#: the loose tolerance at which a result counts as "right but for float32 rounding": each difference at most this
#: share of the largest expected magnitude (rounding errors of sums and recursions scale with it)
FLOAT32_RTOL, FLOAT32_ATOL = 1e-4, 1e-5


def _float_dtypes(x: Any) -> set[torch.dtype]:
    """The floating dtypes of the tensors in a result (a tensor, or a dict/list/tuple of them)."""
    if isinstance(x, torch.Tensor):
        return {x.dtype} if x.is_floating_point() else set()
    values = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    return set().union(*(_float_dtypes(v) for v in values))


def _has_flags(inputs: Inputs | None) -> bool:
    """Some input is a bool or integer tensor (episode-end flags, a mask)."""
    if inputs is None:
        return False
    values = [*inputs.args, *inputs.kwargs.values()]
    return any(isinstance(v, torch.Tensor) and not v.is_floating_point() and v.numel() > 1 for v in values)


def precision_hint(case: Case, got: Any = None, inputs: Inputs | None = None) -> str:
    """The hint for a result that is right but for float32 rounding, naming the way float32 got in: a float32
    result (the computation was cast down), or a float64 result that a float32 tensor took part in (a mask made
    from the flags, which rounds γ when multiplied by it, or a new tensor made without a dtype)."""
    head = (f"your result agrees with the expected one only to float32 precision, and this case checks its float64 "
            f"inputs to rtol={case.rtol:g}, atol={case.atol:g}: ")
    if torch.float32 in _float_dtypes(got) or torch.float16 in _float_dtypes(got) or \
            torch.bfloat16 in _float_dtypes(got):
        return head + ("your result is float32, so the computation was cast down. Compute in the inputs' dtype: no "
                       "`.float()`, no `torch.tensor(..., dtype=torch.float32)`, and make new tensors with it "
                       "(`torch.zeros_like(x)` or `dtype=x.dtype`; `torch.zeros(n)` alone is float32).")
    text = head + "your result is float64, but a float32 tensor took part in computing it and rounded what it touched"
    if _has_flags(inputs):
        return text + (": most likely a mask made from the flags. `1 − terminated.float()` is float32, and so is "
                       "`gamma * ~terminated` (a Python number times a bool tensor), which rounds γ to float32 "
                       "before it meets the float64 values. Make the mask in the values' dtype, "
                       "`(~terminated).to(values.dtype)`, or use `torch.where(terminated, 0.0, next_values)`.")
    return text + (": a tensor made without a dtype (`torch.zeros(n)`, `torch.tensor([...])` of Python floats) or a "
                   "`.float()` somewhere. Make new tensors with the inputs' dtype (`torch.zeros_like(x)` or "
                   "`dtype=x.dtype`).")


def _float32_close(got: Any, expected: Any, case: Case) -> bool:
    """True when ``got`` differs from ``expected`` only by float32 rounding (each difference at most
    ``FLOAT32_RTOL`` of the largest expected magnitude, which is how rounding errors of a recursion or a sum
    scale, plus ten times the case's atol) and the case asks for more."""
    if case.rtol >= FLOAT32_RTOL and case.atol >= FLOAT32_ATOL:
        return False
    if isinstance(expected, dict):
        return isinstance(got, dict) and expected.keys() <= got.keys() and \
            all(_float32_close(got[k], expected[k], case) for k in expected)
    e, g = _as_tensor(expected), _as_tensor(got)
    if e is None or g is None or e.shape != g.shape or e.dtype == torch.bool or not torch.isfinite(e).all():
        return False
    e, g = e.double(), g.double()
    scale = e.abs().max() if e.numel() else torch.zeros((), dtype=torch.float64)
    return bool(((g - e).abs() <= FLOAT32_RTOL * scale + 10 * case.atol).all())


def run_case(item: Item, case: Case, fn: Callable, watch: Callable | None = None) -> CaseResult:
    """Grade ``fn`` on one case. ``watch(item, case)``, when given, is a context manager around the call into the
    learner's code (the grader's child process reports each call to its parent with it)."""
    expected = _cached(item, case, "reference", item.reference)
    inputs = item.inputs(case)
    try:
        with watch(item, case) if watch else nullcontext():
            got = outcome(item, case, fn, item.time_limit, inputs=inputs)
    except NotImplementedError:
        return CaseResult(case, False, f"{NOT_IMPLEMENTED}: replace `raise NotImplementedError` with your code")
    except GradingTimeout:
        return CaseResult(case, False, f"did not finish within {item.time_limit:g} s: is there an infinite loop?")
    diff = compare(got, expected, case.rtol, case.atol)
    expected_text, got_text = show(expected), show(got)
    if diff is None:
        edited = _edited_inputs(item, case, inputs)
        if not edited:
            return CaseResult(case, True, got=got)
        which = ", ".join(f"`{name}`" for name in edited)
        reason = f"the result is right, but your function changed its input {which} in place"
        message = "\n".join([f"expected:    {expected_text}", f"got:         {got_text}", f"problem:     {reason}"])
        return CaseResult(case, False, message, IN_PLACE_HINT, reason, got, expected_text, got_text)
    problem = diff.splitlines()
    message = "\n".join([f"expected:    {expected_text}", f"got:         {got_text}", f"problem:     {problem[0]}",
                         *(" " * 13 + line for line in problem[1:])])
    key = diff.split(":", 1)[0] if isinstance(expected, dict) and isinstance(got, dict) else None
    if key is not None and key in expected and key in got:  # the score table shows the part that differs
        expected_text, got_text = f"{key}: {show(expected[key])}", f"{key}: {show(got[key])}"
    hint = precision_hint(case, got, inputs) if _float32_close(got, expected, case) else case.hint
    return CaseResult(case, False, message, hint, problem[0], got, expected_text, got_text)


def _diagnose(item: Item, results: list[CaseResult]) -> None:
    """Give the failing cases the hint of the typical mistake that explains the learner's results.

    A mistake explains them when it gives the learner's result on every case whose expected result is a value and
    where the learner's function returned one (refusals are judged by their own cases; a case where the learner's
    function raised, an integer input it could not take say, keeps its own hint), and is wrong on some of them. A
    learner whose results fit no single mistake gets each case's own hint (or the precision hint) rather than the
    hint of a mistake they did not make."""
    ran = [r for r in results if r.message[:len(NOT_IMPLEMENTED)] != NOT_IMPLEMENTED and
           not r.message.startswith(("did not finish", "not run"))]
    failing = [r for r in ran if not r.passed and not r.reason.endswith("in place")]
    if not failing or len(ran) != len(results):
        return
    valued = [r for r in ran if not isinstance(_cached(item, r.case, "reference", item.reference), Raised)]
    fits = []  # (mistake, the cases it gets wrong) for every mistake that gives all the learner's results
    for wrong in item.wrong_answers:
        wrong_on = set()
        for r in valued:
            theirs = _cached(item, r.case, f"wrong:{wrong.name}", wrong.fn)
            # the same mistake computed in float32 is still that mistake
            if compare(r.got, theirs, r.case.rtol, r.case.atol) is not None and \
                    not _float32_close(r.got, theirs, r.case):
                if isinstance(r.got, Raised):
                    continue  # an exception the mistake does not raise is judged by its case's own hint
                break
            expected = _cached(item, r.case, "reference", item.reference)
            if compare(theirs, expected, r.case.rtol, r.case.atol) is not None:
                wrong_on.add(id(r.case))
        else:
            if wrong_on:
                fits.append((wrong, wrong_on))
    if not fits:
        return
    # A mistake that reproduces more of the failures explains them better (one that matches only where the
    # learner's function raised, and is silent elsewhere, is a weaker fit).
    most = max(len(on) for _, on in fits)
    fits = [(w, on) for w, on in fits if len(on) == most]
    # Two mistakes can give the same results on these cases (the grader's full set tells more of them apart):
    # name them all rather than guess.
    hint = fits[0][0].hint if len(fits) == 1 else "these cases cannot tell which of these mistakes you made: " + \
        " — or: ".join(f"({i}) {w.hint}" for i, (w, _) in enumerate(fits, 1))
    for r in failing:
        if any(id(r.case) in on for _, on in fits):
            r.hint, r.diagnosed = hint, True


def run_item(item: Item, fn: Callable | None, quick: bool = False, watch: Callable | None = None) -> ItemResult:
    """Grade ``fn`` on the item's cases (only the quick ones if ``quick``); ``watch``: see :func:`run_case`."""
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
            results.append(run_case(item, case, fn, watch))
    _diagnose(item, results)
    return ItemResult(item, results)
