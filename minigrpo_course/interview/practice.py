"""``minigrpo interview``: practise the interview questions in a terminal, with spaced review.

    minigrpo interview                    # a session: question, your answer, checklist + model answer,
                                          # then tick the checklist items your answer covered
    minigrpo interview --topic grpo       # only one topic
    minigrpo interview --list             # every question, in the order you should review them
    minigrpo interview --show grpo-step   # print one question with its checklist and answer
    minigrpo interview --id grpo-step --answer "..." --covered 1,3,4   # one round without prompts
    minigrpo interview --stats            # how far you are, per topic, and the points you miss most
    minigrpo interview --mock debugging   # a timed mock round of one interview, transcript saved
    minigrpo interview --drill gae        # a derivation, checked step by step
    minigrpo interview --code grpo-loss   # a blank-page coding drill against the clock, hidden tests
    minigrpo interview --flaws            # spot the flaw in claims from real interview guides

The items you miss decide when a question comes back (``schedule.py``); a 0–3 self-rating
(``--rating``) is still accepted. Ctrl-C stops a session; every attempt recorded so far is saved.

Nothing typed is lost: each attempt is saved as soon as it is scored (merged under a lock, so two terminals
can practise at once); a mock round's transcript is saved line by line; a closed terminal (SIGHUP) or SIGTERM
saves and ends with one line (exit status 129 / 143). Paths that cannot be written (``--progress-file``,
``--transcript``, ``--file``) are refused before anything is asked (exit status 2); a save that fails later keeps
the answer in a file in the temporary folder and names it (exit status 1).
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path
from typing import TextIO

from minigrpo_course.interview.bank import QUESTIONS, SEED_QUESTIONS, TOPICS, Question, by_topic, get
from minigrpo_course.interview.schedule import PROGRESS_ENV_VAR, RATINGS, Progress, check_rating
from minigrpo_course.interview.terminal import (WIDTH, Terminated, _read_answer, _wrap, format_checklist, parse_covered,
                                                readline, say_safely, stop_on_hangup)
from minigrpo_course.state import StateFileError, UnwritableStateFile, check_writable, keep_elsewhere

#: exit status after Ctrl-C (128 + SIGINT), as shells report it
INTERRUPTED = 130

def format_question(q: Question) -> str:
    where = f'{q.demo.notebook}, the cell with "{q.demo.fragment}"'
    seeds = "; ".join(q.seed_labels)
    return (f"[{q.id}] topic: {q.topic}; asked in {seeds}\n\n{_wrap(q.question)}\n\n"
            f"  see it in lesson {q.demo.lesson}: {where}")


def format_reveal(q: Question) -> str:
    return f"A strong answer covers:\n{format_checklist(q)}\n\nModel answer:\n{_wrap(q.answer)}"


def format_followups(q: Question) -> str:
    """The interviewer's follow-ups, each with what a good reply says ("" if the entry has none)."""
    if not q.followups:
        return ""
    parts = ["Follow-ups an interviewer asks next:"]
    for i, f in enumerate(q.followups, 1):
        parts.append(textwrap.fill(f.question, WIDTH, initial_indent=f"  {i}. ", subsequent_indent="     ")
                     + "\n" + _wrap(f.answer, indent="     "))
    return "\n\n".join(parts)


def parse_rating(text: str | int) -> int:
    """``"2"`` -> 2; anything but 0, 1, 2 or 3 is a ValueError that names the valid ratings."""
    if isinstance(text, str):
        text = text.strip()
        if re.fullmatch(r"[+-]?\d+", text):
            text = int(text)
    return check_rating(text)


def _read_covered(stdin: TextIO, stdout: TextIO, n_items: int) -> list[int] | None:
    while True:
        print(f"Which points did your answer cover? (numbers like 1 3 4, all, none; q to stop): ", end="",
              file=stdout, flush=True)
        line = readline(stdin)
        if not line or line.strip().lower() in ("q", "quit"):
            return None
        try:
            return parse_covered(line, n_items)
        except ValueError as exc:
            print(exc, file=stdout)


