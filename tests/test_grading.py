"""The grading machinery: verdicts, hints, time limits, exercise generation and the CI invariants
(solutions pass, pristine exercises fail every graded item, exercises/ in sync with solutions/)."""

import contextlib
import copy
import dataclasses
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from minigrpo_course.colab import content_cells
from minigrpo_course.debugging.buggy_step import BUGS
from minigrpo_course.grading import ex07
from minigrpo_course.grading import (
                                     EXERCISES,
                                     CheckFailed,
                                     Raised,
                                     check,
                                     compare,
                                     get_item,
                                     grade,
                                     items,
                                     run_item,
                                     time_limit,
                                     )
from minigrpo_course.grading.core import IN_PLACE_HINT, Case, GradingTimeout, Item, Made, Spread, fresh, outcome
from minigrpo_course.grading.notebooks import (
                                               exercise_text,
                                               find_notebook,
                                               load_functions,
                                               make_exercise_notebook,
                                               stale_exercises,
                                               )

ROOT = Path(__file__).resolve().parents[1]
ALL_ITEMS = [item for _, (_, its) in sorted(EXERCISES.items()) for item in its]


# ----------------------------------------------------------------------------- comparing results

def test_compare_tensors():
    assert compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) is None
    assert compare(torch.ones(3, 1), torch.ones(3)) == "shape (3, 1), but expected shape (3,)"
    assert compare(torch.ones(2), torch.ones(2, dtype=torch.bool)) == "dtype torch.float32, but expected torch.bool"
    assert compare(torch.ones(2, dtype=torch.float64), torch.ones(2)) is None  # float widths may differ
    assert compare(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0])).splitlines() == [
        "values differ: mismatched elements: 1 / 2 (50.0%)",
        "greatest absolute difference: 0.5 at index (1,) (up to 1e-06 allowed)",
        "greatest relative difference: 0.25 at index (1,) (up to 1e-05 allowed)"]
    assert compare(torch.tensor([float("nan")]), torch.tensor([1.0])).startswith("the result contains NaN: ")
    assert compare([1.0, 2.0], torch.tensor([1.0, 2.0])) is None  # array-likes are accepted
    assert compare(3, 3.0) is None and compare(2**34, float(2**34 + 1), rtol=0, atol=0.5) is not None


def test_compare_exceptions_and_dicts():
    assert compare(Raised(ValueError), Raised(ValueError)) is None
    assert "expected a ValueError" in compare(torch.ones(1), Raised(ValueError))
    assert "raised TypeError" in compare(Raised(TypeError, "boom"), torch.ones(1))
    assert compare({"loss": 1.0, "grad": torch.ones(2)}, {"loss": 1.0, "grad": torch.zeros(2)}).startswith("grad: ")
    assert compare(("a", "b"), ("a", "b")) is None and "expected ('a',)" in compare(("b",), ("a",))


def _doubling(*cases):
    return Item("99", 1, "double", "twice x", reference=lambda x: 2 * x, cases=list(cases))


@pytest.mark.parametrize("rtol,atol", [(0.0, 1e-3), (1e-3, 0.0), (1e-4, 1e-4)])
def test_each_case_tolerance_is_honoured_just_inside_and_just_outside(rtol, atol):
    """assert_close's rule |got − expected| ≤ atol + rtol·|expected|, with the case's own rtol and atol."""
    item = _doubling(Case("a vector", (torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64),), rtol=rtol, atol=atol))
    allowed = atol + rtol * 8.0  # at the largest element, 2·4

    def off_by(d):
        return lambda x: 2 * x + torch.tensor([0.0, 0.0, d], dtype=torch.float64)

    assert run_item(item, off_by(0.9 * allowed)).passed
    assert run_item(item, off_by(-0.9 * allowed)).passed
    outside = run_item(item, off_by(1.1 * allowed))
    assert not outside.passed
    report = outside.report()
    assert "problem:     values differ: mismatched elements: 1 / 3 (33.3%)" in report
    assert f"greatest absolute difference: {1.1 * allowed:.4g} at index (2,) (up to {atol} allowed)" in report
    assert "greatest relative difference: " in report and f"(up to {rtol} allowed)" in report


def test_the_same_result_passes_a_loose_case_and_fails_a_strict_one():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    item = _doubling(Case("loose", (x,), rtol=0, atol=1e-2), Case("strict", (x,), rtol=0, atol=1e-4))
    result = run_item(item, lambda x: 2 * x + 1e-3)
    assert [c.passed for c in result.cases] == [True, False]


# ----------------------------------------------------------------------------- cases as data

def test_the_input_line_names_each_argument_as_the_reference_does():
    def reference(rewards, gamma, *, scale="group"):
        return rewards

    def pair(n, seed):
        return torch.zeros(n), torch.ones(n)

    item = Item("99", 1, "f", "f", reference=reference, cases=[
        Case("data", (torch.tensor([1.0, 2.5]), 0.5), {"scale": "batch"}),
        Case("built", (Made(torch.ones, 200), 1.0)),
        Case("spread", (Spread(pair, 3, seed=1),)),
        Case("float64, bool, int", (torch.tensor([0.1], dtype=torch.float64), torch.tensor([[True, False]]))),
    ])
    assert [item.describe(c) for c in item.cases] == [
        "rewards=tensor([1., 2.5]), gamma=0.5, scale='batch'", "rewards=ones(200), gamma=1.0",
        "(rewards, gamma) = pair(3, seed=1)", "rewards=tensor([0.1], float64), gamma=tensor([[True, False]])"]


_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                                       torch.int32, torch.int64, torch.bool)}


def _builders(x, found):
    """Every builder a case's data names, by the name its input line uses."""
    if isinstance(x, Made):
        found[x.fn.__name__] = x.fn
        _builders((x.args, x.kwargs), found)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _builders(v, found)
    elif isinstance(x, dict):
        _builders(list(x.values()), found)
    return found


def _received(item, case):
    """The arguments a function receives on ``case``, by the reference's names (None: it is not called with them)."""
    seen = []

    def spy(*args, **kwargs):
        seen.append({**dict(zip(item.names(len(args)), args)), **kwargs})
        raise RuntimeError("recorded")

    outcome(item, case, spy)
    return seen[0] if seen else None


