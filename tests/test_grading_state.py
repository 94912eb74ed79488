"""A learner's grades on disk (minigrpo_course.state, minigrpo_course.progress): atomic writes merged under a
lock, a damaged file reported in one line and never overwritten, a failed write said, a partial grade that never
hides a full one, and `grade --path` that only grades the exercise it is given."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from minigrpo_course import progress, state
from minigrpo_course.cli import main
from minigrpo_course.grading import grade
from minigrpo_course.grading.notebooks import find_notebook
from minigrpo_course.progress import PARTS, grades, record_grade
from minigrpo_course.state import UnreadableStateFile, UnwritableStateFile, read_json, update_json, write_json

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv(progress.HOME_ENV_VAR, str(tmp_path))
    return tmp_path


# ----------------------------------------------------------------------------- the state-file helper


_HAMMER = textwrap.dedent("""
    import sys
    from minigrpo_course.state import update_json
    path, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for i in range(n):
        update_json(path, lambda data: {**data, f"{who}-{i}": i})
""")


def test_concurrent_updates_from_several_processes_are_all_kept(tmp_path):
    """Six processes add 60 keys each to one file as fast as they can: every one of the 360 updates survives (before
    the lock, a fixed temp name and no merge lost 412 of 607 in such a run)."""
    path = tmp_path / "grades.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", _HAMMER, str(path), f"p{k}", "60"], env=env) for k in range(6)]
    assert [p.wait(timeout=300) for p in procs] == [0] * 6
    data = json.loads(path.read_text())
    assert len(data) == 360 and all(data[f"p{k}-{i}"] == i for k in range(6) for i in range(60))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grades.json", "grades.json.lock"]  # no temp file left


def test_concurrent_grades_of_several_exercises_are_all_kept(tmp_path):
    """The same through record_grade, as two `minigrpo grade` processes would do it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINIGRPO_HOME=str(tmp_path))
    code = ("import sys; from minigrpo_course.progress import record_grade\n"
            "for i in range(40): record_grade(f'{sys.argv[1]}{i:02d}', i, 40)")
    procs = [subprocess.Popen([sys.executable, "-c", code, prefix], env=env) for prefix in "abcd"]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    data = json.loads((tmp_path / "grades.json").read_text())
    assert {k: v["score"] for k, v in data.items()} == {f"{p}{i:02d}": i for p in "abcd" for i in range(40)}


def test_a_write_is_atomic_and_a_failed_one_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    write_json(path, {"a": 1})

    def no_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state.os, "replace", no_replace)
    with pytest.raises(UnwritableStateFile) as failed:
        update_json(path, lambda data: {**data, "b": 2}, what="grades")
    assert str(failed.value) == f"could not save your grades to {path} (No space left on device)"
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.lock"]  # the temp file is gone


@pytest.mark.parametrize("content,says", [("{not json", "is not valid JSON (Expecting property name"),
                                          ("", "is not valid JSON (Expecting value"),
                                          ("[1, 2]", "does not hold grades in the expected format")])
def test_an_unreadable_file_is_reported_in_one_line_and_never_overwritten(home, content, says):
    path = home / "grades.json"
    path.write_text(content)
    for attempt in (grades, lambda: record_grade("01", 5, 5)):
        with pytest.raises(UnreadableStateFile) as raised:
            attempt()
        message = str(raised.value)
        assert "\n" not in message and message.startswith(str(path)) and says in message
        assert "fix it or move it away" in message
    assert path.read_text() == content


def test_read_json_of_a_missing_file_is_the_default(tmp_path):
    assert read_json(tmp_path / "none.json") == {} and read_json(tmp_path / "none.json", default=list) == []


# ----------------------------------------------------------------------------- grades: full and partial


def test_a_partial_grade_never_replaces_a_full_one(home):
    record_grade("01", 5, 5)
    kept = record_grade("01", 2, 3, ("items",))  # minigrpo grade 01 --no-notebook --no-tests
    assert (kept["score"], kept["total"], kept["covers"]) == (5, 5, list(PARTS))
    assert (kept["partial"]["score"], kept["partial"]["covers"]) == (2, ["items"])
    kept = record_grade("01", 4, 4, ("items", "property tests"))  # still less than the full grade: the latest partial
    assert (kept["score"], kept["partial"]["score"], kept["partial"]["covers"]) == (5, 4, ["items", "property tests"])
    kept = record_grade("01", 3, 5)  # a full grade replaces a full grade, better or worse, and the partial goes
    assert (kept["score"], "partial" in kept) == (3, False)


def test_a_grade_that_covers_more_replaces_one_that_covers_less(home):
    record_grade("02", 3, 5, ("items",))
    assert grades()["02"]["score"] == 3
    record_grade("02", 6, 7, ("items", "notebook"))
    assert (grades()["02"]["score"], "partial" in grades()["02"]) == (6, False)


