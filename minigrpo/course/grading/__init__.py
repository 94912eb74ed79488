"""Exercise grading: in-notebook checks (``check``) and the grader behind ``minigrpo grade``.

    from minigrpo.course.grading import check
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
from collections.abc import Callable

from minigrpo.course.grading.core import (
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


def _discover() -> dict[str, tuple[str, list[Item]]]:
    """Every module ``exNN`` of this package is exercise NN: it defines ``TITLE`` and ``ITEMS``."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        match = re.fullmatch(r"ex(\d\d)", module.name)
        if match:
            mod = importlib.import_module(f"{__name__}.{module.name}")
            found[match.group(1)] = (mod.TITLE, mod.ITEMS)
    return dict(sorted(found.items()))


#: Every graded exercise: its number, title and items, in course order.
EXERCISES: dict[str, tuple[str, list[Item]]] = _discover()


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