def _same(shown, got):
    """``shown`` (evaluated from the input line) is ``got`` up to the 4 significant digits a verdict prints."""
    if isinstance(got, torch.Tensor):
        got = got.detach()
        if shown.dtype != got.dtype or shown.shape != got.shape:
            return False
        if not got.is_floating_point():
            return torch.equal(shown, got)
        return torch.allclose(shown, got, rtol=1e-3, atol=0, equal_nan=True)
    if isinstance(got, (list, tuple)):
        return len(shown) == len(got) and all(_same(a, b) for a, b in zip(shown, got))
    if isinstance(got, float):
        return math.isclose(shown, got, rel_tol=1e-3)
    if callable(got):
        return callable(shown)
    return shown == got


CASES = [(item, case) for item in ALL_ITEMS for case in item.cases if case.args or case.kwargs]


@pytest.mark.parametrize("item,case", CASES, ids=[f"{i.id}-{c.name[:40]}" for i, c in CASES])
def test_the_input_line_evaluates_to_what_the_function_receives(item, case):
    """A verdict's "input" is made from the case's data, so it cannot drift from the call: read back as
    Python (small tensors in full, larger ones as the builder call that made them), it gives the
    arguments the function receives, each under the name the reference gives it."""
    received = _received(item, case)
    assert received is not None, "the case never called the function with its inputs"
    scope = {"tensor": lambda data, dtype=None: torch.tensor(data, dtype=dtype), "torch": torch, "nan": math.nan,
             "inf": math.inf, **_DTYPES, **_builders((case.args, case.kwargs), {})}
    parts = item.input_parts(case)
    assert [n for names, _ in parts for n in ((names,) if isinstance(names, str) else names)] == list(received)
    for names, text in parts:
        assert "…" not in text, f"{names}: a concrete input too large to show in full; make it with a builder (Made)"
        shown = eval(text, scope)  # noqa: S307 - our own rendering of our own data
        if isinstance(names, str):
            shown, names = (shown,), (names,)
        for name, value in zip(names, shown, strict=True):
            assert _same(value, received[name]), f"{name}: shown {text}, received {received[name]!r}"


def _scribble(x):
    """Edit every tensor and list inside ``x`` in place."""
    if isinstance(x, torch.Tensor):
        with torch.no_grad():
            x.logical_not_() if x.dtype == torch.bool else x.add_(1000)
    elif isinstance(x, list):
        x.append(x[-1] if x else 0.0)
        x.reverse()
    if isinstance(x, (list, tuple)):
        for v in list(x):
            _scribble(v)
    elif isinstance(x, dict):
        _scribble(list(x.values()))


def _editable(x):
    """``x`` holds something :func:`_scribble` edits (a tensor or a list)."""
    if isinstance(x, (torch.Tensor, list)):
        return True
    if isinstance(x, dict):
        x = list(x.values())
    return isinstance(x, (tuple, list)) and any(_editable(v) for v in x)


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return callable(a) and callable(b) or a == b


@pytest.mark.parametrize("item", [i for i in ALL_ITEMS if any(c.call is None and c.args for c in i.cases)],
                         ids=lambda i: i.id)
def test_a_function_that_edits_its_inputs_in_place_fails_and_changes_no_other_call(item):
    """Every call gets fresh copies: a learner's function that returns the right answer and then scribbles
    over its inputs fails every case it returns from, with a verdict naming the overwritten argument (the
    caller's tensor is gone), and every case still hands out exactly the inputs it did before (so neither the
    next case, nor the reference, nor a typical mistake saw the edits)."""
    plain = dataclasses.replace(item, cases=[c for c in item.cases if c.call is None and c.args])
    before = [_received(plain, c) for c in plain.cases]
    seen = []

    def vandal(*args, **kwargs):
        seen.append(copy.deepcopy({**dict(zip(plain.names(len(args)), args)), **kwargs}))
        result = item.reference(*fresh(args), **fresh(kwargs))
        _scribble([args, kwargs])
        return result

    result = run_item(plain, vandal)
    refused = {c.name for c in plain.cases if isinstance(outcome(plain, c, item.reference), Raised)}
    editable = {c.name for c in plain.cases if _editable(_received(plain, c))}
    for case in result.cases:
        assert case.passed == (case.case.name in refused or case.case.name not in editable), result.report()
        assert case.passed or ("in place" in case.reason and case.hint == IN_PLACE_HINT), result.report()
    assert len(seen) == len(plain.cases) and all(_equal(a, b) for a, b in zip(seen, before, strict=True))
    assert all(_equal(_received(plain, c), b) for c, b in zip(plain.cases, before, strict=True))


# ----------------------------------------------------------------------------- items and hints

def _mutate(result):
    """A slightly wrong version of a result: every number moved (1% and an offset, so zeros move too),
    every flag flipped, every label changed; a returned function returns mutated results."""
    if isinstance(result, torch.Tensor):
        if result.dtype == torch.bool:
            return ~result
        return result * 1.01 + 0.01 if result.is_floating_point() else result + 1
    if isinstance(result, bool):
        return not result
    if isinstance(result, (int, float)):
        return result * 1.01 + 1
    if isinstance(result, str):
        return result + "?"
    if isinstance(result, dict):
        return {key: _mutate(value) for key, value in result.items()}
    if isinstance(result, (tuple, list)):
        return type(result)(_mutate(value) for value in result)
    if isinstance(result, (set, frozenset)):
        return type(result)(result | {"mutant"})
    if callable(result):
        return _mutated(result)
    raise TypeError(f"no mutation for a result of type {type(result).__name__}")


def _mutated(fn):
    def mutant(*args, **kwargs):
        return _mutate(fn(*args, **kwargs))

    return mutant


#: Items whose cases measure what the function does (the detections of minigrpo_course.debugging, run on the
#: learner's repaired grpo_step), not what it returns: their mutated references are the planted bugs,
#: the item's typical mistakes, tested below.
MEASURED_NOT_RETURNED = {"07.1", "07.2", "07.3", "07.4"}


