"""Spaced review of the interview questions: a Leitner box per question, driven by the checklist.

After each attempt the learner ticks the checklist items their answer covered. What they missed,
not a feeling, decides when the question comes back:

    every item covered                        -> two boxes up
    one item missed (or at most a fifth)      -> one box up
    at least half covered                     -> box 1, due tomorrow
    less than half covered                    -> box 0, due in 10 minutes
    an item missed twice in a row             -> at most box 1: a persistent gap comes back tomorrow

    box:      0       1      2      3      4       5
    waits:    10 min  1 day  3 days 7 days 16 days 35 days

Each attempt is kept with the items it covered and missed, so the statistics can say "you miss the
std-free baseline in 3 of 4 tries". Items are remembered by a fingerprint of their text: if a
checklist item is reworded, its history starts again rather than being credited to another item.

A 0–3 self-rating is still accepted (``--rating``; progress files of format 1 hold only those):

    rating 0 (blank)   -> box 0        rating 2 (good)    -> one box up
    rating 1 (weak)    -> box 1        rating 3 (strong)  -> two boxes up

Progress lives in ``interview.json`` in the minigrpo home folder (``~/.minigrpo``, or
``$MINIGRPO_HOME``), unless ``MINIGRPO_INTERVIEW_PROGRESS`` or an explicit path says otherwise.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from minigrpo_course.interview.bank import QUESTIONS, Question, get
from minigrpo_course.state import StateFileError, read_json, update_json

PROGRESS_ENV_VAR = "MINIGRPO_INTERVIEW_PROGRESS"
#: what the progress file holds, as messages about it say ("could not save your interview attempts to ...")
WHAT = "interview attempts"
RATINGS = {0: "blank: could not answer", 1: "weak: missed key points", 2: "good: most points",
           3: "strong: every point, crisply"}
WAITS = (timedelta(minutes=10), timedelta(days=1), timedelta(days=3), timedelta(days=7), timedelta(days=16),
         timedelta(days=35))
#: 1: ratings only. 2: each attempt may also list the checklist items covered and missed.
FORMAT_VERSION = 2
_FORMAT_VERSION = FORMAT_VERSION  # the old private name


def default_progress_path() -> Path:
    """``$MINIGRPO_INTERVIEW_PROGRESS``, else ``interview.json`` in the minigrpo home folder."""
    from minigrpo_course.progress import home

    env = os.environ.get(PROGRESS_ENV_VAR)
    return Path(env).expanduser() if env else home() / "interview.json"


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


def item_key(text: str) -> str:
    """A checklist item's fingerprint: the first 10 hex digits of the SHA-1 of its text."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:10]


def rating_from_checklist(n_covered: int, n_items: int, repeated_miss: bool = False) -> int:
    """The box move of a checked attempt, on the 0–3 scale (see the module docstring)."""
    if n_items < 1 or not 0 <= n_covered <= n_items:
        raise ValueError(f"covered items must be between 0 and {n_items}, got {n_covered}")
    missed = n_items - n_covered
    if missed == 0:
        rating = 3
    elif missed == 1 or missed <= n_items / 5:
        rating = 2
    elif n_covered >= n_items / 2:
        rating = 1
    else:
        rating = 0
    return min(rating, 1) if repeated_miss else rating


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Card:
    """One question's review state."""

    box: int = 0
    due: datetime | None = None  #: None: never attempted
    #: {"at": iso time, "rating": int} plus, for a checked attempt, "covered" and "missed": item keys
    history: list[dict] = field(default_factory=list)

    @property
    def last_rating(self) -> int | None:
        return self.history[-1]["rating"] if self.history else None

    def checked_attempts(self) -> list[dict]:
        """The attempts that ticked the checklist (not bare ratings)."""
        return [h for h in self.history if "missed" in h]


@dataclass(frozen=True)
class ItemStat:
    question: Question
    item: str
    missed: int
    tries: int  #: checked attempts that showed this item (same wording)


def migrate(data: dict) -> dict:
    """A progress file's JSON, brought to the current format. Format 1 held ratings only; its
    attempts are kept as rating-only attempts (they move boxes but say nothing about items)."""
    if not isinstance(data, dict) or not isinstance(data.get("questions"), dict):
        raise ValueError("expected a JSON object with a 'questions' object")
    version = data.get("version", 1)
    if not isinstance(version, int) or version < 1 or version > FORMAT_VERSION:
        raise ValueError(f"unknown progress format version {version!r} (this minigrpo reads 1 to {FORMAT_VERSION})")
    return {"version": FORMAT_VERSION, "questions": data["questions"]}


def _time(value, field: str, naive: list[str]) -> datetime:
    """An ISO time of the file; one without a timezone is read as UTC (and its field noted in ``naive``)."""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be an ISO date and time such as 2025-01-31T09:00:00+00:00, got {value!r}")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{field} must be an ISO date and time such as 2025-01-31T09:00:00+00:00, "
                         f"got {value!r}") from None
    if when.tzinfo is None:
        naive.append(field)
        when = when.replace(tzinfo=timezone.utc)
    return when