def _read_rating(stdin: TextIO, stdout: TextIO) -> int | None:
    scale = ", ".join(f"{k} {v.split(':')[0]}" for k, v in RATINGS.items())
    while True:
        print(f"Rate your answer ({scale}; q to stop): ", end="", file=stdout, flush=True)
        line = readline(stdin)
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


def _next_review(card) -> str:
    return f"box {card.box}, next review {card.due.astimezone().strftime('%Y-%m-%d %H:%M')}"


class NotSaved(Exception):
    """The progress file could not be written; the message (one sentence) says where the answer was kept."""


def _save(progress: Progress, q: Question, answer: str | None, how: str) -> None:
    """Save the attempt just recorded; if the file cannot be written, keep the answer and the command that
    records it again in a file in the temporary folder, and raise :class:`NotSaved` naming it."""
    try:
        progress.save()
    except StateFileError as exc:
        again = f"minigrpo interview --id {q.id} {how}"
        kept = keep_elsewhere(f"# {q.id}\n\n{q.question}\n\n## Your answer\n\n{answer or '(none typed)'}\n\n"
                              f"## Record it again\n\n    {again}\n", "answer")
        where = (f"your answer was kept in {kept}" if kept is not None
                 else f"your answer was: {' / '.join((answer or '(none typed)').splitlines())}")
        what = str(exc) if isinstance(exc, UnwritableStateFile) else f"your attempt was not saved: {exc}"
        raise NotSaved(f"{what}; {where}; record it later with: {again}") from None


def _record(progress: Progress, q: Question, rating: int, stdout: TextIO, answer: str | None = None) -> None:
    card = progress.record(q.id, rating)
    _save(progress, q, answer, f"--rating {rating}")
    print(f"\nrated {rating} ({RATINGS[rating]}): {_next_review(card)}", file=stdout)


def _record_checklist(progress: Progress, q: Question, covered: list[int], stdout: TextIO,
                      answer: str | None = None) -> None:
    card = progress.record_checklist(q.id, covered)
    _save(progress, q, answer, f"--covered {','.join(str(i + 1) for i in covered) or 'none'}")
    missed = [i for i in range(len(q.checklist)) if i not in covered]
    print(f"\ncovered {len(covered)}/{len(q.checklist)} points: {_next_review(card)}", file=stdout)
    if missed:
        print("missed (come back to these):", file=stdout)
        for i in missed:
            print(textwrap.fill(q.checklist[i], WIDTH, initial_indent=f"  {i + 1:>2}. ", subsequent_indent="      "),
                  file=stdout)
    repeat = [s for s in progress.item_stats(q) if s.missed > 1 and s.item in [q.checklist[i] for i in missed]]
    for s in repeat:
        print(f"you miss \"{_short(s.item)}\" in {s.missed} of {s.tries} tries", file=stdout)


def _short(item: str, width: int = 70) -> str:
    return textwrap.shorten(item, width, placeholder=" …")


def session(progress: Progress, questions: list[Question], count: int, stdin: TextIO, stdout: TextIO) -> int:
    """Ask up to ``count`` questions in review order; after each answer the learner ticks the
    checklist items they covered. Returns how many attempts were recorded."""
    done = 0
    for q in progress.review_order(questions)[:count]:
        print("\n" + "=" * WIDTH + "\n" + format_question(q) + "\n", file=stdout)
        attempts = progress.card(q.id).checked_attempts()
        if attempts:
            last = attempts[-1]
            print(f"  last try: {len(last['covered'])} of {len(last['covered']) + len(last['missed'])} points\n",
                  file=stdout)
        answer = _read_answer(stdin, stdout)
        if answer is None:
            break
        print("\n" + format_reveal(q) + "\n", file=stdout)
        covered = _read_covered(stdin, stdout, len(q.checklist))
        if covered is None:
            break
        _record_checklist(progress, q, covered, stdout, answer)
        done += 1
    print(f"\n{done} question(s) checked; progress saved in {progress.path}", file=stdout)
    return done


