"""\"Spot the flaw\" cards: wrong or dated claims from the interview question sets, and their corrections.

The cards are ``minigrpo_course/interview/questions/flaws.md``. ``minigrpo interview --flaws`` shows each
claim, asks what is wrong with it, then shows the correction and the bank question that explains it.
"""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass
from importlib import resources
from typing import TextIO

from minigrpo_course.interview.bank import (_CODE_SPAN, BankFormatError, _blocks, _fields, _front_matter, _seeds,
                                            _split_headings, get)
from minigrpo_course.interview.seeds import seed_label

FLAWS_FILE = "questions/flaws.md"


@dataclass(frozen=True)
class Flaw:
    id: str
    seeds: tuple[str, ...]  #: where the claim was made
    see: str  #: the bank question that explains the correct view
    claim: str
    correction: str

    @property
    def source(self) -> str:
        return "; ".join(seed_label(s) for s in self.seeds)


def parse_flaws(text: str, name: str = "flaws.md") -> tuple[Flaw, ...]:
    try:
        _, body = _front_matter(text)
        _, parts = _split_headings(body, "## ")
        cards = []
        for fid, lines in parts:
            head, sections = _split_headings(lines, "### ")
            fields = _fields([line.replace("- **from:**", "- **seeds:**") for line in head])
            found = {k: _blocks(v) for k, v in sections}
            if set(found) != {"Claim", "Correction"} or not all(found.values()):
                raise ValueError(f"card '{fid}': expected the sections '### Claim' and '### Correction'")
            see = _CODE_SPAN.search(fields.get("see", ""))
            if "seeds" not in fields or not see:
                raise ValueError(f"card '{fid}': needs '- **from:** … (`SSS.part`)' and '- **see:** `bank-id`'")
            cards.append(Flaw(fid, _seeds(fields["seeds"]), get(see.group(2)).id, found["Claim"], found["Correction"]))
        if not cards:
            raise ValueError("no cards ('## id' headings)")
        return tuple(cards)
    except ValueError as exc:
        raise BankFormatError(f"{name}: {exc}") from None


def load_flaws() -> tuple[Flaw, ...]:
    f = resources.files("minigrpo_course.interview").joinpath(FLAWS_FILE)
    return parse_flaws(f.read_text(encoding="utf-8"), FLAWS_FILE)


def run_flaws(stdin: TextIO, stdout: TextIO, count: int | None = None, seed: int | None = None) -> tuple[int, int]:
    """Show the cards (all, or ``count`` random ones); returns (spotted, shown). 'q' stops."""
    from minigrpo_course.interview.terminal import WIDTH, _read_answer, _wrap, readline

    cards = list(load_flaws())
    if count is not None:
        cards = random.Random(seed).sample(cards, min(count, len(cards)))
    spotted = shown = 0

    def say(text: str = "") -> None:
        print(text, file=stdout, flush=True)

    for i, card in enumerate(cards, 1):
        say("=" * WIDTH + f"\nSpot the flaw {i} of {len(cards)} (claimed in {card.source})\n\n"
            + _wrap(card.claim) + "\n")
        say("What is wrong with it?")
        answer = _read_answer(stdin, stdout)
        if answer is None:
            break
        say("\nCorrection:\n" + _wrap(card.correction) + f"\n\n  more: minigrpo interview --show {card.see}\n")
        while True:
            print("Did you spot it? (y/n; q to stop): ", end="", file=stdout, flush=True)
            line = readline(stdin)
            reply = line.strip().lower()
            if not line or reply in ("q", "quit"):
                say(f"\n{spotted} of {shown} flaws spotted")
                return spotted, shown
            if reply in ("y", "yes", "n", "no"):
                break
            say("type y or n")
        shown += 1
        spotted += reply.startswith("y")
    say(textwrap.fill(f"{spotted} of {shown} flaws spotted.", WIDTH))
    return spotted, shown