def test_list_shows_a_partial_grade_beside_the_full_one(home, capsys):
    record_grade("01", 5, 5)
    record_grade("01", 3, 3, ("items",))
    record_grade("05", 2, 3, ("items", "property tests"))
    assert main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    exercises = out[out.index("exercises (exercises/; grade one with: minigrpo grade NN)"):]
    row = next(line for line in exercises if line.startswith("  01  "))
    assert re.search(r"graded 5/5 on [-\d]+ [:\d]+; since then 3/3 on [-\d]+ [:\d]+ \(items only\)$", row), row
    assert next(line for line in exercises if line.startswith("  05  ")).endswith("(items and property tests only)")


def test_list_says_the_grades_file_is_unreadable_instead_of_not_graded_yet(home, capsys):
    (home / "grades.json").write_text('{"01": {"score": 5,')
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "not graded yet" not in out and "grades unreadable (see below)" in out
    assert out.splitlines()[-1].startswith(f"your grades: {home / 'grades.json'} is not valid JSON (")
    assert (home / "grades.json").read_text() == '{"01": {"score": 5,'


def test_list_into_a_closed_pipe_ends_quietly(home):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINIGRPO_HOME=str(home))
    proc = subprocess.run(f"{sys.executable} -m minigrpo_course list | head -1", shell=True, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.stdout == "lessons (notebooks/; run one with: minigrpo run NN)\n" and proc.stderr == ""


# ----------------------------------------------------------------------------- `minigrpo grade`: what it records


def _solution(exercise: str) -> Path:
    return find_notebook(exercise, ROOT / "solutions")


def _learners_copy(tmp_path: Path, exercise: str, name: str | None = None) -> Path:
    """The solution notebook, saved where a learner's would be (outside solutions/, so the grade is recorded)."""
    path = tmp_path / (name or _solution(exercise).name)
    path.write_bytes(_solution(exercise).read_bytes())
    return path


def test_grade_records_what_it_covered_and_keeps_a_full_grade(home, tmp_path, capsys):
    path = _learners_copy(tmp_path, "05")
    record_grade("05", 4, 4)
    assert grade.main("05", str(path), notebook=False) == 0
    assert capsys.readouterr().err == ""
    kept = grades()["05"]
    assert (kept["covers"], kept["partial"]["covers"]) == (list(PARTS), ["items", "property tests"])


def test_grade_with_an_unreadable_grades_file_prints_the_score_and_one_line(home, tmp_path, capsys):
    (home / "grades.json").write_text("{broken")
    path = _learners_copy(tmp_path, "05")
    assert grade.main("05", str(path), notebook=False, tests=False) == 0
    out, err = capsys.readouterr()
    assert "score: 2/2   full marks!" in out
    assert err.count("\n") == 1 and err.startswith(f"minigrpo grade: {home / 'grades.json'} is not valid JSON (")
    assert err.rstrip().endswith("this grade (2/2) was not recorded")
    assert (home / "grades.json").read_text() == "{broken"


def test_grade_into_a_home_it_cannot_write_prints_the_score_and_one_line(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(progress.HOME_ENV_VAR, str(blocker / "home"))  # as unwritable as a read-only home
    path = _learners_copy(tmp_path, "05")
    assert grade.main("05", str(path), notebook=False, tests=False) == 0
    out, err = capsys.readouterr()
    assert "score: 2/2" in out
    assert err == (f"minigrpo grade: could not save your grades to {blocker / 'home' / 'grades.json'} (Not a "
                   f"directory); this grade (2/2) was not recorded\n")


# ----------------------------------------------------------------------------- `grade --path`: the right exercise


def test_grade_path_refuses_another_exercises_notebook(home, tmp_path, capsys):
    other = _learners_copy(tmp_path, "05", "01_reinforce.ipynb")  # exercise 05's work saved under 01's name
    assert grade.main("01", str(other)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"minigrpo grade: {other} is exercise 05's notebook, not exercise 01's: grade it with "
                                 f"`minigrpo grade 05 --path {other}`, or give exercise 01's notebook\n")
    assert grade.main(None, str(other)) == 2  # the name says 01, the cells say 05
    assert "is exercise 05's notebook, not exercise 01's" in capsys.readouterr().err
    assert not (home / "grades.json").exists()


def test_grade_path_refuses_a_notebook_that_is_no_exercise(home, tmp_path, capsys):
    lesson = tmp_path / "05_lesson.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lesson 05"),
                                                   nbformat.v4.new_code_cell("x = 1")]), lesson)
    assert grade.main("05", str(lesson)) == 2
    assert capsys.readouterr().err == (
        f"minigrpo grade: {lesson} does not look like exercise 05's notebook: it has no `# EXERCISE 05.k` cell, "
        f"no `check(\"05.k\", …)` call and no \"# Exercise 05\" title\n")
    assert not (home / "grades.json").exists()


def test_grade_path_tells_the_exercise_from_the_cells_when_the_name_does_not(home, tmp_path, capsys):
    mine = _learners_copy(tmp_path, "05", "my_work.ipynb")
    assert grade.main(None, str(mine), notebook=False, tests=False) == 0
    assert "Exercise 05 — from PPO to GRPO" in capsys.readouterr().out
    assert grades()["05"]["covers"] == ["items"]
