"""The text interface the practice modes share (``practice``, ``mock``, ``drills``, ``flaws``, ``coding``):
paragraphs wrapped to :data:`WIDTH`, an answer read up to an empty line, a question's checklist and the items a
learner says they covered, a clock. It imports none of the modes (only the bank's ``Question``), so each of them
imports it without going round in a circle.
"""

from __future__ import annotations

import re
import textwrap
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
