"""Spaced review of the interview questions: a Leitner box per question, saved as JSON.

After each attempt the learner rates their answer 0–3. The rating moves the question between
boxes; each box has a waiting time before the question is due again, so weak questions come back
within minutes and strong ones after days or weeks:

    rating 0 (blank)   -> box 0, due in 10 minutes
    rating 1 (weak)    -> box 1, due in 1 day
    rating 2 (good)    -> one box up
    rating 3 (strong)  -> two boxes up
    box:      0       1      2      3      4       5
    waits:    10 min  1 day  3 days 7 days 16 days 35 days

Progress lives in ``~/.minigrpo/interview.json`` unless ``MINIGRPO_INTERVIEW_PROGRESS`` or an
explicit path says otherwise.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from minigrpo.interview.bank import QUESTIONS, Question, get

PROGRESS_ENV_VAR = "MINIGRPO_INTERVIEW_PROGRESS"
RATINGS = {0: "blank: could not answer", 1: "weak: missed key points", 2: "good: most points",
           3: "strong: every point, crisply"}
WAITS = (timedelta(minutes=10), timedelta(days=1), timedelta(days=3), timedelta(days=7), timedelta(days=16),
         timedelta(days=35))
_FORMAT_VERSION = 1


def default_progress_path() -> Path:
    env = os.environ.get(PROGRESS_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".minigrpo" / "interview.json"


def check_rating(rating) -> int:
    if isinstance(rating, bool) or not isinstance(rating, int) or rating not in RATINGS:
        choices = "; ".join(f"{k} = {v}" for k, v in RATINGS.items())
        raise ValueError(f"rating must be an integer from 0 to 3 ({choices}); got {rating!r}")
    return rating


def next_box(box: int, rating: int) -> int:
    """The Leitner box after an attempt rated ``rating`` from box ``box``."""
    rating = check_rating(rating)
    if rating <= 1:
        return rating
    return min(box + rating - 1, len(WAITS) - 1)


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Card:
    """One question's review state."""

    box: int = 0
    due: datetime | None = None  #: None: never attempted
    history: list[dict] = field(default_factory=list)  #: {"at": iso time, "rating": int}

    @property
    def last_rating(self) -> int | None:
        return self.history[-1]["rating"] if self.history else None


class Progress:
    """The learner's review state for every question, read from and written to one JSON file."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path).expanduser() if path is not None else default_progress_path()
        self.cards: dict[str, Card] = {}
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            for qid, c in data["questions"].items():
                due = datetime.fromisoformat(c["due"]) if c.get("due") else None
                self.cards[qid] = Card(int(c["box"]), due, list(c.get("history", [])))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"cannot read interview progress from {self.path} ({exc}); fix or delete the file, "
                             f"or choose another with --progress-file") from None

    def save(self) -> None:
        """Write atomically (a crash mid-write leaves the old file intact)."""
        data = {"version": _FORMAT_VERSION, "questions": {
            qid: {"box": c.box, "due": c.due.isoformat() if c.due else None, "history": c.history}
            for qid, c in sorted(self.cards.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".interview-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, ensure_ascii=False)
        os.replace(tmp, self.path)

    def card(self, question_id: str) -> Card:
        return self.cards.get(question_id, Card())

    def record(self, question_id: str, rating: int, now: datetime | None = None) -> Card:
        """Apply an attempt: move the question's box and set its next due time."""
        get(question_id)  # a clear error for an unknown id
        rating = check_rating(rating)
        now = now or _now()
        old = self.card(question_id)
        box = next_box(old.box, rating)
        card = Card(box, now + WAITS[box], old.history + [{"at": now.isoformat(), "rating": rating}])
        self.cards[question_id] = card
        return card

    def review_order(self, questions: list[Question] | None = None, now: datetime | None = None) -> list[Question]:
        """What to practise next: overdue questions (earliest due first), then ones never tried (in
        course order), then the rest by due time. Ties go to the lower box."""
        now = now or _now()
        questions = list(QUESTIONS) if questions is None else questions
        position = {q.id: i for i, q in enumerate(QUESTIONS)}

        def key(q: Question):
            c = self.card(q.id)
            if c.due is None:
                return (1, 0.0, 0, position[q.id])
            group = 0 if c.due <= now else 2
            return (group, c.due.timestamp(), c.box, position[q.id])

        return sorted(questions, key=key)

    def is_due(self, question_id: str, now: datetime | None = None) -> bool:
        c = self.card(question_id)
        return c.due is None or c.due <= (now or _now())