def _attempt(h, field: str, naive: list[str]) -> dict:
    """One history item, checked; a time without a timezone comes back with +00:00."""
    if not isinstance(h, dict):
        raise ValueError(f"{field} must be an object with 'at' and 'rating', got {h!r}")
    if "rating" not in h or "at" not in h:
        raise ValueError(f"{field} lacks {'rating' if 'rating' not in h else 'at'}")
    try:
        check_rating(h["rating"])
    except ValueError as exc:
        raise ValueError(f"{field}.rating: {exc}") from None
    when = _time(h["at"], f"{field}.at", naive)
    if ("covered" in h) != ("missed" in h):
        raise ValueError(f"{field} has {'covered' if 'covered' in h else 'missed'} without "
                         f"{'missed' if 'covered' in h else 'covered'}")
    for key in ("covered", "missed"):
        if key in h and (not isinstance(h[key], list) or not all(isinstance(k, str) for k in h[key])):
            raise ValueError(f"{field}.{key} must be a list of checklist-item keys (strings), got {h[key]!r}")
    if naive and naive[-1] == f"{field}.at":
        h = {**h, "at": when.isoformat()}
    return h


def parse_progress(raw) -> tuple[dict[str, Card], int | None, list[str]]:
    """A progress file's JSON as cards: ``(cards, the older format version read or None, the fields whose times
    had no timezone and were read as UTC)``. A ``ValueError`` names the field it cannot understand."""
    data = migrate(raw)
    version = raw.get("version", 1)
    cards: dict[str, Card] = {}
    naive: list[str] = []
    for qid, c in data["questions"].items():
        field = f"questions.{qid}"
        if not isinstance(c, dict):
            raise ValueError(f"{field} must be an object with 'box', 'due' and 'history', got {c!r}")
        box = c.get("box")
        if isinstance(box, bool) or not isinstance(box, int) or not 0 <= box < len(WAITS):
            raise ValueError(f"{field}.box must be an integer from 0 to {len(WAITS) - 1}, got {box!r}")
        history = c.get("history", [])
        if not isinstance(history, list):
            raise ValueError(f"{field}.history must be a list of attempts, got {history!r}")
        history = [_attempt(h, f"{field}.history[{i}]", naive) for i, h in enumerate(history)]
        due = _time(c["due"], f"{field}.due", naive) if c.get("due") is not None else None
        cards[qid] = Card(box, due, history)
    return cards, (version if version != FORMAT_VERSION else None), naive


def _when(h: dict) -> datetime:
    when = datetime.fromisoformat(h["at"])
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def merge_card(base: Card | None, disk: Card | None, mine: list[dict]) -> Card:
    """A question's card after this process's new attempts ``mine`` are added to what is on disk now.

    ``base`` is the card as this process read it. When the file still holds that history (plus attempts another
    process recorded since), every attempt after it is replayed in time order from ``base``'s box; when the file
    was changed in another way (edited, reset), this process's attempts are replayed on top of it."""
    base, disk = base or Card(), disk or Card()
    if disk.history[:len(base.history)] == base.history:
        box, head, later = base.box, base.history, disk.history[len(base.history):] + mine
    else:
        box, head, later = disk.box, disk.history, list(mine)
    later = sorted(later, key=_when)
    for h in later:
        box = next_box(box, h["rating"])
    if not later:
        return disk
    return Card(box, _when(later[-1]) + WAITS[box], head + later)


