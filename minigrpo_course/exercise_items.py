"""Every graded item of every exercise, read from the graders' source without importing them.

``minigrpo list`` shows them; importing the graders (torch, gymnasium, transformers) would take seconds, so the
``Item(exercise=..., number=..., function=..., title=...)`` calls of ``minigrpo_course/grading/exNN.py`` are read
with :mod:`ast`. ``tests/test_grading.py`` checks that this list equals the graders' registry
(``minigrpo_course.grading.EXERCISES``), so the two cannot drift apart. Standard library only.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

GRADERS = Path(__file__).resolve().parent / "grading"


@dataclass(frozen=True)
class ItemInfo:
    id: str  #: "01.1"
    function: str  #: what the learner writes
    title: str


def _constant(node: ast.AST):
    return node.value if isinstance(node, ast.Constant) else None


def _read(path: Path) -> tuple[str, list[ItemInfo]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    title, found = "", []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TITLE" for t in node.targets):
            title = _constant(node.value) or title
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Item":
            kw = {k.arg: _constant(k.value) for k in node.keywords}
            if all(kw.get(k) is not None for k in ("exercise", "number", "function", "title")):
                found.append((kw["number"], ItemInfo(f"{kw['exercise']}.{kw['number']}", kw["function"], kw["title"])))
    return title, [info for _, info in sorted(found, key=lambda pair: pair[0])]


def exercise_items() -> dict[str, tuple[str, list[ItemInfo]]]:
    """``{"01": ("REINFORCE", [ItemInfo("01.1", "reward_to_go", "..."), ...]), ...}`` in course order."""
    out = {}
    for path in sorted(GRADERS.glob("ex[0-9][0-9].py")):
        number = re.fullmatch(r"ex(\d\d)\.py", path.name).group(1)
        out[number] = _read(path)
    return out
