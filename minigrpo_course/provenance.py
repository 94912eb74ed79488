"""Which package code a committed notebook's outputs were made with, so that stale outputs are caught.

A lesson's outputs are evidence: the prose quotes them. If the package code behind them changes, the
outputs may no longer be what the code does (a lesson once kept printing ``7.4e-05`` for a value the
package had since made exactly zero). So ``minigrpo run`` records, in the notebook's metadata, a
fingerprint of every module of ``minigrpo`` and ``minigrpo_course`` (:data:`PACKAGES`) the notebook's code
imports, directly or through other such modules, and :func:`stale_modules` names those whose code has changed
since.

The fingerprint hashes the module's syntax tree with docstrings removed: editing a comment, a docstring
or the layout keeps the outputs valid; changing any statement, default or constant does not. ``minigrpo run``
fingerprints every module of both packages before the first cell runs, asks the kernel at the end which of them
it imported (:data:`PROBE`, a cell run last and removed again) and records those. That over-approximates what
the outputs depend on (a module imported is not every line of it run): a stale verdict may name a change that
moved no output, never the other way round. A record can also be taken without running (:func:`describe`):
then the imports are read statically, through every ``import`` statement, including those inside functions.

The record lives at ``notebook.metadata["minigrpo"]``: ``{"mode": "full" | "smoke", "code": {module: hash}}``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

#: the packages whose code is fingerprinted: the library and the course built on it
PACKAGES = ("minigrpo", "minigrpo_course")
#: the folder holding both packages' source folders: the checkout, or site-packages (a record can be compared
#: against another tree with ``root=``)
ROOT = Path(__file__).resolve().parents[1]
METADATA_KEY = "minigrpo"


def module_path(name: str, root: Path = ROOT) -> Path | None:
    """The source file of module ``name`` (``minigrpo.x.y``, ``minigrpo_course.x``) under ``root``, or None if it
    is not one."""
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return None
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parents(name: str) -> list[str]:
    """``minigrpo.a.b`` -> ``["minigrpo", "minigrpo.a"]``: the packages whose ``__init__`` an import runs."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(tree: ast.AST, package: str | None, root: Path) -> set[str]:
    """The modules of :data:`PACKAGES` an import statement in ``tree`` names (``package``: for relative imports)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package is None:
                    continue
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            # `from minigrpo.llm import grpo` imports the submodule minigrpo.llm.grpo
            found.update(f"{base}.{alias.name}" for alias in node.names
                         if module_path(f"{base}.{alias.name}", root) is not None)
    return {name for name in found if module_path(name, root) is not None}


def code_imports(sources: Iterable[str]) -> set[str]:
    """The modules of :data:`PACKAGES` imported by code cells ``sources`` (IPython magics and shell lines skipped)."""
    found: set[str] = set()
    for source in sources:
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            continue
        found |= _imports(tree, None, ROOT)
    return found


def closure(names: Iterable[str], root: Path = ROOT) -> set[str]:
    """``names`` with every module of :data:`PACKAGES` they import, transitively, and the packages they sit in."""
    todo = list(names)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or module_path(name, root) is None:
            continue
        seen.add(name)
        todo.extend(_module_imports(name, root))
        todo.extend(_parents(name))
    return seen


def _module_imports(name: str, root: Path) -> frozenset[str]:
    path = module_path(name, root)
    return _file_imports(path, path.stat().st_mtime_ns, name, root)


@functools.lru_cache(maxsize=None)
def _file_imports(path: Path, mtime_ns: int, name: str, root: Path) -> frozenset[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return frozenset(_imports(ast.parse(path.read_text()), package, root))


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def fingerprint_source(source: str) -> str:
    """A short hash of ``source``'s code: the syntax tree without docstrings (comments never reach it)."""
    dump = ast.dump(_strip_docstrings(ast.parse(source)), include_attributes=False)
    return hashlib.sha256(dump.encode()).hexdigest()[:16]


def fingerprints(modules: Iterable[str], root: Path = ROOT) -> dict[str, str]:
    """``{module: fingerprint}`` for ``modules``, sorted by name."""
    return {name: _file_fingerprint(module_path(name, root), module_path(name, root).stat().st_mtime_ns)
            for name in sorted(modules)}


@functools.lru_cache(maxsize=None)
def _file_fingerprint(path: Path, mtime_ns: int) -> str:
    return fingerprint_source(path.read_text())


def notebook_code(nb) -> list[str]:
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def describe(nb, mode: str, root: Path = ROOT) -> dict:
    """What ``nb``'s outputs are made with if it runs now: ``{"mode": mode, "code": {module: fingerprint}}``.
    ``minigrpo run`` takes it before the first cell runs (an edit during a long run is not claimed)."""
    return {"mode": mode, "code": fingerprints(closure(code_imports(notebook_code(nb)), root), root)}


#: the cell ``minigrpo run`` appends (and removes) to learn which modules of both packages the kernel imported
PROBE = ("import json as _json, sys as _sys\n"
         f"print(_json.dumps(sorted(m for m in _sys.modules if m.partition('.')[0] in {PACKAGES!r})))")


def package_fingerprints(root: Path = ROOT) -> dict[str, str]:
    """``{module: fingerprint}`` for every module of both packages under ``root``."""
    names = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            names.append(".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts))
    return fingerprints(names, root)


def loaded_modules(probe_cell) -> list[str]:
    """The module names the :data:`PROBE` cell printed (its stdout), or a ``ValueError``."""
    import json

    text = "".join(o.get("text", "") for o in probe_cell.get("outputs", []) if o.get("name") == "stdout")
    try:
        return list(json.loads(text.strip().splitlines()[-1]))
    except (ValueError, IndexError) as exc:
        raise ValueError(f"the provenance probe printed no module list: {text[:200]!r}") from exc


def record(nb, mode: str, root: Path = ROOT, entry: dict | None = None) -> dict:
    """Write ``entry`` (default: :func:`describe` now) into ``nb.metadata``; returns it."""
    entry = describe(nb, mode, root) if entry is None else entry
    nb.metadata[METADATA_KEY] = entry
    return entry


def stale_modules(nb, root: Path = ROOT) -> list[str]:
    """The modules whose code differs from what ``nb``'s outputs were made with (changed or removed since), and
    the modules the notebook's cells import directly that the record does not list (a cell added since). Raises
    ``ValueError`` when the notebook carries no record."""
    entry = nb.metadata.get(METADATA_KEY)
    if not isinstance(entry, Mapping) or "code" not in entry:
        raise ValueError("the notebook has no metadata['minigrpo']['code'] record: run it with `minigrpo run`")
    recorded = dict(entry["code"])
    now = {name: fp for name, fp in fingerprints((n for n in recorded if module_path(n, root)), root).items()}
    unrecorded = code_imports(notebook_code(nb)) - recorded.keys()
    return sorted({name for name in recorded if recorded[name] != now.get(name)} | unrecorded)