class Progress:
    """The learner's review state for every question, read from and written to one JSON file.

    :meth:`save` merges under a lock (:mod:`minigrpo_course.state`): the attempts recorded here since the last
    save are added to what is in the file now, so two terminals practising at once both keep their attempts."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path).expanduser() if path is not None else default_progress_path()
        self.cards: dict[str, Card] = {}
        self.migrated_from: int | None = None  #: the format version read, when older than FORMAT_VERSION
        #: fields of the file whose times had no timezone (read as UTC; written with +00:00 at the next save)
        self.naive_times: list[str] = []
        self._base: dict[str, Card] = {}  #: the cards as last read or saved
        self._new: dict[str, list[dict]] = {}  #: attempts recorded since then, by question
        if self.path.exists():
            self.cards, self.migrated_from, self.naive_times = self._read()
            self._base = dict(self.cards)

    def _read(self) -> tuple[dict[str, Card], int | None, list[str]]:
        try:
            raw = read_json(self.path, WHAT, default=lambda: None, check=parse_progress)
        except StateFileError as exc:
            raise ValueError(f"{exc} (or choose another file with --progress-file)") from None
        return ({}, None, []) if raw is None else parse_progress(raw)

    @property
    def unsaved(self) -> int:
        """How many recorded attempts are not in the file yet."""
        return sum(len(v) for v in self._new.values())

    def save(self) -> None:
        """Add the attempts recorded since the last save to the file, under its lock, atomically (a crash
        mid-write leaves the old file intact). A :class:`~minigrpo_course.state.StateFileError` (the folder is
        read-only, the disk full, the file became unreadable) leaves the file as it was and the attempts unsaved."""
        if not self._new:
            return
        merged: dict[str, Card] = {}

        def change(raw) -> dict:
            disk = {} if raw is None else parse_progress(raw)[0]
            merged.clear()
            merged.update(disk)
            for qid, mine in self._new.items():
                merged[qid] = merge_card(self._base.get(qid), disk.get(qid), mine)
            return {"version": FORMAT_VERSION, "questions": {
                qid: {"box": c.box, "due": c.due.isoformat() if c.due else None, "history": c.history}
                for qid, c in sorted(merged.items())}}

        update_json(self.path, change, WHAT, default=lambda: None, check=parse_progress)
        self.cards, self._base, self._new = dict(merged), dict(merged), {}

    def card(self, question_id: str) -> Card:
        return self.cards.get(question_id, Card())

    def _apply(self, question_id: str, rating: int, now: datetime | None, extra: dict) -> Card:
        now = now or _now()
        old = self.card(question_id)
        box = next_box(old.box, rating)
        attempt = {"at": now.isoformat(), "rating": rating, **extra}
        card = Card(box, now + WAITS[box], old.history + [attempt])
        self.cards[question_id] = card
        self._new.setdefault(question_id, []).append(attempt)
        return card

    def record(self, question_id: str, rating: int, now: datetime | None = None) -> Card:
        """Apply an attempt rated 0–3: move the question's box and set its next due time."""
        get(question_id)  # a clear error for an unknown id
        return self._apply(question_id, check_rating(rating), now, {})

    def record_checklist(self, question_id: str, covered: Iterable[int], now: datetime | None = None) -> Card:
        """Apply an attempt whose answer covered the checklist items ``covered`` (0-based indices):
        the missed items decide the box, and both lists are kept for the statistics."""
        q = get(question_id)
        covered = sorted(set(covered))
        bad = [i for i in covered if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(q.checklist)]
        if bad:
            raise ValueError(f"checklist items of {question_id!r} are numbered 1 to {len(q.checklist)}; "
                             f"got {', '.join(str(i + 1) if isinstance(i, int) else repr(i) for i in bad)}")
        keys = [item_key(item) for item in q.checklist]
        missed = [k for i, k in enumerate(keys) if i not in covered]
        last = self.card(question_id).checked_attempts()
        repeated = bool(last) and bool(set(missed) & set(last[-1]["missed"]))
        rating = rating_from_checklist(len(covered), len(keys), repeated)
        return self._apply(question_id, rating, now, {"covered": [keys[i] for i in covered], "missed": missed})

    def item_stats(self, question: Question) -> list[ItemStat]:
        """For each checklist item: in how many checked attempts it was missed, out of how many showed it."""
        attempts = self.card(question.id).checked_attempts()
        out = []
        for item in question.checklist:
            key = item_key(item)
            shown = [h for h in attempts if key in h["missed"] or key in h["covered"]]
            out.append(ItemStat(question, item, sum(key in h["missed"] for h in shown), len(shown)))
        return out

    def weakest_items(self, questions: list[Question] | None = None, limit: int = 5) -> list[ItemStat]:
        """The items missed most often (by share of tries, then count), at least once."""
        stats = [s for q in (QUESTIONS if questions is None else questions) for s in self.item_stats(q) if s.missed]
        return sorted(stats, key=lambda s: (-s.missed / s.tries, -s.missed, s.question.id))[:limit]

    def last_missed(self, question: Question) -> list[str]:
        """The items the last checked attempt missed, in checklist order."""
        attempts = self.card(question.id).checked_attempts()
        if not attempts:
            return []
        missed = set(attempts[-1]["missed"])
        return [item for item in question.checklist if item_key(item) in missed]

    def review_order(self, questions: list[Question] | None = None, now: datetime | None = None) -> list[Question]:
        """What to practise next: overdue questions (earliest due first), then ones never tried (in
        course order), then the rest by due time. Ties go to the lower box, then to the question whose
        last checked attempt missed more items."""
        now = now or _now()
        questions = list(QUESTIONS) if questions is None else questions
        position = {q.id: i for i, q in enumerate(QUESTIONS)}

        def key(q: Question):
            c = self.card(q.id)
            if c.due is None:
                return (1, 0.0, 0, 0, position[q.id])
            group = 0 if c.due <= now else 2
            return (group, c.due.timestamp(), c.box, -len(self.last_missed(q)), position[q.id])

        return sorted(questions, key=key)

    def is_due(self, question_id: str, now: datetime | None = None) -> bool:
        c = self.card(question_id)
        return c.due is None or c.due <= (now or _now())
