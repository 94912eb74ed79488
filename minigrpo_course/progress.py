"""A learner's course on this machine: where the checkout is, and the grades of each exercise.

Kept in ``~/.minigrpo/grades.json`` (``MINIGRPO_HOME`` moves the folder, as for the interview
practice). ``minigrpo grade`` writes it; ``minigrpo list`` reads it. Every write is atomic and merged under a
lock (:mod:`minigrpo_course.state`): two ``grade`` processes never lose each other's grade, and a file that
cannot be read is reported in one line and never overwritten. Standard library only, so that reading it never
imports torch.

A grade says what it covers: the graded items, the property tests, the notebook run top to bottom
(:data:`PARTS`). A grade that covers less than the one kept (``--no-notebook``, ``--no-tests``) never replaces
it: it is kept beside it as ``"partial"``, and ``minigrpo list`` shows both.

    {"01": {"score": 5, "total": 5, "when": "2026-11-22 23:50", "covers": ["items", "property tests", "notebook"],
            "partial": {"score": 3, "total": 3, "when": "2026-11-23 09:10", "covers": ["items"]}}}
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from minigrpo_course.state import read_json, update_json

HOME_ENV_VAR = "MINIGRPO_HOME"

#: what a grade can cover, in the order a score table shows it
PARTS = ("items", "property tests", "notebook")


def repo_root(start: Path | None = None) -> Path:
    """The course checkout: the nearest folder above ``start`` (default: cwd) holding solutions/ and
    exercises/, else the folder above the installed package."""
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        if (folder / "solutions").is_dir() and (folder / "exercises").is_dir():
            return folder
    return Path(__file__).resolve().parents[1]


def home() -> Path:
    """The folder where minigrpo keeps a learner's state (default ``~/.minigrpo``)."""
    return Path(os.environ.get(HOME_ENV_VAR) or Path.home() / ".minigrpo")


def grades_path() -> Path:
    return home() / "grades.json"


def _check(data) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")


def grades() -> dict[str, dict]:
    """``{"01": {"score": 3, "total": 4, "when": ..., "covers": [...]}, ...}``; empty if never graded.
    Raises :class:`minigrpo_course.state.UnreadableStateFile` (one line) for a file that cannot be read."""
    return read_json(grades_path(), what="grades", check=_check)


def covers(grade: dict) -> tuple[str, ...]:
    """The parts a recorded grade covers (a grade from before parts were recorded: all of them)."""
    parts = grade.get("covers")
    return tuple(p for p in PARTS if p in parts) if isinstance(parts, list) else PARTS


def record_grade(exercise: str, score: int, total: int, parts: tuple[str, ...] | list[str] = PARTS) -> dict:
    """Remember a grade of ``exercise`` (e.g. ``"01"``) that covers ``parts``; returns what is kept for it.

    A grade that covers at least what the kept one covers replaces it. One that covers less is kept beside it as
    ``"partial"`` (the latest such), so that a quick ``--no-notebook`` run never hides a full grade. Raises
    :class:`minigrpo_course.state.StateFileError` (one line) when the file cannot be read (it is then left as it
    is) or written."""
    new = {"score": int(score), "total": int(total), "when": time.strftime("%Y-%m-%d %H:%M"),
           "covers": [p for p in PARTS if p in parts]}

    def change(data: dict) -> dict:
        old = data.get(exercise)
        if isinstance(old, dict) and {"score", "total"} <= old.keys() and not set(covers(old)) <= set(new["covers"]):
            data[exercise] = {**old, "partial": new}
        else:
            data[exercise] = new
        return data

    return update_json(grades_path(), change, what="grades", check=_check)[exercise]
