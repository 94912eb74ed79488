"""``minigrpo interview``: practise the interview questions in a terminal, with spaced review.

    minigrpo interview                    # a session: question, your answer, checklist + model answer, rate 0-3
    minigrpo interview --topic grpo       # only one topic
    minigrpo interview --list             # every question, in the order you should review them
    minigrpo interview --show grpo-step   # print one question with its checklist and answer
    minigrpo interview --id grpo-step --answer "..." --rating 2   # one round without prompts
    minigrpo interview --stats            # how far you are, per topic

Ctrl-C stops a session; every rating given so far is already saved.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from typing import TextIO

from minigrpo.interview.bank import QUESTIONS, SEED_QUESTIONS, TOPICS, Question, by_topic, get
from minigrpo.interview.schedule import PROGRESS_ENV_VAR, RATINGS, Progress, check_rating

#: exit status after Ctrl-C (128 + SIGINT), as shells report it
INTERRUPTED = 130

WIDTH = 100


def _wrap(text: str, indent: str = "  ") -> str:
    """Wrap each paragraph to WIDTH; lines inside ``` code blocks are kept as they are."""
    out: list[str] = []
    para: list[str] = []
    in_code = False

    def flush() -> None:
        if para:
            out.append(textwrap.fill(" ".join(para), WIDTH, initial_indent=indent, subsequent_indent=indent))
            para.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            in_code = not in_code
        elif in_code:
            out.append(indent + line)
        elif not line.strip():
            flush()
            out.append("")
        else:
            para.append(line.strip())
    flush()
    return "\n".join(out)


def format_question(q: Question) -> str:
    where = f'{q.demo.notebook}, the cell with "{q.demo.fragment}"'
    seeds = "; ".join(q.seed_labels)
    return f"[{q.id}] topic: {q.topic}; asked in {seeds}\n\n{_wrap(q.question)}\n\n  see it in lesson {q.demo.lesson}: {where}"


def format_reveal(q: Question) -> str:
    checklist = "\n".join(textwrap.fill(item, WIDTH, initial_indent="  - ", subsequent_indent="    ")
                          for item in q.checklist)
    return f"A strong answer covers:\n{checklist}\n\nModel answer:\n{_wrap(q.answer)}"


def _read_answer(stdin: TextIO, stdout: TextIO) -> str | None:
    """Lines until an empty line; None at end of input."""
    print("Your answer (finish with an empty line):", file=stdout, flush=True)
    lines = []
    while True:
        line = stdin.readline()
        if not line:
            return "\n".join(lines) if lines else None
        if not line.strip():
            return "\n".join(lines)
        lines.append(line.rstrip("\n"))


def parse_rating(text: str | int) -> int:
    """``"2"`` -> 2; anything but 0, 1, 2 or 3 is a ValueError that names the valid ratings."""
    if isinstance(text, str):
        text = text.strip()
        if re.fullmatch(r"[+-]?\d+", text):
            text = int(text)
    return check_rating(text)


def _read_rating(stdin: TextIO, stdout: TextIO) -> int | None:
    scale = ", ".join(f"{k} {v.split(':')[0]}" for k, v in RATINGS.items())
    while True:
        print(f"Rate your answer ({scale}; q to stop): ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line or line.strip().lower() in ("q", "quit"):
            return None
        try:
            return parse_rating(line)
        except ValueError as exc:
            print(exc, file=stdout)


def _due_text(progress: Progress, q: Question) -> str:
    card = progress.card(q.id)
    if card.due is None:
        return "new"
    if progress.is_due(q.id):
        return "due now"
    return "due " + card.due.astimezone().strftime("%Y-%m-%d %H:%M")


def _record(progress: Progress, q: Question, rating: int, stdout: TextIO) -> None:
    card = progress.record(q.id, rating)
    progress.save()
    print(f"\nrated {rating} ({RATINGS[rating]}): box {card.box}, next review "
          f"{card.due.astimezone().strftime('%Y-%m-%d %H:%M')}", file=stdout)


def session(progress: Progress, questions: list[Question], count: int, stdin: TextIO, stdout: TextIO) -> int:
    """Ask up to ``count`` questions in review order; returns how many were rated."""
    rated = 0
    for q in progress.review_order(questions)[:count]:
        print("\n" + "=" * WIDTH + "\n" + format_question(q) + "\n", file=stdout)
        answer = _read_answer(stdin, stdout)
        if answer is None:
            break
        print("\n" + format_reveal(q) + "\n", file=stdout)
        rating = _read_rating(stdin, stdout)
        if rating is None:
            break
        _record(progress, q, rating, stdout)
        rated += 1
    print(f"\n{rated} question(s) rated; progress saved in {progress.path}", file=stdout)
    return rated


def list_questions(progress: Progress, questions: list[Question], stdout: TextIO) -> None:
    print(f"{'#':>3}  {'id':24s} {'topic':10s} {'box':>3}  {'when':18s} question", file=stdout)
    for i, q in enumerate(progress.review_order(questions), 1):
        box = progress.card(q.id).box if progress.card(q.id).due else "-"
        print(f"{i:>3}  {q.id:24s} {q.topic:10s} {box!s:>3}  {_due_text(progress, q):18s} "
              f"{textwrap.shorten(q.question, 60)}", file=stdout)


def stats(progress: Progress, stdout: TextIO) -> None:
    print(f"{'topic':10s} {'tried':>7s} {'due':>5s} {'mean last rating':>17s}", file=stdout)
    for topic in TOPICS:
        qs = by_topic(topic)
        tried = [q for q in qs if progress.card(q.id).due is not None]
        last = [progress.card(q.id).last_rating for q in tried]
        due = sum(progress.is_due(q.id) for q in qs)
        mean = f"{sum(last) / len(last):.1f}" if last else "-"
        print(f"{topic:10s} {len(tried):>3}/{len(qs):<3} {due:>5} {mean:>17s}", file=stdout)
    total_tried = sum(progress.card(q.id).due is not None for q in QUESTIONS)
    print(f"\n{total_tried}/{len(QUESTIONS)} questions tried; they cover {len(SEED_QUESTIONS)} interview "
          f"questions and follow-ups. Progress file: {progress.path}", file=stdout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", help=f"only this topic ({', '.join(TOPICS)})")
    parser.add_argument("--list", action="store_true", help="list the questions in the order to review them")
    parser.add_argument("--show", metavar="ID", help="print one question with its checklist and model answer")
    parser.add_argument("--id", help="the question for --answer/--rating (default: the next one due)")
    parser.add_argument("--answer", metavar="TEXT", help="your answer, for a round without prompts (needs --rating)")
    parser.add_argument("--rating", metavar="N", help="rate your answer 0-3 and record it (no prompts)")
    parser.add_argument("--stats", action="store_true", help="progress per topic")
    parser.add_argument("--count", type=int, default=5, help="questions per interactive session (default 5)")
    parser.add_argument("--progress-file", help=f"where progress is kept (default: ${PROGRESS_ENV_VAR} or "
                                                "~/.minigrpo/interview.json)")


def run(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    progress = None
    try:
        questions = by_topic(args.topic)
        if args.show:
            q = get(args.show)
            print(format_question(q) + "\n\n" + format_reveal(q), file=stdout)
            return 0
        if args.answer is not None and args.rating is None:
            raise ValueError("--answer needs --rating N (0-3): rate your answer after reading the model answer, "
                             "or leave out --answer for an interactive session")
        rating = None if args.rating is None else parse_rating(args.rating)
        if args.count < 1:
            raise ValueError(f"--count must be at least 1, got {args.count}")
        progress = Progress(args.progress_file)
        if args.list:
            list_questions(progress, questions, stdout)
        elif args.stats:
            stats(progress, stdout)
        elif rating is not None:
            q = get(args.id) if args.id else progress.review_order(questions)[0]
            print(format_question(q), file=stdout)
            if args.answer:
                print("\nYour answer:\n" + _wrap(args.answer), file=stdout)
            print("\n" + format_reveal(q), file=stdout)
            _record(progress, q, rating, stdout)
        else:
            if args.id:
                questions = [get(args.id)]
            session(progress, questions, args.count, stdin, stdout)
        return 0
    except ValueError as exc:
        print(f"minigrpo interview: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Each rating is saved as soon as it is given; saving again covers a Ctrl-C in between.
        if progress is not None and progress.cards:
            progress.save()
            print(f"\nminigrpo interview: stopped; your progress is saved in {progress.path}", file=sys.stderr)
        else:
            print("\nminigrpo interview: stopped; nothing was rated, so there is nothing to save", file=sys.stderr)
        return INTERRUPTED