@pytest.mark.parametrize("item", [i for i in ALL_ITEMS if i.id not in MEASURED_NOT_RETURNED], ids=lambda i: i.id)
def test_a_mutated_reference_fails_in_the_notebook_check_and_in_the_grader(item):
    """The cases really look at the result: the reference with every returned number moved by about 1%
    fails both the check cell's quick cases and the grader's full set, and it fails every case whose
    expected result is a value rather than an exception (but for a few that look only at where the
    gradient flows, or at a NaN, which an affine change keeps)."""
    mutant = _mutated(item.reference)
    for quick in (True, False):
        result = run_item(item, mutant, quick=quick)
        assert not result.passed, f"{item.id}: a mutated reference passed every {'quick ' if quick else ''}case"
    kept = {case.case.name for case in run_item(item, mutant).cases if case.passed}
    expected_raises = {case.name for case in item.cases if isinstance(outcome(item, case, item.reference), Raised)}
    invariant = {"01.2": {"no gradient flows into the weights"}, "02.3": {"constant returns: undefined, return NaN"},
                 "04.1": {"no gradient flows into old_logp or the advantages"},
                 "06.2": {"old_logp, ref_logp and the advantages carry a graph: no gradient flows into them"}
                 }.get(item.id, set())
    assert kept == expected_raises | invariant, item.id


def test_items_carry_typical_mistakes_and_the_grpo_step_items_their_planted_bugs():
    """The grpo_step items' mistakes are the teaching copy's planted bugs, or learner-style steps
    (ex07.step_variant) with one of the mistakes that inner step 0 and ref = policy hide."""
    assert all(item.wrong_answers for item in ALL_ITEMS), [i.id for i in ALL_ITEMS if not i.wrong_answers]
    for item_id in MEASURED_NOT_RETURNED:
        for w in get_item(item_id).wrong_answers:
            assert w.name in BUGS or getattr(w.fn, "func", None) is ex07.step_variant, (item_id, w.name)


@pytest.mark.parametrize("item", ALL_ITEMS, ids=lambda i: i.id)
def test_reference_results_do_not_depend_on_the_order_of_the_cases(item):
    """Each case builds fresh inputs: run backwards, the reference gives bit-for-bit the same results
    (a case that leaked state into the next, or drew from the global RNG, would not)."""
    forward = [outcome(item, case, item.reference) for case in item.cases]
    backward = [outcome(item, case, item.reference) for case in reversed(item.cases)][::-1]
    for case, a, b in zip(item.cases, forward, backward, strict=True):
        assert compare(b, a, rtol=0.0, atol=0.0) is None, f"{item.id} '{case.name}': {compare(b, a, 0.0, 0.0)}"


WRONG = [(item, wrong, quick) for item in ALL_ITEMS for wrong in item.wrong_answers for quick in (True, False)
         if wrong.quick or not quick]


@pytest.mark.parametrize("item,wrong,quick", WRONG,
                         ids=[f"{i.id}-{w.name}-{'check-cell' if q else 'grader'}" for i, w, q in WRONG])
def test_each_typical_mistake_fails_with_its_own_hint(item, wrong, quick):
    """Wrong answers fail in the quick (notebook) checks and in the grader, and the verdict names the mistake
    (a mistake marked ``quick=False`` — μ > 1, a moved reference, integer inputs — in the grader only)."""
    result = run_item(item, wrong.fn, quick=quick)
    assert not result.passed
    assert wrong.hint in result.first_failure.hint, result.report()
    assert wrong.hint in result.report()
    if not quick:  # the full set of cases tells every mistake apart from every other
        assert result.first_failure.hint == wrong.hint, result.report()


def test_verdict_shows_input_expected_got_and_hint(capsys):
    def reward_to_go(rewards, gamma):  # forgot the discount
        return torch.flip(torch.cumsum(torch.flip(torch.as_tensor(rewards), [0]), 0), [0])

    with pytest.raises(CheckFailed) as raised:
        check("01.1", reward_to_go)
    out = capsys.readouterr().out
    assert out.startswith("✗ 01.1 reward_to_go")
    for part in ["input:       rewards=tensor([1., 1., 1.]), gamma=0.5", "expected:    tensor([1.75, 1.5, 1.])",
                 "got:         tensor([3., 2., 1.])", "problem:     values differ: mismatched elements: 2 / 3 (66.7%)",
                 "greatest absolute difference: 1.25 at index (0,) (up to 1e-06 allowed)", "hint:", "γ**k"]:
        assert part in out
    # Jupyter shows the exception as the one line it renders, under the verdict, not a traceback.
    n_quick = len([c for c in get_item("01.1").cases if c.quick])
    failed = n_quick - run_item(get_item("01.1"), reward_to_go, quick=True).n_passed
    assert raised.value._render_traceback_() == [
        f"\x1b[0;31mCheckFailed\x1b[0m: 01.1 reward_to_go failed {failed} of {n_quick} checks (first failure above): "
        "fix it, run its cell, then this one"]


