"""Mock interview rounds: ``minigrpo interview --mock SET``, one per interview question set.

A round runs in the interviewer's order:

1. **The brief**: the scenario, as the interviewer states it.
2. **Clarifying questions**, against a timer: you type what you would ask; then the questions a
   strong candidate asks are shown with the interviewer's replies, and you tick the ones you asked.
3. **Each part**, against its own timer: you answer, then tick the checklist points you covered.
   The follow-ups branch on that score. A strong answer (at most a fifth of the points missed) gets
   the interviewer's follow-up chain, each one a step deeper, until a reply misses its point. A weak
   answer gets probed instead: the interviewer comes back to the points you skipped.
4. **Follow-up questions** of the set, shorter timers, scored by their checklists.

Every scored answer is recorded in the spaced-review progress like any practice round, and the whole
round is written as a Markdown transcript to reread (default: ``mocks/`` in the minigrpo home folder).
The rounds are Markdown files, ``minigrpo_course/interview/questions/mock_*.md``, read like the question bank.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import TextIO

from minigrpo_course.interview.bank import (BankFormatError, Question, _blocks, _front_matter, _list_items, _split_headings,
                                            get)
from minigrpo_course.interview.schedule import Progress, rating_from_checklist
from minigrpo_course.interview.seeds import SeedSet, seed_set
from minigrpo_course.interview.terminal import (WIDTH, Terminated, _read_answer, _wrap, clock_text, format_checklist,
                                                parse_covered, readline, say_safely)
from minigrpo_course.state import StateFileError, atomic_write_text, keep_elsewhere

#: the rounds are ``mock_*.md`` files next to the topic files (inside the package ``minigrpo_course.interview``)
MOCKS_DIR = "questions"
#: a part scored at least this (0–3, from the checklist) gets the deeper follow-up chain
STRONG = 2
#: how many skipped points a weak answer gets probed on
PROBES = 2


@dataclass(frozen=True)
class ClarifyItem:
    ask: str  #: what a strong candidate asks
    reply: str  #: what the interviewer answers


@dataclass(frozen=True)
class Part:
    number: int
    question: Question
    minutes: float
    prompt: str  #: how the interviewer puts it (the bank question unless the round rephrases it)


@dataclass(frozen=True)
class Mock:
    seed: SeedSet
    title: str
    brief: str
    clarify_minutes: float
    clarify: tuple[ClarifyItem, ...]
    #: the bank entry whose checklist the clarifying questions are (ticks are recorded for it), if any
    clarify_question: Question | None
    parts: tuple[Part, ...]
    followup_minutes: float
    followups: tuple[Question, ...]

    @property
    def slug(self) -> str:
        return self.seed.slug

    @property
    def minutes(self) -> float:
        return self.clarify_minutes + sum(p.minutes for p in self.parts) + self.followup_minutes * len(self.followups)


# --------------------------------------------------------------------------------------------
# Reading the rounds
# --------------------------------------------------------------------------------------------

_CLARIFY = re.compile(r"Clarifying questions \((\d+(?:\.\d+)?) min\)")
_PART = re.compile(r"Part (\d+): ([a-z0-9-]+) \((\d+(?:\.\d+)?) min\)")
_FOLLOWUPS = re.compile(r"Follow-up questions \((\d+(?:\.\d+)?) min each\)")


def parse_mock(text: str, name: str = "<text>") -> Mock:
    """One round file; a :class:`~minigrpo_course.interview.bank.BankFormatError` names the file and the section."""
    try:
        meta, body = _front_matter(text)
        seed = seed_set(meta.get("set", ""))
        title = meta.get("title") or seed.name
        clarify_question = get(meta["clarify-question"]) if meta.get("clarify-question") else None
        _, sections = _split_headings(body, "## ")
        brief, clarify, clarify_minutes, parts, followups, followup_minutes = "", (), 0.0, [], (), 0.0
        for heading, lines in sections:
            where = f"section '## {heading}'"
            if heading == "Brief":
                brief = _blocks(lines)
            elif m := _CLARIFY.fullmatch(heading):
                clarify_minutes = float(m.group(1))
                items = []
                for item in _list_items(lines):
                    ask, sep, reply = item.partition(" → ")
                    if not sep:
                        raise ValueError(f"{where}: write each item as 'what to ask → the interviewer's reply', "
                                         f"got {item[:60]!r}")
                    items.append(ClarifyItem(ask.strip(), reply.strip()))
                clarify = tuple(items)
            elif m := _PART.fullmatch(heading):
                number, qid, minutes = int(m.group(1)), m.group(2), float(m.group(3))
                q = get(qid)
                parts.append(Part(number, q, minutes, _blocks(lines) or q.question))
            elif m := _FOLLOWUPS.fullmatch(heading):
                followup_minutes = float(m.group(1))
                followups = tuple(get(qid) for qid in _list_items(lines))
            else:
                raise ValueError(f"unknown {where}; expected 'Brief', 'Clarifying questions (N min)', "
                                 "'Part K: question-id (N min)' or 'Follow-up questions (N min each)'")
        if not brief or not clarify or not parts:
            raise ValueError("a round needs a '## Brief', a '## Clarifying questions (N min)' list and at least "
                             "one part")
        if [p.number for p in parts] != list(range(1, len(parts) + 1)):
            raise ValueError(f"parts must be numbered 1, 2, 3 … in order, got {[p.number for p in parts]}")
        if clarify_question is not None and len(clarify_question.checklist) != len(clarify):
            raise ValueError(f"the clarifying questions must match the {len(clarify_question.checklist)} checklist "
                             f"items of {clarify_question.id!r} one to one, got {len(clarify)}")
    except (ValueError, KeyError) as exc:
        raise BankFormatError(f"{name}: {exc}") from None
    return Mock(seed, title, brief, clarify_minutes, clarify, clarify_question, tuple(parts), followup_minutes,
                followups)


def _mock_files():
    folder = resources.files("minigrpo_course.interview").joinpath(MOCKS_DIR)
    return sorted((f for f in folder.iterdir() if f.name.startswith("mock_") and f.name.endswith(".md")),
                  key=lambda f: f.name)


def load_mocks() -> dict[str, Mock]:
    """Every round, by the slug of its question set, in set order."""
    mocks = {}
    for f in _mock_files():
        m = parse_mock(f.read_text(encoding="utf-8"), f"{MOCKS_DIR}/{f.name}")
        if m.slug in mocks:
            raise BankFormatError(f"{MOCKS_DIR}/{f.name}: a second round for the set {m.slug!r}")
        mocks[m.slug] = m
    return dict(sorted(mocks.items(), key=lambda kv: kv[1].seed.code))


def get_mock(name: str) -> Mock:
    """The round of a set, by slug, code or name (see :func:`minigrpo_course.interview.seeds.seed_set`)."""
    return load_mocks()[seed_set(name).slug]


# --------------------------------------------------------------------------------------------
# Running a round
# --------------------------------------------------------------------------------------------


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in (text.strip() or "(no answer)").splitlines())


@dataclass
class Transcript:
    """The round as Markdown, saved as it happens: after every section and every typed line (an atomic rewrite
    of a small file), so a closed terminal, SIGTERM or ``kill -9`` loses nothing that was typed."""

    lines: list[str] = field(default_factory=list)
    path: Path | None = None  #: where it is saved (None: kept in memory only)
    #: the lines of the answer being typed, shown at the end until the answer is complete
    pending: list[str] = field(default_factory=list)
    asking: str = ""  #: what the answer being typed replies to (shown above it)
    warn: Callable[[str], None] = say_safely

    def add(self, *blocks: str, answered: bool = False) -> None:
        """Append blocks; ``answered``: they hold the answer typed last, so it is no longer pending."""
        for b in blocks:
            self.lines.append(b)
            self.lines.append("")
        if answered:
            self.pending = []
        self.save()

    def typed(self, line: str) -> None:
        """A line of the answer being typed."""
        self.pending.append(line)
        self.save()

    def _pending_blocks(self) -> list[str]:
        if not self.pending:
            return []
        return [self.asking, "**You (still typing when the round ended):**", _quote("\n".join(self.pending))]

    def end(self, note: str) -> None:
        """The round ends early: the answer being typed, if any, then ``note``."""
        self.add(*self._pending_blocks(), note, answered=True)

    def text(self) -> str:
        lines = list(self.lines)
        for b in self._pending_blocks():
            lines += [b, ""]
        return "\n".join(lines).rstrip() + "\n"

    def save(self) -> None:
        if self.path is None:
            return
        try:
            atomic_write_text(self.path, self.text())
        except OSError as exc:
            kept = keep_elsewhere(self.text(), "mock-transcript")
            self.warn(f"minigrpo interview: could not write the transcript to {self.path} "
                      f"({exc.strerror or exc}); " + (f"writing it to {kept} instead" if kept else
                                                       "it is kept in memory and printed at the end"))
            self.path = kept


@dataclass
class PartScore:
    title: str
    covered: int
    items: int
    seconds: float
    budget: float  #: seconds
    followups_made: int = 0
    followups_asked: int = 0


class Stop(Exception):
    """The candidate typed q (or the input ended): end the round, keep what was done."""


class MockRound:
    def __init__(self, mock: Mock, progress: Progress, stdin: TextIO, stdout: TextIO,
                 clock: Callable[[], float] = time.monotonic, record: bool = True, transcript: Path | None = None):
        self.mock, self.progress, self.stdin, self.stdout, self.clock = mock, progress, stdin, stdout, clock
        self.record = record
        self.transcript = Transcript(path=transcript)
        self.scores: list[PartScore] = []
        self.stopped = False
        #: why the spaced-review progress could not be saved (None: saved, or not recorded)
        self.save_failed: str | None = None

    # ---- terminal helpers

    def say(self, text: str = "") -> None:
        print(text, file=self.stdout, flush=True)

    def answer(self, asking: str) -> str:
        self.transcript.pending, self.transcript.asking = [], asking
        text = _read_answer(self.stdin, self.stdout, on_line=self.transcript.typed)
        if text is None:
            raise Stop
        return text

    def save_progress(self, q: Question, covered: list[int]) -> None:
        """Record a scored answer for spaced review; if the progress file cannot be written, say so once (the
        answers stay in the transcript) and go on without recording."""
        if not self.record:
            return
        self.progress.record_checklist(q.id, covered)
        try:
            self.progress.save()
        except StateFileError as exc:
            self.record = False
            self.save_failed = str(exc)
            self.transcript.warn(f"minigrpo interview: {exc}; the round goes on, and your answers are kept in the "
                                 "transcript")

    def ask_line(self, prompt: str) -> str:
        print(prompt, end="", file=self.stdout, flush=True)
        line = readline(self.stdin)
        if not line or line.strip().lower() in ("q", "quit"):
            raise Stop
        return line

    def ticks(self, n_items: int) -> list[int]:
        while True:
            line = self.ask_line("Which points did your answer cover? (numbers like 1 3 4, all, none; q to stop): ")
            try:
                return parse_covered(line, n_items)
            except ValueError as exc:
                self.say(str(exc))

    def yes_no(self) -> bool:
        while True:
            line = self.ask_line("Did your reply make that point? (y/n; q to stop): ").strip().lower()
            if line in ("y", "yes", "n", "no"):
                return line.startswith("y")
            self.say("type y or n (or q to stop the round)")

    def timed_answer(self, minutes: float, asking: str) -> tuple[str, float]:
        self.say(f"[timer: {clock_text(minutes * 60)} for this]")
        start = self.clock()
        text = self.answer(asking)
        seconds = self.clock() - start
        over = seconds - minutes * 60
        note = f"took {clock_text(seconds)} of {clock_text(minutes * 60)}"
        if over > 0:
            note += f": {clock_text(over)} over (a real interviewer would have cut in)"
        self.say(f"[{note}]")
        return text, seconds

    # ---- the phases

    def run(self) -> None:
        m = self.mock
        self.transcript.add(f"# Mock round: {m.title}",
                            f"{datetime.now().strftime('%Y-%m-%d %H:%M')} · question set: {m.seed.name} · "
                            f"planned {clock_text(m.minutes * 60)}")
        self.say("=" * WIDTH + f"\nMock round: {m.title} (about {round(m.minutes)} minutes; q at any prompt stops)\n")
        self.say(_wrap(m.brief) + "\n")
        self.transcript.add("## The brief", m.brief)
        try:
            self.clarify()
            for part in m.parts:
                self.part(part)
            if m.followups:
                self.say("\n" + "=" * WIDTH + "\nFollow-up questions: shorter answers, same checklist scoring.")
                self.transcript.add("## Follow-up questions")
                for q in m.followups:
                    self.rapid(q)
        except Stop:
            self.stopped = True
            self.say("\nRound stopped; what you did so far is scored and saved.")
            self.transcript.end("*The round was stopped here.*")
        self.summary()

    def clarify(self) -> None:
        m = self.mock
        self.say("-" * WIDTH + "\nBefore you answer: what would you ask the interviewer? (one question per line)")
        asked, seconds = self.timed_answer(m.clarify_minutes, "## Clarifying questions\n\n**Interviewer:** What would you "
                                                                 "ask me before you answer?")
        self.transcript.add(f"## Clarifying questions ({clock_text(seconds)} of {clock_text(m.clarify_minutes * 60)})",
                            "**You asked:**", _quote(asked), answered=True)
        self.say("\nWhat a strong candidate asks, and the interviewer's replies:")
        for i, item in enumerate(m.clarify, 1):
            self.say(textwrap.fill(f"{item.ask} → {item.reply}", WIDTH, initial_indent=f"  {i:>2}. ",
                                   subsequent_indent="      "))
        covered = self.ticks(len(m.clarify))
        if m.clarify_question is not None:
            self.save_progress(m.clarify_question, covered)
        self.scores.append(PartScore("Clarifying questions", len(covered), len(m.clarify), seconds,
                                     m.clarify_minutes * 60))
        items = "\n".join(f"- [{'x' if i in covered else ' '}] {c.ask} *Interviewer:* {c.reply}"
                          for i, c in enumerate(m.clarify))
        self.transcript.add(f"**A strong candidate asks** ({len(covered)}/{len(m.clarify)} asked):", items)

    def _scored(self, q: Question, prompt: str, minutes: float, heading: str) -> tuple[list[int], PartScore]:
        self.say(_wrap(prompt) + "\n")
        text, seconds = self.timed_answer(minutes, f"{heading}\n\n**Interviewer:** {prompt}")
        self.transcript.add(f"{heading} ({clock_text(seconds)} of {clock_text(minutes * 60)})",
                            f"**Interviewer:** {prompt}", "**You:**", _quote(text), answered=True)
        self.say("\nA strong answer covers:\n" + format_checklist(q) + "\n")
        covered = self.ticks(len(q.checklist))
        self.save_progress(q, covered)
        missed = [i for i in range(len(q.checklist)) if i not in covered]
        self.say(f"covered {len(covered)}/{len(q.checklist)} points")
        items = "\n".join(f"- [{'x' if i in covered else ' '}] {item}" for i, item in enumerate(q.checklist))
        self.transcript.add(f"**Checklist: {len(covered)}/{len(q.checklist)} points** (`{q.id}`)", items,
                            f"<details><summary>Model answer</summary>\n\n{q.answer}\n\n</details>")
        return missed, PartScore(heading.lstrip("# "), len(covered), len(q.checklist), seconds, minutes * 60)

    def part(self, part: Part) -> None:
        q = part.question
        self.say("\n" + "-" * WIDTH + f"\nPart {part.number} of {len(self.mock.parts)} ({q.topic}; `{q.id}`)")
        missed, score = self._scored(q, part.prompt, part.minutes, f"## Part {part.number}: {_title(q)}")
        self.scores.append(score)
        if rating_from_checklist(score.covered, score.items) >= STRONG and q.followups:
            self.say("\nA good answer: the interviewer goes deeper.")
            self.transcript.add("### Follow-ups (a strong answer: the interviewer goes deeper)")
            for f in q.followups:
                made = self.followup(f.question, f.answer, score)
                if not made:
                    self.transcript.add("*The chain stops at the first reply that misses its point.*")
                    break
        elif missed:
            self.say("\nThe interviewer comes back to points you skipped.")
            self.transcript.add("### Probes (a weak answer: the interviewer comes back to skipped points)")
            for i in missed[:PROBES]:
                self.followup(f"Let's come back to something you did not cover: {q.checklist[i]}. Explain that.",
                              q.checklist[i], score)

    def followup(self, question: str, expected: str, score: PartScore) -> bool:
        self.say("\nInterviewer: " + textwrap.fill(question, WIDTH, subsequent_indent="  ") + "\n")
        text = self.answer(f"**Interviewer:** {question}")
        self.transcript.add(f"**Interviewer:** {question}", "**You:**", _quote(text), answered=True)
        self.say("What a good reply says:\n" + _wrap(expected) + "\n")
        made = self.yes_no()
        score.followups_asked += 1
        score.followups_made += made
        self.transcript.add(f"{'✓ made the point' if made else '✗ missed the point'}",
                            f"<details><summary>What a good reply says</summary>\n\n{expected}\n\n</details>")
        return made

    def rapid(self, q: Question) -> None:
        self.say("\n" + "-" * WIDTH + f"\nFollow-up question (`{q.id}`)")
        _, score = self._scored(q, q.question, self.mock.followup_minutes, f"### {_title(q)}")
        self.scores.append(score)

    def summary(self) -> None:
        covered = sum(s.covered for s in self.scores)
        items = sum(s.items for s in self.scores)
        spent = sum(s.seconds for s in self.scores)
        over = [s for s in self.scores if s.seconds > s.budget]
        rows = ["| section | points | time | follow-ups |", "|---|---|---|---|"]
        for s in self.scores:
            fu = f"{s.followups_made}/{s.followups_asked}" if s.followups_asked else "–"
            rows.append(f"| {s.title} | {s.covered}/{s.items} | {clock_text(s.seconds)} of {clock_text(s.budget)} "
                        f"| {fu} |")
        share = f"{covered}/{items} points ({covered / items:.0%})" if items else "nothing scored"
        verdict = [f"**Score: {share}**; {clock_text(spent)} spent, "
                   f"{len(over)} section(s) over time." + (" Stopped early." if self.stopped else "")]
        weak = [s.title for s in self.scores if s.items and s.covered / s.items < 0.5]
        if weak:
            verdict.append("Revisit: " + "; ".join(weak) + ".")
        self.transcript.add("## Summary", *(["\n".join(rows)] if self.scores else []), " ".join(verdict))
        self.say("\n" + "=" * WIDTH
                 + f"\nRound over: {share}, {clock_text(spent)} spent, {len(over)} section(s) over time.")
        if weak:
            self.say("Revisit: " + "; ".join(weak))


def _title(q: Question) -> str:
    return textwrap.shorten(q.question, 80, placeholder=" …")


def default_transcript_path(mock: Mock, when: datetime | None = None) -> Path:
    from minigrpo_course.progress import home

    when = when or datetime.now()
    return home() / "mocks" / f"{mock.slug}-{when.strftime('%Y%m%d-%H%M%S')}.md"


def run_mock(mock: Mock, progress: Progress, stdin: TextIO, stdout: TextIO, transcript: Path | str | None = None,
             clock: Callable[[], float] = time.monotonic, record: bool = True) -> tuple[MockRound, Path]:
    """Run one round. The transcript is saved as the round goes (every typed line), and once more at the end
    with the summary, even if the round is stopped (q), interrupted (Ctrl-C) or ended by SIGHUP/SIGTERM
    (:class:`~minigrpo_course.interview.terminal.Terminated`, re-raised after the save).
    Returns the round (scores, transcript) and where the transcript went."""
    path = Path(transcript).expanduser() if transcript else default_transcript_path(mock)
    r = MockRound(mock, progress, stdin, stdout, clock, record, transcript=path)
    try:
        r.run()
    except Terminated as t:
        r.transcript.end(f"*The round ended here: {t.why} ({t.name}).*")
        raise
    except KeyboardInterrupt:
        r.transcript.end("*The round was interrupted here (Ctrl-C).*")
        raise
    finally:
        r.transcript.save()
        if r.transcript.path is None:  # even the temporary folder refused it: print it, it is all there is
            say_safely(r.transcript.text(), stdout)
        else:
            say_safely(f"transcript: {r.transcript.path}", stdout)
    return r, r.transcript.path or path


def list_mocks(stdout: TextIO) -> None:
    for m in load_mocks().values():
        parts = ", ".join(p.question.id for p in m.parts)
        print(f"  --mock {m.slug:14s} {m.title} (about {round(m.minutes)} min): {parts}", file=stdout)
