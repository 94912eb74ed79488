"""Repository consistency: dependencies, the README's commands and CI, notebook hygiene."""

import json
import re
import tomllib
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises") for p in (ROOT / d).glob("*.ipynb"))
# pip name -> conda-forge name where they differ
CONDA_NAMES = {"torch": "pytorch", "box2d": "box2d-py"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def _spec(requirement: str) -> str:
    return requirement.strip()[len(_name(requirement)):].strip()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_deps = {CONDA_NAMES.get(_name(d), _name(d)): _spec(d) for d in project["dependencies"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    conda = {}
    for line in lines[lines.index("dependencies:") + 1:]:
        m = re.match(r"^  - ([A-Za-z0-9_.\-]+)(.*)$", line)
        if m and m.group(1) not in ("python", "pip"):
            conda[m.group(1).lower()] = m.group(2).strip()
    assert conda == pip_deps
    assert "conda-forge" in "\n".join(lines) and "- -e ." in "\n".join(lines)


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    test_cmd = next(line.split("#")[0].strip() for b in blocks for line in b.splitlines() if "runs every test" in line)
    ci_lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert ci_lines[-1] == test_cmd == "make test"
    assert any("torch==2.13.0" in line for line in ci_lines), "CI must pin the local CPU torch before installing"


def test_makefile_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("lab", "test", "run", "grade", "exercises"):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target


def test_every_lesson_is_in_the_readme_syllabus():
    readme = (ROOT / "README.md").read_text()
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        assert f"notebooks/{nb.name}" in readme, nb.name
    for nb in (ROOT / "exercises").glob("*.ipynb"):
        assert f"exercises/{nb.name}" in readme, nb.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_hygiene(path):
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    assert '"output_type": "error"' not in text, "a saved output is an error traceback"
    for marker in ("/tmp/", "/root/", "/home/", "/work/", "site-packages"):
        assert marker not in text, f"an output or cell names a machine path ({marker})"
    assert json.loads(text)["nbformat"] == 4


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_lessons_end_with_an_interview_corner(path):
    nb = nbformat.read(path, as_version=4)
    assert any("interview corner" in c.source.lower() for c in nb.cells if c.cell_type == "markdown")