def test_a_stub_check_prints_one_verdict_line_and_jupyter_one_error_line(tmp_path, monkeypatch):
    """In IPython (what a Jupyter kernel runs) a stub's check cell shows two lines, not a traceback."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            result = shell.run_cell("from minigrpo_course.grading import check\n"
                                    "def reward_to_go(rewards, gamma):\n    raise NotImplementedError\n"
                                    "check('01.1', reward_to_go)")
    finally:
        InteractiveShell.clear_instance()
    assert isinstance(result.error_in_exec, CheckFailed)
    assert out.getvalue().splitlines() == [
        "✗ 01.1 reward_to_go: not implemented yet: replace `raise NotImplementedError` with your code",
        "\x1b[0;31mCheckFailed\x1b[0m: 01.1 reward_to_go is not implemented yet: write it, run its cell, then this one",
    ]


def test_check_prints_a_stable_success_line(capsys):
    check("01.2", get_item("01.2").reference)
    assert capsys.readouterr().out == "✓ 01.2 reinforce_loss: all 4 checks passed\n"


def test_stub_reports_not_implemented():
    def stub(rewards, gamma):
        raise NotImplementedError

    result = run_item(get_item("01.1"), stub)
    assert result.n_passed == 0 and "not implemented yet" in result.report()


def test_missing_function_is_reported():
    assert "no function named `reward_to_go`" in run_item(get_item("01.1"), None).report()


def test_time_limit_interrupts_an_infinite_loop():
    start = time.perf_counter()
    with pytest.raises(GradingTimeout), time_limit(0.2):
        while True:
            pass
    assert time.perf_counter() - start < 2


def test_an_infinite_loop_fails_the_item_without_hanging():
    item = get_item("01.1")

    def looping(rewards, gamma):
        while True:
            pass

    fast = type(item)(**{**item.__dict__, "time_limit": 0.2})
    start = time.perf_counter()
    result = run_item(fast, looping)
    assert not result.passed and "infinite loop" in result.report()
    assert time.perf_counter() - start < 3  # one time-out, then the remaining cases are skipped


# ----------------------------------------------------------------------------- notebooks

def test_stub_generation_replaces_solutions_and_removes_every_output():
    sol = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n",
                                  execution_count=1),
        nbformat.v4.new_code_cell("check('99.1', f)", execution_count=2,
                                  outputs=[nbformat.v4.new_output("stream", text="✓ 99.1 f: all 2 checks passed\n")]),
    ])
    ex = make_exercise_notebook(sol)
    assert ex.cells[0].source == 'def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError("implement f")\n'
    assert [c.outputs for c in ex.cells] == [[], []]
    assert [c.execution_count for c in ex.cells] == [None, None]
    assert "BEGIN SOLUTION" in sol.cells[0].source and sol.cells[1].outputs  # the solution is untouched


def test_unbalanced_markers_are_an_error():
    sol = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n")])
    with pytest.raises(ValueError, match="without a matching"):
        make_exercise_notebook(sol)


def test_exercises_are_in_sync_with_solutions():
    """exercises/ is what `make-exercises` writes. A notebook a learner has worked in is judged by its committed
    version (git show HEAD:…), so that working through the exercises never fails the suite."""
    stale, _ = stale_exercises(ROOT)
    assert not stale, f"regenerate with `minigrpo make-exercises`: {[p.name for p in stale]}"
    assert sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))


def _pristine(folder: Path, exercise: str) -> Path:
    """The exercise notebook as `make-exercises` writes it (exercises/ may hold a learner's answers)."""
    solution = find_notebook(exercise, ROOT / "solutions")
    path = folder / solution.name
    path.write_text(exercise_text(solution), encoding="utf-8")
    return path


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_solutions_pass_and_pristine_exercises_fail_every_item(exercise, tmp_path):
    solved = load_functions(find_notebook(exercise, ROOT / "solutions"))
    pristine = load_functions(_pristine(tmp_path, exercise))
    assert not solved.errors and not pristine.errors
    for item in items(exercise):
        assert run_item(item, solved.get(item.function)).passed, item.id
        result = run_item(item, pristine.get(item.function))
        assert result.n_passed == 0, f"{item.id}: a stub passed {result.n_passed} cases"


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_solution_shows_its_checks_passing_and_the_exercise_shows_no_verdict(exercise):
    sol = find_notebook(exercise, ROOT / "solutions")
    sol_text = sol.read_text(encoding="utf-8")
    ex = nbformat.reads(exercise_text(sol), as_version=4)
    for item in items(exercise):
        assert f"✓ {item.id} {item.function}: all" in sol_text, f"execute {sol.name} (minigrpo run {exercise} --folder solutions)"
        assert f"✓ {item.id}" not in exercise_text(sol)
    assert all(c.outputs == [] and c.execution_count is None for c in ex.cells if c.cell_type == "code")
    # A check cell fails by raising, so no check cell may ask nbval to compare saved outputs.
    assert "NBVAL_CHECK_OUTPUT" not in sol_text


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_exercise_links_its_lesson_and_says_how_to_grade(exercise):
    cells = nbformat.read(find_notebook(exercise, ROOT / "solutions"), as_version=4).cells
    lesson = find_notebook(exercise, ROOT / "notebooks")
    assert f"[lesson {exercise}](../notebooks/{lesson.name})" in cells[0].source
    done = cells[-1].source
    assert "## Done?" in done and "Save the notebook" in done
    for how in (f"`minigrpo grade {exercise}`", f"`make grade EX={exercise}`", "`source .venv/bin/activate`"):
        assert how in done, how


def test_load_functions_reports_a_broken_cell(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("# EXERCISE 99.1\n1 / 0")])
    path = tmp_path / "99_broken.ipynb"
    nbformat.write(nb, path)
    assert "ZeroDivisionError" in load_functions(path).errors[0]


# ----------------------------------------------------------------------------- `minigrpo grade`

