"""Rubric scoring: the checklist items a learner covered drive the Leitner schedule and the
statistics; progress files of format 1 (ratings only) are still read."""

import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from minigrpo_course.cli import main
from minigrpo_course.interview import get
from minigrpo_course.interview.schedule import (FORMAT_VERSION, PROGRESS_ENV_VAR, WAITS, Progress, default_progress_path,
                                                item_key, migrate, rating_from_checklist)
from minigrpo_course.interview.terminal import parse_covered

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def _cli(capsys, *argv):
    rc = main(["interview", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_missed_items_decide_the_box_move():
    # 10 items: all covered -> 3; one or two missed (<= a fifth) -> 2; half covered -> 1; less -> 0
    assert [rating_from_checklist(c, 10) for c in (10, 9, 8, 7, 5, 4, 0)] == [3, 2, 2, 1, 1, 0, 0]
    assert rating_from_checklist(4, 5) == 2 and rating_from_checklist(3, 5) == 1 and rating_from_checklist(2, 5) == 0
    assert rating_from_checklist(9, 10, repeated_miss=True) == 1 and rating_from_checklist(0, 4, repeated_miss=True) == 0
    with pytest.raises(ValueError, match="between 0 and 4"):
        rating_from_checklist(5, 4)


def test_parse_covered():
    assert parse_covered("1 3,4", 5) == [0, 2, 3] and parse_covered("2-4", 5) == [1, 2, 3]
    assert parse_covered(" ALL ", 3) == [0, 1, 2] and parse_covered("none", 3) == []
    for bad, msg in (("0", "items 1 to 5; got '0'"), ("6", "got '6'"), ("4-2", "got '4-2'"), ("x", "e.g. 1 3 4"),
                     ("", "got nothing")):
        with pytest.raises(ValueError, match=msg):
            parse_covered(bad, 5)


def test_a_checked_attempt_schedules_and_remembers_the_missed_items(tmp_path):
    q = get("group-normalisation")
    n = len(q.checklist)
    progress = Progress(tmp_path / "p.json")
    card = progress.record_checklist(q.id, range(n), now=T0)
    assert card.box == 2 and card.due == T0 + WAITS[2]
    card = progress.record_checklist(q.id, [i for i in range(n) if i != 3], now=T0 + timedelta(days=3))
    assert card.box == 3, "one point missed: one box up"
    h = card.history[-1]
    assert h["missed"] == [item_key(q.checklist[3])] and len(h["covered"]) == n - 1 and h["rating"] == 2
    # the same point missed again: at most box 1, whatever the rest
    card = progress.record_checklist(q.id, [i for i in range(n) if i != 3], now=T0 + timedelta(days=10))
    assert card.box == 1 and card.history[-1]["rating"] == 1
    stats = {s.item: (s.missed, s.tries) for s in progress.item_stats(q)}
    assert stats[q.checklist[3]] == (2, 3) and stats[q.checklist[0]] == (0, 3)
    assert progress.last_missed(q) == [q.checklist[3]]
    with pytest.raises(ValueError, match=f"numbered 1 to {n}; got {n + 1}"):
        progress.record_checklist(q.id, [n])


def test_a_reworded_item_starts_a_new_history(tmp_path):
    q = get("gae")
    progress = Progress(tmp_path / "p.json")
    progress.record_checklist(q.id, [], now=T0)
    # simulate the first item's wording changing: its old key no longer matches any item
    progress.cards[q.id].history[-1]["missed"][0] = item_key("an old wording of the item")
    stats = {s.item: (s.missed, s.tries) for s in progress.item_stats(q)}
    assert stats[q.checklist[0]] == (0, 0) and stats[q.checklist[1]] == (1, 1)


def test_review_order_breaks_ties_by_items_missed(tmp_path):
    progress = Progress(tmp_path / "p.json")
    a, b = get("gae"), get("ppo-clip")  # 7 checklist items each
    progress.record_checklist(a.id, range(5), now=T0)  # two missed
    progress.record_checklist(b.id, range(4), now=T0)  # three missed
    assert progress.card(a.id).box == progress.card(b.id).box == 1 and progress.card(a.id).due == progress.card(b.id).due
    order = [q.id for q in progress.review_order([a, b], now=T0 + timedelta(days=2))]
    assert order == ["ppo-clip", "gae"]


def test_format_1_files_are_migrated(tmp_path):
    """A file written by the ratings-only version keeps its boxes, due times and ratings; the next
    save writes format 2 with the new attempt next to the old ones."""
    path = tmp_path / "old.json"
    old = {"version": 1, "questions": {"gae": {"box": 2, "due": (T0 + WAITS[2]).isoformat(),
                                                "history": [{"at": T0.isoformat(), "rating": 3}]}}}
    path.write_text(json.dumps(old))
    progress = Progress(path)
    assert progress.migrated_from == 1
    assert progress.card("gae").box == 2 and progress.card("gae").last_rating == 3
    assert progress.card("gae").checked_attempts() == []
    progress.record_checklist("gae", [0, 1], now=T0 + timedelta(days=3))
    progress.save()
    data = json.loads(path.read_text())
    assert data["version"] == FORMAT_VERSION == 2
    assert data["questions"]["gae"]["history"][0] == {"at": T0.isoformat(), "rating": 3}
    assert "missed" in data["questions"]["gae"]["history"][1]
    assert Progress(path).migrated_from is None
    assert migrate({"questions": {}})["version"] == 2  # no version at all: format 1


@pytest.mark.parametrize("content,message", [
    ({"version": 3, "questions": {}}, "unknown progress format version 3"),
    ({"version": 2, "questions": {"gae": {"box": 1, "due": None, "history": [{"at": "x", "rating": 7}]}}},
     "rating must be an integer from 0 to 3"),
    ([], "expected a JSON object"),
])
def test_unreadable_progress_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match="does not hold interview attempts in the expected format") as info:
        Progress(path)
    assert message in str(info.value)


def test_the_default_progress_file_follows_minigrpo_home(tmp_path, monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV_VAR, raising=False)
    monkeypatch.setenv("MINIGRPO_HOME", str(tmp_path / "home"))
    assert default_progress_path() == tmp_path / "home" / "interview.json"
    monkeypatch.setenv(PROGRESS_ENV_VAR, str(tmp_path / "explicit.json"))
    assert default_progress_path() == tmp_path / "explicit.json", "the interview's own variable wins"
    monkeypatch.delenv("MINIGRPO_HOME")
    monkeypatch.delenv(PROGRESS_ENV_VAR)
    assert default_progress_path() == Path.home() / ".minigrpo" / "interview.json"


def test_covered_without_prompts_and_stats_name_the_points_missed_most(capsys, tmp_path):
    pf = str(tmp_path / "p.json")
    q = get("group-normalisation")
    n = len(q.checklist)
    for covered in ("all", "1-4", "1-3", "1-4"):  # item 5 missed in 3 of 4 tries, item 4 in 1 of 4
        rc, out, err = _cli(capsys, "--id", q.id, "--answer", "the mean is a baseline", "--covered", covered,
                            "--progress-file", pf)
        assert rc == 0, err
    assert f"covered 4/{n} points" in out and "missed (come back to these):" in out
    assert f"you miss \"{q.checklist[4][:30]}" in out and "in 3 of 4 tries" in out
    rc, out, _ = _cli(capsys, "--stats", "--progress-file", pf)
    assert rc == 0 and "The points you miss most often:" in out
    lines = [line for line in out.splitlines() if line.startswith("  you miss")]
    assert "in 3 of 4 tries  [group-normalisation]" in lines[0] and "in 1 of 4 tries" in lines[-1]
    assert f"4/{n}" in [line for line in out.splitlines() if line.startswith("grpo")][0]


def test_help_names_minigrpo_home(capsys):
    with pytest.raises(SystemExit):
        main(["interview", "--help"])
    out = capsys.readouterr().out
    assert "MINIGRPO_HOME" in " ".join(out.split()) and "--covered" in out


def test_a_session_shows_the_last_score_before_the_answer(capsys, tmp_path, monkeypatch):
    import io

    pf = tmp_path / "p.json"
    p = Progress(pf)
    p.record_checklist("gae", [0, 1], now=T0)
    p.save()
    monkeypatch.setattr(sys, "stdin", io.StringIO("A = Q - V\n\nq\n"))
    rc, out, _ = _cli(capsys, "--id", "gae", "--progress-file", str(pf))
    assert rc == 0 and f"last try: 2 of {len(get('gae').checklist)} points" in out
    assert out.index("last try") < out.index("Your answer")