def list_questions(progress: Progress, questions: list[Question], stdout: TextIO) -> None:
    print(f"{'#':>3}  {'id':24s} {'topic':10s} {'box':>3}  {'when':18s} question", file=stdout)
    for i, q in enumerate(progress.review_order(questions), 1):
        box = progress.card(q.id).box if progress.card(q.id).due else "-"
        print(f"{i:>3}  {q.id:24s} {q.topic:10s} {box!s:>3}  {_due_text(progress, q):18s} "
              f"{textwrap.shorten(q.question, 60)}", file=stdout)


def stats(progress: Progress, stdout: TextIO, questions: list[Question] | None = None) -> None:
    """Per topic: questions tried, due, and the share of checklist points the last checked attempts
    covered; then the points missed most often."""
    print(f"{'topic':10s} {'tried':>7s} {'due':>5s} {'points covered (last try)':>27s}", file=stdout)
    for topic in TOPICS:
        qs = by_topic(topic)
        tried = [q for q in qs if progress.card(q.id).due is not None]
        last = [progress.card(q.id).checked_attempts()[-1] for q in tried if progress.card(q.id).checked_attempts()]
        covered = sum(len(h["covered"]) for h in last)
        total = covered + sum(len(h["missed"]) for h in last)
        due = sum(progress.is_due(q.id) for q in qs)
        share = f"{covered}/{total} ({covered / total:.0%})" if total else "-"
        print(f"{topic:10s} {len(tried):>3}/{len(qs):<3} {due:>5} {share:>27s}", file=stdout)
    total_tried = sum(progress.card(q.id).due is not None for q in QUESTIONS)
    print(f"\n{total_tried}/{len(QUESTIONS)} questions tried; they cover {len(SEED_QUESTIONS)} interview "
          f"questions and follow-ups. Progress file: {progress.path}", file=stdout)
    weakest = progress.weakest_items(questions)
    if weakest:
        print("\nThe points you miss most often:", file=stdout)
        for s in weakest:
            print(f"  you miss \"{_short(s.item)}\" in {s.missed} of {s.tries} tries  [{s.question.id}]", file=stdout)