def _grade(*args, home, cwd=ROOT):
    env = dict(os.environ, MINIGRPO_SMOKE="1", MINIGRPO_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "minigrpo_course.cli", "grade", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


def _grades(home):
    return {ex: (g["score"], g["total"]) for ex, g in json.loads((home / "grades.json").read_text()).items()}


def test_grade_pristine_exercise_names_every_failing_item_and_the_failing_cell(tmp_path):
    proc = _grade("01", "--path", str(_pristine(tmp_path, "01")), home=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for item in items("01"):
        i = next(i for i, line in enumerate(lines) if line.startswith(f"{item.id} {item.function}"))
        row = " ".join([lines[i]] + [x.strip() for x in lines[i + 1:] if x.startswith("      ")][:2])
        assert "FAIL" in lines[i] and "not implemented yet" in row, row
    i = next(i for i, line in enumerate(lines) if "notebook (nbval" in line)
    row = " ".join([lines[i]] + [x.strip() for x in lines[i + 1:] if x.startswith("      ")])
    # The first failing cell is the first check, quoted as the learner sees it, with its one-line error.
    code = [c.source for c in nbformat.read(_pristine(tmp_path, "01"), as_version=4).cells if c.cell_type == "code"]
    first_check = code.index('check("01.1", reward_to_go)') + 1
    assert "FAIL" in lines[i] and f'code cell {first_check} of {len(code)}, `check("01.1", reward_to_go)`, ' \
        "failed: CheckFailed: 01.1 reward_to_go is not implemented yet" in row, row
    assert "saved on disk" in row and "save it in Jupyter" in row
    assert "01 property tests" in proc.stdout and "test_reward_to_go_random_episodes" in proc.stdout
    assert "score: 0/5" in proc.stdout
    assert _grades(tmp_path) == {"01": (0, 5)}


def _solved_copy_with_stale_outputs(folder: Path, exercise: str) -> Path:
    """The learner's exercise notebook with every stub replaced by the solution's code, the check cells
    not re-run since: one still shows the failure from before the fix, saved in the older convention
    (marked # NBVAL_CHECK_OUTPUT, so a plain nbval run would compare against it)."""
    sol = nbformat.read(find_notebook(exercise, ROOT / "solutions"), as_version=4)
    ex = nbformat.reads(exercise_text(find_notebook(exercise, ROOT / "solutions")), as_version=4)
    for mine, theirs in zip(ex.cells, sol.cells, strict=True):
        if mine.cell_type == "code" and "NotImplementedError(" in mine.source:
            mine.source = theirs.source
    first_check = next(c for c in ex.cells if c.cell_type == "code" and c.source.startswith("check("))
    first_check.source = "# NBVAL_CHECK_OUTPUT\n" + first_check.source
    first_check.execution_count = 3
    item = items(exercise)[0]
    stale = f"{item.id} {item.function} is not implemented yet"
    first_check.outputs = [
        nbformat.v4.new_output("stream", text=f"✗ {item.id} {item.function}: not implemented yet\n"),
        nbformat.v4.new_output("error", ename="CheckFailed", evalue=stale, traceback=[f"CheckFailed: {stale}"]),
    ]
    path = folder / "exercises" / find_notebook(exercise, ROOT / "solutions").name
    path.parent.mkdir()
    nbformat.write(ex, path)
    return path


def test_grade_ignores_stale_outputs_of_a_correct_notebook_and_accepts_a_relative_path(tmp_path):
    _solved_copy_with_stale_outputs(tmp_path, "05")
    home = tmp_path / "home"
    # relative to where the learner stands; the exercise number comes from the file name
    proc = _grade("--path", "exercises/05_ppo_to_grpo.ipynb", home=home, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "score: 4/4   full marks!" in proc.stdout
    assert _grades(home) == {"05": (4, 4)}


def test_grade_refuses_a_missing_notebook_an_unknown_exercise_and_a_damaged_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MINIGRPO_HOME", str(tmp_path))
    assert grade.main(None, "exercises/05_missing.ipynb") == 2
    assert capsys.readouterr().err == "minigrpo grade: no notebook at exercises/05_missing.ipynb\n"
    for exercise in ("08", "99"):
        assert grade.main(exercise) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"minigrpo grade: no exercise {exercise}; exercises: {', '.join(EXERCISES)}\n"
    broken = tmp_path / "01_reinforce.ipynb"
    broken.write_text("{not json", encoding="utf-8")
    assert grade.main(None, str(broken)) == 2
    assert capsys.readouterr().err.startswith(f"minigrpo grade: cannot read {broken} as a notebook: ")
    assert not (tmp_path / "grades.json").exists()


def test_grading_the_reference_solution_is_not_recorded_as_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINIGRPO_HOME", str(tmp_path))
    assert grade.main("05", str(ROOT / "solutions" / "05_ppo_to_grpo.ipynb"), notebook=False) == 0
    assert "full marks!" in capsys.readouterr().out
    assert not (tmp_path / "grades.json").exists()


def test_compare_handles_nan_and_inf_differences():
    assert "NaN or inf" in compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("inf")]))
    assert "NaN" in compare(torch.tensor([float("nan"), 2.0]), torch.tensor([1.0, 2.0]))
    assert compare(torch.tensor([float("nan"), 2.0]), torch.tensor([float("nan"), 2.0])) is None


# ----------------------------------------------------------------------------- grader gaps (issue 16): planted answers


def _planted(folder: Path, exercise: str, function: str, source: str) -> Path:
    """The solution notebook of ``exercise`` with the exercise cell that defines ``function`` replaced by ``source``."""
    sol = find_notebook(exercise, ROOT / "solutions")
    nb = nbformat.read(sol, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and f"def {function}(" in c.source)
    cell.source = f"# EXERCISE {exercise} (planted)\n" + source
    path = folder / sol.name
    nbformat.write(nb, path)
    return path


_RTG_FLOAT32 = '''import torch

def reward_to_go(rewards, gamma):
    r = torch.as_tensor(rewards, dtype=torch.float32)   # float32 whatever came in
    if r.ndim != 1 or r.numel() == 0:
        raise ValueError("rewards must be a non-empty 1-D tensor [T]")
    out, running = torch.zeros_like(r), torch.zeros(())
    for t in range(len(r) - 1, -1, -1):
        running = r[t] + gamma * running
        out[t] = running
    return out
'''


def test_grade_folds_the_property_tests_into_one_score_and_shows_yours_next_to_expected(tmp_path):
    """One grader, one verdict: the property tests of tests/grading/test_ex01.py are a row of the score, and a
    failing row shows the learner's result next to the expected one (without -v). The planted reward_to_go
    computes in float32: right to ~1e-7, so the verdict is a precision hint, not the name of another mistake."""
    rows = {r.name: r for r in grade.grade_exercise("01", _planted(tmp_path, "01", "reward_to_go", _RTG_FLOAT32),
                                                    notebook=False)}
    prop = rows["01 property tests"]
    assert not prop.passed and "test_reward_to_go_random_episodes" in prop.detail, prop.detail
    item = rows["01.1 reward_to_go"]
    assert not item.passed and "Yours: tensor([" in item.detail and "; expected: tensor([" in item.detail
    assert "float32 precision" in item.detail, item.detail
    table = grade.format_table("01", tmp_path / "01_reinforce.ipynb", list(rows.values()))
    assert "Yours:" in table and "score: 2/4" in table
    solved = grade.grade_exercise("01", find_notebook("01", ROOT / "solutions"), notebook=False)
    assert all(r.passed for r in solved) and "01 property tests" in [r.name for r in solved]


def _float32(fn):
    """``fn`` computing in float32 (every floating tensor argument cast down): right to float32 rounding."""
    def wrapped(*args, **kwargs):
        return fn(*[a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args], **kwargs)
    return wrapped


@pytest.mark.parametrize("item_id", ["01.1", "01.3", "02.2", "04.1", "04.3", "05.1", "05.2", "06.1", "06.2"])
def test_a_float32_only_difference_gets_the_precision_hint(item_id):
    item = get_item(item_id)
    result = run_item(item, _float32(item.reference))
    assert not result.passed, item_id  # the float64 cases ask for more than float32 gives
    failed = [c for c in result.cases if not c.passed]
    assert all("float32 precision" in c.hint for c in failed), result.report()


def test_float32_inputs_at_the_default_tolerance_pass_a_float32_computation():
    """float32 noise on float32 inputs is not a mistake: a reward-to-go summed in another order passes."""
    def forwards(rewards, gamma):  # Σ_k γ^k r_{t+k} as a matrix product: other rounding than the recursion
        r = torch.as_tensor(rewards)
        if r.ndim != 1 or r.numel() == 0:
            raise ValueError("rewards must be 1-D")
        T = len(r)
        k = torch.arange(T)[None, :] - torch.arange(T)[:, None]
        return (torch.where(k >= 0, gamma ** k.clamp(min=0).to(r.dtype), 0.0) * r).sum(1)

    quick = [c.name for c in get_item("01.1").cases if c.quick]
    result = run_item(get_item("01.1"), forwards, quick=True)
    assert result.passed and len(result.cases) == len(quick), result.report()


