"""Stale notebook outputs are caught: minigrpo.course.provenance's fingerprints and import closure."""

import shutil
import textwrap

import nbformat
import pytest

from minigrpo.course import provenance


def test_fingerprint_ignores_docstrings_comments_and_layout_but_not_code():
    source = textwrap.dedent('''
        """Module docstring."""
        def f(x, eps=1e-4):
            """What f does."""
            return x / (1 + eps)  # a comment
    ''')
    same = textwrap.dedent('''
        """Another docstring, longer."""

        def f(x,  eps=1e-4):
            # a new comment
            return x / (1 + eps)
    ''')
    base = provenance.fingerprint_source(source)
    assert provenance.fingerprint_source(same) == base
    assert provenance.fingerprint_source(source.replace("1e-4", "0.0")) != base   # a default
    assert provenance.fingerprint_source(source.replace("1 + eps", "eps + 1")) != base   # a statement


def _notebook(*sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a lesson")] + [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


def test_closure_follows_imports_through_modules_packages_and_relative_imports():
    imported = provenance.code_imports(["%matplotlib inline\nfrom minigrpo.llm import grpo\nimport numpy as np",
                                        "def f():\n    from minigrpo.diffusion.flow import FlowProcess"])
    assert imported == {"minigrpo.llm", "minigrpo.llm.grpo", "minigrpo.diffusion.flow"}
    modules = provenance.closure(imported)
    # llm/grpo.py imports minigrpo.losses; diffusion/flow.py imports .ddpm (relative); packages' __init__ run too
    assert {"minigrpo", "minigrpo.llm", "minigrpo.losses", "minigrpo.diffusion", "minigrpo.diffusion.ddpm"} <= modules
    assert "minigrpo.control.ppo" not in modules
    assert all(name.startswith("minigrpo") for name in modules)


def test_a_planted_stale_cell_is_caught(tmp_path):
    """The issue's case: a notebook run with one version of the package, then the package's code changes."""
    root = tmp_path / "minigrpo"
    shutil.copytree(provenance.ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    nb = _notebook("from minigrpo.advantages import group_advantages\nprint(group_advantages)")
    entry = provenance.record(nb, "full", root=root)
    assert entry["mode"] == "full" and "minigrpo.advantages" in entry["code"]
    assert provenance.stale_modules(nb, root=root) == []

    path = root / "advantages.py"
    text = path.read_text()
    path.write_text(text.replace('"""', '"""Edited docstring. ', 1) + "\n# a comment\n")
    assert provenance.stale_modules(nb, root=root) == []            # prose-only edits keep outputs valid
    path.write_text(text + "\nEPS = 1e-4\n")
    assert provenance.stale_modules(nb, root=root) == ["minigrpo.advantages"]

    path.write_text(text)
    nb.cells.append(nbformat.v4.new_code_cell("from minigrpo import losses"))   # a cell added since the run
    assert "minigrpo.losses" in provenance.stale_modules(nb, root=root)


def test_a_notebook_without_a_record_is_an_error():
    with pytest.raises(ValueError, match="minigrpo run"):
        provenance.stale_modules(_notebook("import minigrpo"))
