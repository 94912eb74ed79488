"""The grading machinery: verdicts, hints, time limits, exercise generation and the CI invariants
(solutions pass, pristine exercises fail every graded item, exercises/ in sync with solutions/)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from minigrpo.grading import EXERCISES, Raised, check, compare, get_item, items, run_item, time_limit
from minigrpo.grading.core import GradingTimeout
from minigrpo.grading.notebooks import (
    exercise_text,
    find_notebook,
    load_functions,
    make_exercise_notebook,
    sync_exercises,
)

ROOT = Path(__file__).resolve().parents[1]
ALL_ITEMS = [item for _, (_, its) in sorted(EXERCISES.items()) for item in its]


# ----------------------------------------------------------------------------- comparing results

def test_compare_tensors():
    assert compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) is None
    assert "shape" in compare(torch.ones(3, 1), torch.ones(3))
    assert "max |got − expected| = 0.5 at index (1,)" in compare(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0]))
    assert "NaN" in compare(torch.tensor([float("nan")]), torch.tensor([1.0]))
    assert compare([1.0, 2.0], torch.tensor([1.0, 2.0])) is None  # array-likes are accepted


def test_compare_exceptions_and_dicts():
    assert compare(Raised(ValueError), Raised(ValueError)) is None
    assert "expected a ValueError" in compare(torch.ones(1), Raised(ValueError))
    assert "raised TypeError" in compare(Raised(TypeError, "boom"), torch.ones(1))
    assert "grad" in compare({"loss": 1.0, "grad": torch.ones(2)}, {"loss": 1.0, "grad": torch.zeros(2)})


# ----------------------------------------------------------------------------- items and hints

@pytest.mark.parametrize("item", ALL_ITEMS, ids=lambda i: i.id)
def test_reference_passes_every_case(item):
    assert run_item(item, item.reference).passed


WRONG = [(item, wrong) for item in ALL_ITEMS for wrong in item.wrong_answers]


@pytest.mark.parametrize("item,wrong", WRONG, ids=[f"{i.id}-{w.name}" for i, w in WRONG])
def test_each_typical_mistake_fails_with_its_own_hint(item, wrong):
    """Wrong answers fail in the quick (notebook) checks too, and the verdict names the mistake."""
    result = run_item(item, wrong.fn, quick=True)
    assert not result.passed
    assert result.first_failure.hint == wrong.hint, result.report()
    assert wrong.hint in result.report()


def test_verdict_shows_input_expected_got_and_hint(capsys):
    def reward_to_go(rewards, gamma):  # forgot the discount
        return torch.flip(torch.cumsum(torch.flip(torch.as_tensor(rewards), [0]), 0), [0])

    check("01.1", reward_to_go)
    out = capsys.readouterr().out
    assert out.startswith("✗ 01.1 reward_to_go")
    for part in ["input:", "rewards=[1., 1., 1.], gamma=0.5", "expected:    tensor([1.75, 1.5, 1])",
                 "got:         tensor([3, 2, 1])", "hint:", "γ**k"]:
        assert part in out


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

def test_stub_generation_replaces_solutions_and_keeps_check_outputs():
    sol = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint('ok')",
                                  outputs=[nbformat.v4.new_output("stream", text="ok\n")]),
        nbformat.v4.new_code_cell("print('other')", outputs=[nbformat.v4.new_output("stream", text="other\n")]),
    ])
    ex = make_exercise_notebook(sol)
    assert ex.cells[0].source == 'def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError("implement f")\n'
    assert ex.cells[1].outputs[0].text == "ok\n"
    assert ex.cells[2].outputs == []
    assert "BEGIN SOLUTION" in sol.cells[0].source  # the solution itself is untouched


def test_unbalanced_markers_are_an_error():
    sol = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n")])
    with pytest.raises(ValueError, match="without a matching"):
        make_exercise_notebook(sol)


def test_exercises_are_in_sync_with_solutions():
    stale = sync_exercises(ROOT, check=True)
    assert not stale, f"regenerate with `minigrpo make-exercises`: {[p.name for p in stale]}"
    assert sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_solutions_pass_and_pristine_exercises_fail_every_item(exercise):
    solved = load_functions(find_notebook(exercise, ROOT / "solutions"))
    pristine = load_functions(find_notebook(exercise, ROOT / "exercises"))
    assert not solved.errors and not pristine.errors
    for item in items(exercise):
        assert run_item(item, solved.get(item.function)).passed, item.id
        result = run_item(item, pristine.get(item.function))
        assert result.n_passed == 0, f"{item.id}: a stub passed {result.n_passed} cases"


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_exercise_notebook_ships_the_solution_check_outputs(exercise):
    sol = find_notebook(exercise, ROOT / "solutions")
    text = exercise_text(sol)
    for item in items(exercise):
        assert f"✓ {item.id} {item.function}: all" in text, f"run {sol.name} and regenerate exercises"


def test_load_functions_reports_a_broken_cell(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("# EXERCISE 99.1\n1 / 0")])
    path = tmp_path / "99_broken.ipynb"
    nbformat.write(nb, path)
    assert "ZeroDivisionError" in load_functions(path).errors[0]


# ----------------------------------------------------------------------------- `minigrpo grade`

def _grade(*args):
    env = dict(os.environ, MINIGRPO_SMOKE="1")
    return subprocess.run([sys.executable, "-m", "minigrpo.cli", "grade", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)


def test_grade_pristine_exercise_names_every_failing_item():
    proc = _grade("01")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for item in items("01"):
        i = next(i for i, line in enumerate(lines) if line.startswith(f"{item.id} {item.function}"))
        row = " ".join([lines[i]] + [x.strip() for x in lines[i + 1:] if x.startswith("      ")][:2])
        assert "FAIL" in lines[i] and "not implemented yet" in row, row
    notebook = next(l for l in proc.stdout.splitlines() if "notebook (nbval" in l)
    assert "FAIL" in notebook and "cells failed" in notebook
    assert "score: 0/4" in proc.stdout


def test_grade_gives_full_marks_when_the_solution_is_pasted_in(tmp_path):
    # A learner's copy with the solution pasted in, in a folder of its own.
    target = tmp_path / "exercises" / "01_reinforce.ipynb"
    target.parent.mkdir()
    target.write_bytes((ROOT / "solutions" / "01_reinforce.ipynb").read_bytes())
    proc = _grade("01", "--path", str(target))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "score: 4/4   full marks!" in proc.stdout


def test_grade_accepts_a_relative_path_and_refuses_a_missing_one():
    proc = _grade("--path", "solutions/05_ppo_to_grpo.ipynb")  # relative to where the learner stands
    assert proc.returncode == 0 and "full marks!" in proc.stdout, proc.stdout + proc.stderr
    proc = _grade("--path", "exercises/05_missing.ipynb")
    assert proc.returncode == 2 and "no notebook at exercises/05_missing.ipynb" in proc.stderr


def test_compare_handles_nan_and_inf_differences():
    assert "NaN or inf" in compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("inf")]))
    assert "NaN" in compare(torch.tensor([float("nan"), 2.0]), torch.tensor([1.0, 2.0]))