def _gae_never_reset(rewards, values, next_values, terminated, truncated, gamma, lam):
    from minigrpo.advantages import gae
    from minigrpo_course.grading.ex02 import _gae_variant

    gae(rewards, values, next_values, terminated, truncated, gamma, lam)  # the same refusals
    return _gae_variant(rewards, values, next_values, terminated, truncated, gamma, lam, stop_mask="none")


def test_hints_name_the_mistake_that_was_made_not_a_neighbour():
    """A learner's results that only one typical mistake explains get its hint; a neighbour that agrees on one
    case (the truncation hint for a recursion that never resets, 'signs swapped' for a ratio taken as a
    quotient, 'pad in loss' for a per-sequence mean) does not."""
    never_reset = run_item(get_item("02.2"), _gae_never_reset)
    assert "never restarts" in never_reset.first_failure.hint and "truncat" not in never_reset.first_failure.hint[:60]

    def quotient(logp, old, adv, eps):
        ex04_ref = get_item("04.2").reference
        ex04_ref(logp, old, adv, eps)
        r = logp / old
        return (((adv > 0) & (r > 1 + eps)) | ((adv < 0) & (r < 1 - eps))).double().mean()

    grader = run_item(get_item("04.2"), quotient)
    assert grader.first_failure.hint.startswith("the ratio is π/π_old"), grader.report()
    check_cell = run_item(get_item("04.2"), quotient, quick=True)  # its cases cannot tell the two apart: both named
    assert "cannot tell" in check_cell.first_failure.hint and "quotient" in check_cell.first_failure.hint

    per_sequence = ex07._variant("per_sequence_mean", loss_type="sequence")
    hint = run_item(get_item("07.2"), per_sequence, quick=True).first_failure.hint
    assert "per-sequence mean" in hint and "pad_in_loss" not in hint
    population = ex07._variant("population_std", unbiased=False)
    assert "sample std" in run_item(get_item("07.2"), population, quick=True).first_failure.hint
    assert "population std" in run_item(get_item("07.3"), population).first_failure.hint


def test_a_typical_mistake_computed_in_float32_still_gets_its_hint():
    wrong = next(w for w in get_item("01.1").wrong_answers if w.name == "no discount")
    result = run_item(get_item("01.1"), _float32(wrong.fn))
    assert result.first_failure.hint == wrong.hint, result.report()


def test_an_input_overwritten_in_place_fails_with_its_name():
    def centred_in_place(rewards, group_size, scale="group", eps=1e-4):
        from minigrpo.advantages import group_advantages

        out = group_advantages(rewards, group_size, scale, eps)
        rewards -= rewards.mean()  # "normalise" the caller's tensor as a side effect
        return out

    result = run_item(get_item("05.1"), centred_in_place, quick=True)
    assert not result.passed and "changed its input `rewards` in place" in result.report()
    assert result.first_failure.hint == IN_PLACE_HINT


def _cg_with_stop(rule):
    """Conjugate gradient with a planted stopping rule (everything else right)."""
    def cg(Avp, b, iters=10, tol=1e-5):
        if b.ndim != 1:
            raise ValueError("b must be 1-D")
        x, r, p = torch.zeros_like(b), b.clone(), b.clone()
        rr, bb = r @ r, b @ b
        for _ in range(iters):
            if {"strict <": rr < tol * tol * bb, "absolute ‖r‖ ≤ tol": r.norm() <= tol, "r·r ≤ tol·‖b‖": rr <= tol * b.norm(),
                    "relative to the current residual": rr <= tol * tol * (r @ r), "at the bottom": False}[rule]:
                break
            Ap = Avp(p)
            alpha = rr / (p @ Ap)
            x, r = x + alpha * p, r - alpha * Ap
            rr_new = r @ r
            if rule == "at the bottom" and rr_new <= tol * tol * bb:
                break
            p, rr = r + (rr_new / rr) * p, rr_new
        return x
    return cg


@pytest.mark.parametrize("rule", ["strict <", "absolute ‖r‖ ≤ tol", "r·r ≤ tol·‖b‖", "relative to the current residual",
                                  "at the bottom"])
def test_a_solvers_wrong_stop_rule_fails_with_the_stop_rule_hint(rule):
    result = run_item(get_item("03.1"), _cg_with_stop(rule), quick=True)
    assert not result.passed and "r·r ≤ tol²·(b·b)" in result.first_failure.hint, result.report()


def test_a_cap_that_is_not_positive_must_be_refused():
    def no_cap_check(trainer_logp, sampler_logp, mask, cap=3.0):
        if trainer_logp.shape != sampler_logp.shape or trainer_logp.shape != mask.shape:
            raise ValueError("shapes differ")
        w = torch.exp(trainer_logp.detach() - sampler_logp.detach()).clamp(max=cap)
        return torch.where(mask.bool(), w, torch.zeros_like(w))

    result = run_item(get_item("07.6"), no_cap_check)
    failed = {c.case.name for c in result.cases if not c.passed}
    assert failed == {"cap 0 is refused with a ValueError", "a negative cap is refused with a ValueError"}
    assert "cap > 0" in result.first_failure.hint
    assert run_item(get_item("07.6"), no_cap_check, quick=True).passed  # the check cell does not ask (verdicts kept)


# ----------------------------------------------------------------------------- every item listed (issue 24)


def test_the_item_list_read_from_the_graders_source_is_the_registry():
    """`minigrpo list` reads the items without importing the graders (it stays instant): the same items, functions
    and titles as minigrpo_course.grading.EXERCISES, in the same order."""
    from minigrpo_course.exercise_items import exercise_items

    read = {n: (title, [(i.id, i.function, i.title) for i in its]) for n, (title, its) in exercise_items().items()}
    registry = {n: (title, [(i.id, i.function, i.title) for i in its]) for n, (title, its) in EXERCISES.items()}
    assert read == registry


def test_list_shows_every_item_of_every_exercise(capsys, tmp_path, monkeypatch):
    from minigrpo_course.cli import main

    monkeypatch.setenv("MINIGRPO_HOME", str(tmp_path))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for item in ALL_ITEMS:
        assert f"        {item.id:5s} {item.function:27s} {item.title}\n" in out, item.id


# ----------------------------------------------------------------------------- `make test` after a learner worked


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))