DESCRIPTION = ("Practise the interview questions in the terminal: answer, compare with the checklist and the "
               "model answer, tick the points you covered; the points you miss decide when a question comes back.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("--topic", help=f"only this topic ({', '.join(TOPICS)})")
    parser.add_argument("--list", action="store_true", help="list the questions in the order to review them")
    parser.add_argument("--show", metavar="ID", help="print one question with its checklist and model answer")
    parser.add_argument("--id", help="the question for --answer/--covered/--rating (default: the next one due)")
    parser.add_argument("--answer", metavar="TEXT",
                        help="your answer, for a round without prompts (needs --covered or --rating)")
    parser.add_argument("--covered", metavar="ITEMS",
                        help="the checklist points your answer covered, e.g. 1,3,4 or 2-5, all or none; "
                             "recorded without prompts")
    parser.add_argument("--rating", metavar="N", help="record a 0-3 self-rating instead of ticking the checklist")
    parser.add_argument("--stats", action="store_true", help="progress per topic and the points you miss most")
    parser.add_argument("--count", type=int, default=5, help="questions per interactive session (default 5)")
    parser.add_argument("--mock", nargs="?", const="", metavar="SET",
                        help="a timed mock interview round for one question set (without SET: list the rounds); "
                             "a Markdown transcript is saved")
    parser.add_argument("--transcript", metavar="PATH",
                        help="where --mock writes its transcript (default: mocks/ in $MINIGRPO_HOME or ~/.minigrpo)")
    parser.add_argument("--drill", nargs="?", const="", metavar="NAME",
                        help="a derivation drill, checked step by step (without NAME: list them)")
    parser.add_argument("--code", nargs="?", const="", metavar="NAME",
                        help="a blank-page coding drill against the clock: writes the task into an empty file, then "
                             "runs the hidden tests on Enter (without NAME: list them)")
    parser.add_argument("--file", metavar="PATH",
                        help="the file of a --code drill (default: drills/ in the minigrpo home)")
    parser.add_argument("--check", action="store_true", help="with --code: run the hidden tests on the file and exit "
                                                            "(status 0 when every case passes, 1 otherwise)")
    parser.add_argument("--solution", action="store_true", help="with --code: print the reference answer")
    parser.add_argument("--flaws", action="store_true",
                        help="\"spot the flaw\" cards: wrong or dated claims from the interview question sets")
    parser.add_argument("--progress-file", help=f"where progress is kept (default: ${PROGRESS_ENV_VAR}, else "
                                                "interview.json in $MINIGRPO_HOME, else in ~/.minigrpo)")


def _extra_modes(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int | None:
    """--drill, --code and --flaws (they keep no spaced-review progress); None when none is asked for."""
    drill, code = getattr(args, "drill", None), getattr(args, "code", None)
    code_only = getattr(args, "check", False) or getattr(args, "solution", False) or getattr(args, "file", None)
    if code_only and code is None:
        raise ValueError("--check, --solution and --file go with --code NAME")
    if drill is not None:
        from minigrpo_course.interview.drills import get_drill, list_drills, run_drill

        if not drill:
            print("Derivation drills (minigrpo interview --drill NAME):", file=stdout)
            list_drills(stdout)
        else:
            run_drill(get_drill(drill), stdin, stdout)
        return 0
    if code is not None:
        from minigrpo_course.interview import coding

        if not code:
            print("Coding drills (minigrpo interview --code NAME):", file=stdout)
            coding.list_code_drills(stdout)
            return 0
        return coding.run_code_drill(coding.get_code_drill(code), args.file, stdin, stdout, check_only=args.check,
                                     solution=args.solution)
    if getattr(args, "flaws", False):
        from minigrpo_course.interview.flaws import run_flaws

        run_flaws(stdin, stdout)
        return 0
    return None


def _check_paths(args: argparse.Namespace, progress: Progress | None, records: bool) -> None:
    """Refuse, before anything is asked, a path that cannot be written: the progress file (when this command
    records), the transcript of a mock round, the file of a coding drill."""
    transcript = getattr(args, "transcript", None)
    if transcript and getattr(args, "mock", None):
        check_writable(transcript, "transcript")
    code_file = getattr(args, "file", None)
    if code_file and getattr(args, "code", None) and not getattr(args, "solution", False):
        path = Path(code_file).expanduser()
        if path.is_dir():
            raise ValueError(f"the drill file {path} is a folder; give a file name")
        if not path.exists() and not getattr(args, "check", False):
            check_writable(path, "drill file")
    if records and progress is not None:
        try:
            check_writable(progress.path, "progress file")
        except ValueError as exc:
            raise ValueError(f"{exc}; nothing was recorded (choose another file with --progress-file or "
                             f"${PROGRESS_ENV_VAR})") from None


def _note_naive_times(progress: Progress) -> None:
    if progress.naive_times:
        n, first = len(progress.naive_times), progress.naive_times[0]
        print(f"minigrpo interview: note: {progress.path} has {n} time(s) without a timezone (the first: {first}); "
              "they were read as UTC and are written with +00:00 when progress is next saved", file=sys.stderr)


def run(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """The ``minigrpo interview`` command. Exit status: 0 done; 1 a coding drill that fails, or an answer that
    could not be saved (kept in a named file); 2 bad input (one line); 130 Ctrl-C; 129/143 SIGHUP/SIGTERM."""
    with stop_on_hangup():
        return _run(args, stdin, stdout)


def _run(args: argparse.Namespace, stdin: TextIO | None, stdout: TextIO | None) -> int:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    progress = None
    try:
        questions = by_topic(args.topic)
        if args.show:
            q = get(args.show)
            print(format_question(q) + "\n\n" + format_reveal(q), file=stdout)
            if q.followups:
                print("\n" + format_followups(q), file=stdout)
            return 0
        covered_text = getattr(args, "covered", None)
        if args.answer is not None and args.rating is None and covered_text is None:
            raise ValueError("--answer needs --rating N (0-3) or --covered ITEMS (the checklist points you covered, "
                             "e.g. 1,3,4): score your answer after reading the checklist, or leave out --answer "
                             "for an interactive session")
        if args.rating is not None and covered_text is not None:
            raise ValueError("give --covered or --rating, not both")
        rating = None if args.rating is None else parse_rating(args.rating)
        if args.count < 1:
            raise ValueError(f"--count must be at least 1, got {args.count}")
        _check_paths(args, None, records=False)
        extra = _extra_modes(args, stdin, stdout)
        if extra is not None:
            return extra
        progress = Progress(args.progress_file)
        _note_naive_times(progress)
        mock = getattr(args, "mock", None)
        records = not (args.list or args.stats) and (mock is None or mock != "")
        try:
            _check_paths(args, progress, records)
        except ValueError as exc:
            kept = keep_elsewhere(f"## Your answer\n\n{args.answer}\n", "answer") if args.answer else None
            if kept is None:
                raise
            raise ValueError(f"{exc}; your answer was kept in {kept}") from None
        if mock is not None:
            from minigrpo_course.interview.mock import get_mock, list_mocks, run_mock

            if not mock:
                print("Mock interview rounds (minigrpo interview --mock SET):", file=stdout)
                list_mocks(stdout)
                return 0
            r, _ = run_mock(get_mock(mock), progress, stdin, stdout, transcript=getattr(args, "transcript", None))
            return 1 if r.save_failed else 0
        if args.list:
            list_questions(progress, questions, stdout)
        elif args.stats:
            stats(progress, stdout)
        elif rating is not None or covered_text is not None:
            q = get(args.id) if args.id else progress.review_order(questions)[0]
            covered = None if covered_text is None else parse_covered(covered_text, len(q.checklist))
            print(format_question(q), file=stdout)
            if args.answer:
                print("\nYour answer:\n" + _wrap(args.answer), file=stdout)
            print("\n" + format_reveal(q), file=stdout)
            if covered is None:
                _record(progress, q, rating, stdout, args.answer)
            else:
                _record_checklist(progress, q, covered, stdout, args.answer)
        else:
            if args.id:
                questions = [get(args.id)]
            session(progress, questions, args.count, stdin, stdout)
        return 0
    except NotSaved as exc:
        print(f"minigrpo interview: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"minigrpo interview: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Each attempt is saved as soon as it is scored; saving again covers a Ctrl-C in between.
        return _stopped(progress, "\nminigrpo interview: stopped", INTERRUPTED)
    except Terminated as t:
        return _stopped(progress, f"\nminigrpo interview: stopped by {t.name} ({t.why})", 128 + t.signum)


def _stopped(progress: Progress | None, first: str, status: int) -> int:
    """Save what is unsaved and say where it is, in one line that may have nowhere to go (a closed terminal)."""
    if progress is not None and (progress.cards or progress.unsaved):
        try:
            progress.save()
            say_safely(f"{first}; your progress is saved in {progress.path}")
        except StateFileError as exc:
            say_safely(f"{first}; {exc}")
    else:
        say_safely(f"{first}; nothing was rated, so there is nothing to save")
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # the terminal is gone: let the exit not complain about it
        import os

        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
    return status
