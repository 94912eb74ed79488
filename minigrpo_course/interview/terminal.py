"""The text interface the practice modes share (``practice``, ``mock``, ``drills``, ``flaws``, ``coding``):
paragraphs wrapped to :data:`WIDTH`, an answer read up to an empty line, a question's checklist and the items a
learner says they covered, a clock. It imports none of the modes (only the bank's ``Question``), so each of them
imports it without going round in a circle.
"""

from __future__ import annotations

import re
import signal
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from minigrpo_course.interview.bank import Question

WIDTH = 100


def _wrap(text: str, indent: str = "  ") -> str:
    """Wrap each paragraph to WIDTH; lines inside ``` code blocks are kept as they are."""
    out: list[str] = []
    para: list[str] = []
    in_code = False

    def flush() -> None:
        if para:
            out.append(textwrap.fill(" ".join(para), WIDTH, initial_indent=indent, subsequent_indent=indent,
                                     break_on_hyphens=False))
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


def format_checklist(q: Question) -> str:
    return "\n".join(textwrap.fill(item, WIDTH, initial_indent=f"  {i:>2}. ", subsequent_indent="      ")
                     for i, item in enumerate(q.checklist, 1))


def _read_answer(stdin: TextIO, stdout: TextIO, on_line: Callable[[str], None] | None = None) -> str | None:
    """Lines until an empty line; None at end of input. ``on_line`` gets each line as it is typed (the mock
    round saves it at once, so that a closed terminal or ``kill -9`` loses nothing typed)."""
    print("Your answer (finish with an empty line):", file=stdout, flush=True)
    lines = []
    while True:
        line = readline(stdin)
        if not line:
            return "\n".join(lines) if lines else None
        if not line.strip():
            return "\n".join(lines)
        lines.append(line.rstrip("\n"))
        if on_line is not None:
            on_line(lines[-1])


def parse_covered(text: str, n_items: int) -> list[int]:
    """The checklist items a learner says they covered, as 0-based indices: ``"1 3 4"``, ``"1,3-5"``,
    ``"all"`` or ``"none"``. Anything else is a ValueError that says what to type."""
    words = text.replace(",", " ").split()
    if len(words) == 1 and words[0].lower() in ("all", "none"):
        return list(range(n_items)) if words[0].lower() == "all" else []
    hint = (f"type the numbers of the checklist items your answer covered (1 to {n_items}), e.g. 1 3 4 or 2-5, "
            "or all, or none")
    if not words:
        raise ValueError(f"{hint}; got nothing")
    covered: set[int] = set()
    for w in words:
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", w)
        if not m:
            raise ValueError(f"{hint}; got {text.strip()!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if not 1 <= lo <= hi <= n_items:
            raise ValueError(f"the checklist has items 1 to {n_items}; got {w!r}")
        covered.update(range(lo - 1, hi))
    return sorted(covered)


def clock_text(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Terminated(BaseException):
    """The terminal was closed (SIGHUP) or the process was asked to stop (SIGTERM). A BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` on the way swallows it; the command saves what it has and
    exits with 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.why = "the terminal was closed" if signum == getattr(signal, "SIGHUP", None) else "asked to stop"


#: the signal that is ending the command (empty while none is)
_ending: list[int] = []


def end_now(signum: int) -> None:
    """Raise :class:`Terminated` for ``signum``, and ignore the signals that may follow it."""
    _ending.append(signum)
    raise Terminated(signum)


def readline(stdin: TextIO) -> str:
    """``stdin.readline()``; a terminal that cannot be read any more (EIO: it was closed) ends the command as its
    SIGHUP would, which may arrive a moment later."""
    try:
        return stdin.readline()
    except OSError:
        if _ending:
            raise Terminated(_ending[0]) from None
        end_now(getattr(signal, "SIGHUP", 1))


@contextmanager
def stop_on_hangup() -> Iterator[None]:
    """Within the block, SIGHUP and SIGTERM raise :class:`Terminated` (where the line is waiting for input, or
    between two steps), so ``finally`` blocks save before the process ends; a second signal is then ignored.
    Outside the main thread it does nothing. The previous handlers come back afterwards."""
    names = [n for n in ("SIGHUP", "SIGTERM") if hasattr(signal, n)]

    _ending.clear()

    def handler(signum, frame):
        # once only: a closed terminal sends SIGHUP to the foreground group and to the session leader, often the
        # same process, and reading from it fails first (see readline); a second raise would cut short the
        # saving that the first one started
        if not _ending:
            end_now(signum)

    previous = {}
    try:
        for n in names:
            previous[n] = signal.signal(getattr(signal, n), handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for n, old in previous.items():
            signal.signal(getattr(signal, n), old)


def say_safely(text: str, stream: TextIO | None = None) -> None:
    """Print a line that may have nowhere to go (after SIGHUP the terminal is gone): errors are ignored."""
    try:
        print(text, file=stream or sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