def test_a_learners_exercise_notebook_is_judged_by_its_committed_version(tmp_path):
    """A checkout whose exercises/ are in sync; a learner then completes exercise 05 and saves it with outputs: the
    sync check (and the notebook hygiene test) judge the committed stub, so the suite stays green. A stale
    committed stub is still caught, with or without the learner's work on top."""
    for folder in ("solutions", "exercises"):
        (tmp_path / folder).mkdir()
    sol = find_notebook("05", ROOT / "solutions")
    (tmp_path / "solutions" / sol.name).write_bytes(sol.read_bytes())
    mine = tmp_path / "exercises" / sol.name
    mine.write_text(exercise_text(sol), encoding="utf-8")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "course")
    assert stale_exercises(tmp_path) == ([], [])

    mine.write_bytes(sol.read_bytes())  # the learner's answers, executed and saved
    assert stale_exercises(tmp_path) == ([], [mine])

    solution = nbformat.read(tmp_path / "solutions" / sol.name, as_version=4)
    solution.cells[0].source += "\nA new sentence."  # the solutions move on, the committed stub does not
    nbformat.write(solution, tmp_path / "solutions" / sol.name)
    assert stale_exercises(tmp_path) == ([mine], [mine])


# ----------------------------------------------------------------------------- hints that explain the failures (issue 24)


def _population_std(convert_integers: bool):
    """A learner's group_advantages with the population std (and, optionally, no conversion of integer rewards)."""
    def group_advantages(rewards, group_size, scale="group", eps=1e-4):
        rewards = torch.as_tensor(rewards)
        if convert_integers and not rewards.is_floating_point():
            rewards = rewards.float()
        if group_size < 2 or rewards.numel() == 0 or rewards.numel() % group_size:
            raise ValueError("each group needs group_size >= 2 rewards")
        if scale not in ("group", "batch", "none"):
            raise ValueError(f"unknown scale {scale!r}")
        g = rewards.view(-1, group_size)
        centred = g - g.mean(1, keepdim=True)
        if scale == "none":
            return centred.reshape(-1)
        std = g.std(1, unbiased=False, keepdim=True) if scale == "group" else rewards.std(unbiased=False)
        return (centred / (std + eps)).reshape(-1)
    return group_advantages


@pytest.mark.parametrize("convert_integers", [True, False])
def test_a_population_std_answer_is_told_about_the_std_not_about_integer_rewards(convert_integers):
    """The hint shown is the one that explains the failures: the population-std mistake reproduces every value the
    answer returns, so it is shown even when the same answer also raises on integer rewards (whose case keeps its own
    hint), never the integer-rewards hint alone."""
    population = next(w for w in get_item("05.1").wrong_answers if w.name == "population std")
    for quick in (True, False):
        result = run_item(get_item("05.1"), _population_std(convert_integers), quick=quick)
        assert result.first_failure.hint == population.hint, result.report()
        assert "integer" not in result.summary() and "integer" not in result.report()
    integers = next(c for c in run_item(get_item("05.1"), _population_std(False)).cases if "integer" in c.case.name)
    assert not integers.passed and "convert integer rewards" in integers.hint


def test_no_hint_is_shown_for_failures_it_does_not_explain():
    """Wrong in a way no typical mistake reproduces, and refusing integers: the verdict shows the first failing case
    as it is, not the integer case picked for having a hint."""
    def scaled(rewards, group_size, scale="group", eps=1e-4):
        if rewards.dtype == torch.int64:
            raise TypeError("integers")
        return 1.5 * get_item("05.1").reference(rewards, group_size, scale, eps)

    result = run_item(get_item("05.1"), scaled)
    assert result.first_failure is next(c for c in result.cases if not c.passed) and result.first_failure.hint == ""


def _td_float32_mask(rewards, values, next_values, terminated, gamma):
    """02.1 the way the old hint suggested: a float32 mask (float64 result, γ rounded to float32)."""
    terminated = torch.as_tensor(terminated).bool()
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape):
        raise ValueError("shapes differ")
    return rewards + gamma * (~terminated) * next_values - values


def _gae_float32_mask(rewards, values, next_values, terminated, truncated, gamma, lam):
    """02.2 with `1 − flags.float()` masks: a float64 result, γ and γλ rounded to float32."""
    term, trunc = torch.as_tensor(terminated).bool(), torch.as_tensor(truncated).bool()
    if not (rewards.shape == values.shape == next_values.shape == term.shape == trunc.shape):
        raise ValueError("shapes differ")
    deltas = rewards + gamma * (1 - term.float()) * next_values - values
    keep = 1 - (term | trunc).float()
    out, running = torch.zeros_like(deltas), torch.zeros_like(deltas[0])
    for t in reversed(range(len(deltas))):
        running = deltas[t] + gamma * lam * keep[t] * running
        out[t] = running
    return out


def _targets_float32_mask(rewards, next_values, terminated, truncated, gamma, truncation_is_terminal=False):
    term, trunc = torch.as_tensor(terminated).bool(), torch.as_tensor(truncated).bool()
    if not (rewards.shape == next_values.shape == term.shape == trunc.shape):
        raise ValueError("shapes differ")
    stop = term | trunc if truncation_is_terminal else term
    return rewards + gamma * (1 - stop.float()) * next_values


@pytest.mark.parametrize("item_id,fn", [("02.1", _td_float32_mask), ("02.2", _gae_float32_mask),
                                        ("02.4", _targets_float32_mask)])
def test_a_float32_mask_gets_a_hint_about_the_mask_not_about_a_float_call(item_id, fn):
    """A float32 mask leaves a float64 result with γ rounded to float32: the hint names that path (a mask from the
    flags), not a `.float()` of the result; a computation cast down to float32 gets the other hint."""
    result = run_item(get_item(item_id), fn)
    failed = [c for c in result.cases if not c.passed]
    assert failed and all("a float32 tensor took part" in c.hint and "mask" in c.hint for c in failed), result.report()
    assert result.first_failure.hint == failed[0].hint and "your result is float32" not in result.report()
    cast_down = run_item(get_item(item_id), _float32(get_item(item_id).reference))
    assert all("your result is float32" in c.hint for c in cast_down.cases if not c.passed), cast_down.report()


def _td_variant(mask):
    def td_residuals(rewards, values, next_values, terminated, gamma):
        terminated = torch.as_tensor(terminated).bool()
        if not (rewards.shape == values.shape == next_values.shape == terminated.shape):
            raise ValueError("shapes differ")
        return rewards + gamma * mask(terminated, next_values) * next_values - values
    return td_residuals


