"""Stale notebook outputs are caught: minigrpo_course.provenance's fingerprints and import closure."""

import json
import shutil
import subprocess
import sys
import textwrap

import nbformat
import pytest

from minigrpo_course import provenance


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
    # the course package is followed too, and through it into the library
    course = provenance.closure(provenance.code_imports(["from minigrpo_course.experiments.trpo import delta_sweep"]))
    assert {"minigrpo_course", "minigrpo_course.experiments", "minigrpo_course.experiments.trpo",
            "minigrpo.control.trpo"} <= course


def _copy_packages(tmp_path):
    """Both packages' source folders under ``tmp_path``, the ``root=`` a record can be compared against."""
    for package in provenance.PACKAGES:
        shutil.copytree(provenance.ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_a_planted_stale_cell_is_caught(tmp_path):
    """The issue's case: a notebook run with one version of the package, then the package's code changes."""
    root = _copy_packages(tmp_path)
    nb = _notebook("from minigrpo.advantages import group_advantages\nprint(group_advantages)")
    entry = provenance.record(nb, "full", root=root)
    assert entry["mode"] == "full" and "minigrpo.advantages" in entry["code"]
    assert provenance.stale_modules(nb, root=root) == []

    path = root / "minigrpo" / "advantages.py"
    text = path.read_text()
    path.write_text(text.replace('"""', '"""Edited docstring. ', 1) + "\n# a comment\n")
    assert provenance.stale_modules(nb, root=root) == []            # prose-only edits keep outputs valid
    path.write_text(text + "\nEPS = 1e-4\n")
    assert provenance.stale_modules(nb, root=root) == ["minigrpo.advantages"]

    path.write_text(text)
    nb.cells.append(nbformat.v4.new_code_cell("from minigrpo import losses"))   # a cell added since the run
    assert "minigrpo.losses" in provenance.stale_modules(nb, root=root)


def test_a_change_to_the_course_package_is_caught(tmp_path):
    """A notebook's experiment helpers live in minigrpo_course: their code is fingerprinted like the library's."""
    root = _copy_packages(tmp_path)
    nb = _notebook("from minigrpo_course.experiments.trpo import delta_sweep")
    entry = provenance.record(nb, "full", root=root)
    assert {"minigrpo_course.experiments.trpo", "minigrpo.control.trpo"} <= entry["code"].keys()
    assert provenance.stale_modules(nb, root=root) == []
    path = root / "minigrpo_course" / "experiments" / "trpo.py"
    path.write_text(path.read_text() + "\nSEEDS = 3\n")
    assert provenance.stale_modules(nb, root=root) == ["minigrpo_course.experiments.trpo"]
    # ... and so is the library code under it
    (root / "minigrpo" / "control" / "trpo.py").write_text((root / "minigrpo" / "control" / "trpo.py").read_text() + "\nX = 1\n")
    assert provenance.stale_modules(nb, root=root) == ["minigrpo.control.trpo", "minigrpo_course.experiments.trpo"]


def test_every_module_of_both_packages_is_fingerprinted_and_probed():
    names = provenance.package_fingerprints()
    assert {"minigrpo", "minigrpo.losses", "minigrpo.infra.checks", "minigrpo_course",
            "minigrpo_course.grading.core", "minigrpo_course.experiments.trpo"} <= names.keys()
    assert all(name.partition(".")[0] in provenance.PACKAGES for name in names)
    # the probe, run in a fresh interpreter, names the modules of both packages that were imported
    code = "import minigrpo.smoke, minigrpo_course.progress, json\n" + provenance.PROBE
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # progress keeps its file through state (locked writes), which writes with the library's atomic helpers: those
    # imports are named too
    assert json.loads(proc.stdout.splitlines()[-1]) == ["minigrpo", "minigrpo.infra", "minigrpo.infra.atomic",
                                                        "minigrpo.smoke", "minigrpo_course", "minigrpo_course.progress",
                                                        "minigrpo_course.state"]


def test_a_notebook_without_a_record_is_an_error():
    with pytest.raises(ValueError, match="minigrpo run"):
        provenance.stale_modules(_notebook("import minigrpo"))
