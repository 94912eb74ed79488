"""Exercise grading: in-notebook checks (``check``) and the grader behind ``minigrpo grade``.

    from minigrpo_course.grading import check
    check("01.1", reward_to_go)      # prints ✓, or the failing input, expected, got and a hint

A failing check prints its verdict and then raises :class:`CheckFailed`, which Jupyter shows as one
line under the verdict instead of a traceback. The cell fails, so ``Run All`` stops there and
``pytest --nbval-lax`` fails the notebook whatever outputs it has saved: check cells are not marked
``# NBVAL_CHECK_OUTPUT``, and exercise notebooks ship with no outputs at all.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator, Mapping

from minigrpo_course.grading.core import (
                                          Call,
                                          Case,
                                          GradingTimeout,
                                          Item,
                                          ItemResult,
                                          Made,
                                          Raised,
                                          Spread,
                                          WrongAnswer,
                                          compare,
                                          grads,
                                          run_item,
                                          time_limit,
                                          )


class _Exercises(Mapping):
    """Every module ``exNN`` of this package is exercise NN: it defines ``TITLE`` and ``ITEMS``.

    The numbers are listed without importing anything; a module is imported the first time its exercise is
    looked up. So ``check("04.1", ...)`` in a solution notebook imports ``ex04`` alone, and the notebook's
    record of the code behind its outputs (:mod:`minigrpo_course.provenance`) does not go stale when another
    exercise's grader changes.
    """

    def __init__(self):
        self._numbers = sorted(m.group(1) for m in (re.fullmatch(r"ex(\d\d)", info.name)
                                                     for info in pkgutil.iter_modules(__path__)) if m)
        self._loaded: dict[str, tuple[str, list[Item]]] = {}

    def __getitem__(self, number: str) -> tuple[str, list[Item]]:
        if number not in self._numbers:
            raise KeyError(number)
        if number not in self._loaded:
            mod = importlib.import_module(f"{__name__}.ex{number}")
            self._loaded[number] = (mod.TITLE, mod.ITEMS)
        return self._loaded[number]

    def __iter__(self) -> Iterator[str]:
        return iter(self._numbers)

    def __len__(self) -> int:
        return len(self._numbers)


#: Every graded exercise: its number, title and items, in course order (each imported when first looked up).
EXERCISES: Mapping[str, tuple[str, list[Item]]] = _Exercises()


def items(exercise: str) -> list[Item]:
    if exercise not in EXERCISES:
        raise KeyError(f"no graded exercise {exercise!r}; graded exercises: {', '.join(EXERCISES)}")
    return EXERCISES[exercise][1]


def get_item(item_id: str) -> Item:
    """The item ``"NN.k"``."""
    exercise, _, number = item_id.partition(".")
    for item in items(exercise):
        if str(item.number) == number:
            return item
    raise KeyError(f"exercise {exercise} has no item {item_id!r}; items: {[i.id for i in items(exercise)]}")


class CheckFailed(Exception):
    """Raised by :func:`check` after it printed a failing verdict; the message is one line."""

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of formatting a traceback: the verdict printed above says
        # everything, a traceback into the grading code would only bury it.
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


def check(item_id: str, fn: Callable | None, quick: bool = True) -> None:
    """Run an item's quick checks on ``fn``; print the verdict (✓, or input/expected/got/hint), and
    raise :class:`CheckFailed` if any check failed."""
    result = run_item(get_item(item_id), fn, quick=quick)
    print(result.report(), flush=True)
    if result.passed:
        return
    head = f"{result.item.id} {result.item.function}"
    if result.not_implemented:
        raise CheckFailed(f"{head} is not implemented yet: write it, run its cell, then this one")
    failed = len(result.cases) - result.n_passed
    raise CheckFailed(f"{head} failed {failed} of {len(result.cases)} checks (first failure above): "
                      "fix it, run its cell, then this one")


__all__ = [
    "Call", "Case", "CheckFailed", "EXERCISES", "GradingTimeout", "Item", "ItemResult", "Made", "Raised", "Spread",
    "WrongAnswer", "check", "compare", "get_item", "items", "grads", "run_item", "time_limit",
]