@pytest.mark.parametrize("mask", [
    lambda term, v: (~term).to(v.dtype), lambda term, v: 1 - term.to(v.dtype),
    lambda term, v: term.logical_not().to(v.dtype), lambda term, v: torch.where(term, 0.0, 1.0).to(v.dtype),
], ids=["~flags in the values' dtype", "1 - flags in the values' dtype", "logical_not", "torch.where"])
def test_every_mask_the_spec_allows_passes_02_1(mask):
    result = run_item(get_item("02.1"), _td_variant(mask))
    assert result.passed, result.report()


def test_no_hint_recommends_a_float32_mask():
    for item in ALL_ITEMS:
        for text in [c.hint for c in item.cases] + [w.hint for w in item.wrong_answers]:
            assert ".float()" not in text or "float32" in text, (item.id, text)


# ----------------------------------------------------------------------------- grader changes of issue 24


def _gaussian_by_distributions(x_prev, mean, std, reduction="mean"):
    """09.1 written another way the spec allows: torch.distributions, and the checks in another order."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"unknown reduction {reduction!r}")
    if not (std > 0).all():
        raise ValueError("every σ must be > 0")
    if x_prev.shape != mean.shape or std.shape != x_prev.shape[:1]:
        raise ValueError("x_prev and mean must be [B, C, H, W] and std [B]")
    logp = torch.distributions.Normal(mean, std[:, None, None, None]).log_prob(x_prev).flatten(1)
    return logp.mean(1) if reduction == "mean" else logp.sum(1)


def test_09_1_grades_its_required_errors_and_accepts_another_correct_answer():
    item = get_item("09.1")
    refusals = {c.name for c in item.cases if isinstance(outcome(item, c, item.reference), Raised)}
    assert {"a negative σ is refused with a ValueError", "an unknown reduction is refused with a ValueError",
            "x_prev and mean of different shapes ([3, 1, 4, 4] and [3, 1, 4, 1]) are refused with a ValueError",
            "std of the wrong length (2 σ's for 3 rows) is refused with a ValueError"} < refusals
    assert run_item(item, _gaussian_by_distributions).passed

    def no_checks(x_prev, mean, std, reduction="mean"):  # right on every valid input, refuses nothing
        s = std.abs().clamp(min=1e-3).reshape(-1, 1, 1, 1)
        per_pixel = -((x_prev - mean) ** 2) / (2 * s**2) - torch.log(s) - 0.5 * math.log(2 * math.pi)
        return per_pixel.flatten(1).sum(1) if reduction == "sum" else per_pixel.flatten(1).mean(1)

    failed = {c.case.name for c in run_item(item, no_checks).cases if not c.passed}
    assert failed == refusals, failed ^ refusals


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_11_1_accepts_the_float_tensor_or_list_its_spec_allows(dtype):
    def group_advantages_of(rewards):
        r = torch.tensor(rewards, dtype=dtype)
        if r.numel() < 2:
            raise ValueError("a group needs two rewards")
        return (r - r.mean()) / (r.std() + 1e-4)

    assert run_item(get_item("11.1"), group_advantages_of).passed
    assert run_item(get_item("11.1"), lambda rewards: group_advantages_of(rewards).tolist()).passed
    population = next(w for w in get_item("11.1").wrong_answers if w.name == "population std")
    assert not run_item(get_item("11.1"), population.fn).passed  # still refused at float32 tolerance


def test_06_2_an_all_masked_batch_must_keep_the_graph_as_its_spec_says():
    def constant_zero(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04):
        if mask.sum() == 0:
            return torch.zeros((), dtype=logp.dtype)  # 0, but no graph: loss.backward() fails
        return get_item("06.2").reference(logp, old_logp, ref_logp, advantages, mask, epsilon, beta)

    case = next(c for c in run_item(get_item("06.2"), constant_zero).cases if "all-masked" in c.case.name)
    assert not case.passed and "does not require grad" in case.message
    spec = content_cells(nbformat.read(find_notebook("06", ROOT / "solutions"), as_version=4))[5].source
    assert "loss.backward()" in spec and "not 0/0 = NaN" in spec


#: Requirements the graders enforce on inputs the check cells do not show, and the words that state them in the
#: solution notebook's markdown (what the exercise is generated from).
STATED = {"01": ["integers (a step counter gives `int64`)", "Float64 rewards give a float64 result"],
          "02": ["booleans or as 0/1 integers", "float64 result, computed in float64", "may be integer tensors"],
          "06": ["every mask entry 0", "`loss.backward()` must run"]}


@pytest.mark.parametrize("exercise", sorted(STATED))
def test_requirements_the_grader_enforces_are_stated_in_the_exercise(exercise):
    markdown = " ".join(" ".join(c.source.split()) for c in
                        nbformat.read(find_notebook(exercise, ROOT / "solutions"), as_version=4).cells
                        if c.cell_type == "markdown")
    for words in STATED[exercise]:
        assert words in markdown, words


def test_the_two_stale_sampler_questions_say_why_they_differ():
    """07.5's stale_weights is a mismatch and 11.5(h) is by design: both exercises (and both hints) say it is who
    computes log π_old."""
    for exercise, cell in (("07", 14), ("11", 19)):
        solution = nbformat.read(find_notebook(exercise, ROOT / "solutions"), as_version=4)
        text = " ".join(content_cells(solution)[cell].source.split())
        assert "recorded log-probs" in text and "current weights" in text or "newer weights" in text, exercise
    assert "11.5(h)" in next(w.hint for w in get_item("07.5").wrong_answers if w.name == "stale is by design")
    assert "07.5" in next(w.hint for w in get_item("11.5").wrong_answers if w.name == "planned asynchrony as mismatch")


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_the_exercise_lists_every_item_it_grades(exercise):
    """The item table at the top of each exercise names every graded item (alone, or in a range like 07.1–07.4)."""
    first = nbformat.read(find_notebook(exercise, ROOT / "solutions"), as_version=4).cells[0].source
    listed = set()
    for m in re.finditer(rf"\b{exercise}\.(\d+)(?:\s*[–-]\s*(?:{exercise}\.)?(\d+))?", first):
        listed |= {f"{exercise}.{k}" for k in range(int(m[1]), int(m[2] or m[1]) + 1)}
    assert listed == {item.id for item in items(exercise)}
