"""The grader survives the learner's code (minigrpo_course.grading.sandbox): an infinite loop, a loop that swallows
every exception, sys.exit(), os._exit() and a print in a loop, in a function or in an exercise cell, each fail the
item, test or cell they are in, with one line naming it, and the rest of the exercise is still graded."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from minigrpo_course.grading import grade, sandbox
from minigrpo_course.grading.notebooks import find_notebook

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def short_limits(monkeypatch, tmp_path):
    """Soft limits of a second or two, and the hard one two seconds later, so that each fault costs seconds."""
    monkeypatch.setattr(sandbox, "GRACE", 2.0)
    monkeypatch.setattr(sandbox, "CASE_LIMIT", 1.0)
    monkeypatch.setattr(sandbox, "TEST_LIMIT", 3.0)
    monkeypatch.setenv("MINIGRPO_HOME", str(tmp_path / "home"))


def _planted(folder: Path, exercise: str, function: str, source: str) -> Path:
    """The solution notebook of ``exercise`` with the exercise cell that defines ``function`` replaced by ``source``."""
    sol = find_notebook(exercise, ROOT / "solutions")
    nb = nbformat.read(sol, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and f"def {function}(" in c.source)
    cell.source = f"# EXERCISE {exercise}.9 (planted)\n" + source
    path = folder / sol.name
    nbformat.write(nb, path)
    return path


def _rows(graded) -> dict[str, grade.Row]:
    return {r.name.split()[0] if r.name[2] == "." else r.name: r for r in graded.rows}


def _grade_01(tmp_path, source, **kwargs):
    start = time.perf_counter()
    graded = grade.grade("01", _planted(tmp_path, "01", "reward_to_go", source), notebook=False, **kwargs)
    return _rows(graded), graded, time.perf_counter() - start


def _rest_passes(rows):
    assert rows["01.2"].passed and rows["01.3"].passed, "the other items are graded as usual"


LOOP = "def reward_to_go(rewards, gamma):\n    while True:\n        pass\n"
CATCH_EXCEPTION = ("import time\n\ndef reward_to_go(rewards, gamma):\n    while True:\n        try:\n"
                   "            time.sleep(0.05)\n        except Exception:\n            pass\n")
CATCH_EVERYTHING = ("import time\n\ndef reward_to_go(rewards, gamma):\n    while True:\n        try:\n"
                    "            time.sleep(0.05)\n        except:  # noqa: E722\n            pass\n")


@pytest.mark.parametrize("source", [LOOP, CATCH_EXCEPTION], ids=["infinite loop", "loop catching Exception"])
def test_a_loop_that_never_ends_fails_its_item_and_its_property_test_at_the_soft_limit(tmp_path, source):
    """The time-out is a BaseException: `except Exception` around a sleep cannot swallow it."""
    rows, _, seconds = _grade_01(tmp_path, source)
    assert not rows["01.1"].passed and "did not finish within 1 s: is there an infinite loop?" in rows["01.1"].detail
    tests = rows["01 property tests"]
    assert not tests.passed and "did not finish within 3 s: is there an infinite loop?" in tests.detail, tests.detail
    assert "the others were not run" in tests.detail  # one time-out is enough
    _rest_passes(rows)
    assert seconds < 60


def test_a_loop_that_swallows_every_exception_is_killed_at_the_hard_limit(tmp_path):
    rows, _, seconds = _grade_01(tmp_path, CATCH_EVERYTHING)
    item, tests = rows["01.1"], rows["01 property tests"]
    assert not item.passed and item.detail.startswith("9 cases — stopped at case 'discounting, γ = 0.5': your function "
                                                      "did not finish within 1 s and could not be interrupted")
    assert "`try/except`" in item.detail
    assert not tests.passed and tests.detail.startswith("stopped at test_reward_to_go_random_episodes[0]: your code did "
                                                        "not finish within 3 s and could not be interrupted")
    _rest_passes(rows)
    assert seconds < 90


def test_sys_exit_in_a_function_fails_its_cases_and_the_grading_goes_on(tmp_path):
    rows, _, _ = _grade_01(tmp_path, "import sys\n\ndef reward_to_go(rewards, gamma):\n    sys.exit(3)\n")
    assert not rows["01.1"].passed and "raised SystemExit: the function called sys.exit(3)" in rows["01.1"].detail
    assert not rows["01 property tests"].passed and "SystemExit" in rows["01 property tests"].detail
    _rest_passes(rows)


def test_os_exit_in_a_function_fails_its_item_and_a_new_process_grades_the_rest(tmp_path):
    rows, _, _ = _grade_01(tmp_path, "import os\n\ndef reward_to_go(rewards, gamma):\n    os._exit(3)\n")
    assert rows["01.1"].detail == ("9 cases — stopped at case 'discounting, γ = 0.5': your function ended the grader's "
                                   "process (exit status 3: `os._exit(3)`, or a crash in compiled code)")
    assert rows["01 property tests"].detail.startswith("stopped at test_reward_to_go_random_episodes[0]: your code "
                                                       "ended the grader's process (exit status 3")
    _rest_passes(rows)


@pytest.mark.parametrize("source,says", [
    ("import sys\nsys.exit()\n", "called sys.exit(): remove it, the notebook must run to the end"),
    ("import os\nos._exit(3)\n", "ended the grader's process (exit status 3: `os._exit(3)`, or a crash in compiled code)"),
    ("while True:\n    pass\n", "did not finish within 2 s"),
], ids=["sys.exit", "os._exit", "infinite loop"])
def test_a_cell_that_exits_or_hangs_is_named_and_the_other_cells_still_count(tmp_path, monkeypatch, source, says):
    monkeypatch.setattr(sandbox, "CELL_LIMIT", 2.0)
    rows, _, _ = _grade_01(tmp_path, source)
    detail = rows["01.1"].detail
    planted = nbformat.read(tmp_path / find_notebook("01", ROOT / "solutions").name, as_version=4)
    number = next(i for i, c in enumerate(planted.cells) if "(planted)" in c.source)  # the index, as cell_label gives
    assert not rows["01.1"].passed and f"`reward_to_go` not defined; cell {number} (`# EXERCISE 01.9 (planted)`) " in detail
    assert says in detail, detail
    _rest_passes(rows)


def test_printing_in_a_loop_is_counted_not_kept(tmp_path):
    source = ("from minigrpo.advantages import reward_to_go as package\n\ndef reward_to_go(rewards, gamma):\n"
              "    for _ in range(20):\n        print('x' * 1_000_000)\n    return package(rewards, gamma)\n")
    rows, graded, _ = _grade_01(tmp_path, source)
    assert all(r.passed for r in rows.values())
    assert graded.output_chars > 100_000_000 and graded.output_head == "x" * sandbox.OUTPUT_KEPT


def test_grade_reports_a_cell_that_calls_sys_exit_instead_of_ending_silently(tmp_path):
    """`minigrpo grade` used to exit 0 with nothing printed when a cell called sys.exit()."""
    path = _planted(tmp_path, "05", "rloo_advantages", "import sys\nsys.exit()\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINIGRPO_HOME=str(tmp_path / "home"))
    proc = subprocess.run([sys.executable, "-m", "minigrpo_course", "grade", "05", "--path", str(path),
                           "--no-notebook"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "05.2 rloo_advantages" in proc.stdout and "called sys.exit()" in proc.stdout
    assert re.search(r"^05.1 group_advantages +PASS", proc.stdout, flags=re.M) and "score: 1/3" in proc.stdout


def test_the_notebook_row_names_a_cell_that_calls_os_exit_without_waiting_for_the_time_out(tmp_path):
    path = _planted(tmp_path, "05", "rloo_advantages", "import os\nos._exit(3)\n")
    start = time.perf_counter()
    ok, detail = grade.run_nbval(path)
    assert not ok and "`# EXERCISE 05.9 (planted)`, failed: SystemExit: os._exit(3) was called" in detail, detail
    assert time.perf_counter() - start < 120  # a dead kernel made nbval wait for the 300 s cell time-out


def test_notebooks_and_property_tests_run_with_pytest_randomly_off():
    """With pytest-randomly installed, nbval would run the cells of a notebook shuffled."""
    assert "no:randomly" in grade.nbval_command("01_reinforce.ipynb")
    assert "no:randomly" in sandbox.property_test_args(ROOT / "tests/grading/test_ex01.py", "x.ipynb")


def test_a_process_the_learners_code_leaves_running_is_stopped_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    source = (f"import subprocess\nfrom minigrpo.advantages import reward_to_go as package\n\n"
              f"def reward_to_go(rewards, gamma):\n    p = subprocess.Popen(['sleep', '300'])\n"
              f"    open({str(pid_file)!r}, 'w').write(str(p.pid))\n    return package(rewards, gamma)\n")
    rows, _, seconds = _grade_01(tmp_path, source, tests=False)
    assert rows["01.1"].passed and seconds < 60
    pid = int(pid_file.read_text())
    time.sleep(0.5)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "still running"  # gone, or a zombie
