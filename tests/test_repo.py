"""Repository consistency: dependencies, the README's commands and CI, notebook hygiene."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest

from minigrpo_course.colab import content_cells
from minigrpo_course.grading.notebooks import committed_text, has_learner_work

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises") for p in (ROOT / d).glob("*.ipynb"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# pip name (with its extra, if any) -> conda-forge name where they differ
CONDA_NAMES = {"torch": "pytorch", "gymnasium[box2d]": "gymnasium-box2d"}
# Needed by the course (notebooks, grading, tests), not by the library: the `course` extra.
COURSE_ONLY = {"matplotlib", "pillow", "jupyterlab", "ipykernel", "ipywidgets", "nbformat", "nbclient", "nbval", "pytest",
               "pytest-xdist", "tensorboard", "trl"}
# Library modules allowed to import a course-only package inside a function (with a clear ImportError without it).
OPTIONAL_IMPORTS = {"llm/trl_bridge.py": {"trl"}}
# import name -> distribution name where they differ
DIST_NAMES = {"sklearn": "scikit-learn", "stable_baselines3": "stable-baselines3", "IPython": "ipython", "yaml": "pyyaml", "PIL": "pillow"}
# Installed by the course extra's Jupyter packages themselves (ipykernel, nbclient, jupyterlab).
WITH_JUPYTER = {"ipython", "jupyter_client", "jupyter_core", "traitlets"}
# The library is minigrpo/; the course tooling (grading, interview practice, progress, the lessons' experiment
# plumbing, which draws their figures, lesson 07's planted bugs) is minigrpo_course/ and may use the course extra.
LIBRARY = ROOT / "minigrpo"
COURSE_TOOLING = ROOT / "minigrpo_course"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def _name_with_extra(requirement: str) -> str:
    return re.split(r"[<>=!~ ;]", requirement.strip(), maxsplit=1)[0].lower()


def _spec(requirement: str) -> str:
    return requirement.strip()[len(_name_with_extra(requirement)):].strip()


def _environment_yml() -> dict[str, str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    conda = {}
    for line in lines[lines.index("dependencies:") + 1:]:
        m = re.match(r"^  - ([A-Za-z0-9_.\-]+)(.*)$", line)
        if m and m.group(1) != "pip":
            conda[m.group(1).lower()] = m.group(2).strip()
    return conda


def _third_party_imports(path: Path) -> set[str]:
    """Top-level names of every absolute import in a file, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    local = {"minigrpo", "minigrpo_course", "__future__", "conftest"} | {f.stem for d in ("tests", "benchmarks") for f in (ROOT / d).glob("*.py")}
    return {n for n in names if n not in sys.stdlib_module_names and n not in local}


def _declared(*groups: str) -> set[str]:
    deps = list(PROJECT["dependencies"])
    for group in groups:
        deps += PROJECT["optional-dependencies"][group]
    return {_name(d) for d in deps}


def test_environment_yml_matches_pyproject():
    # conda users get the course: the library's dependencies plus the `course` extra, same floors.
    wanted = PROJECT["dependencies"] + PROJECT["optional-dependencies"]["course"]
    pip_deps = {CONDA_NAMES.get(_name_with_extra(d), _name_with_extra(d)): _spec(d) for d in wanted}
    conda = _environment_yml()
    python = conda.pop("python")
    assert conda == pip_deps
    assert python == PROJECT["requires-python"], "environment.yml and pyproject.toml ask for different Pythons"
    text = (ROOT / "environment.yml").read_text()
    assert "conda-forge" in text and "- -e ." in text


def test_python_floor_is_consistent():
    # tests/ and the tooling use tomllib (3.11+); the README states the same floor.
    assert PROJECT["requires-python"] == ">=3.11"
    assert "Python ≥ 3.11" in (ROOT / "README.md").read_text()


def test_license_and_build_backend():
    # an SPDX string, not the deprecated {text = ...} table; setuptools reads it from 77 on
    assert PROJECT["license"] == "MIT"
    assert PYPROJECT["build-system"]["requires"] == ["setuptools>=77"]


def test_library_needs_no_course_packages():
    # `pip install minigrpo` (no extra) must be enough for every library module, imports inside
    # functions included; Jupyter, plotting and test tools belong to the `course` extra only.
    library = list(LIBRARY.rglob("*.py"))
    assert len(library) > 20
    core = _declared()
    assert not core & COURSE_ONLY, f"course-only packages among the core dependencies: {core & COURSE_ONLY}"
    assert set(_name(d) for d in PROJECT["optional-dependencies"]["course"]) == COURSE_ONLY
    for path in library:
        allowed = core | OPTIONAL_IMPORTS.get(path.relative_to(LIBRARY).as_posix(), set())
        for name in _third_party_imports(path):
            dist = DIST_NAMES.get(name, name).lower()
            assert dist in allowed, f"{path.relative_to(ROOT)} imports {name}, which is not a core dependency"


def test_course_tooling_and_benchmarks_imports_are_declared():
    tooling = list(COURSE_TOOLING.rglob("*.py"))
    assert len(tooling) > 20
    course = _declared("course") | WITH_JUPYTER
    for path in tooling:
        for name in _third_party_imports(path):
            assert DIST_NAMES.get(name, name).lower() in course, f"{path.relative_to(ROOT)} imports {name}"
    everything = _declared("course", "bench")
    for path in (ROOT / "benchmarks").glob("*.py"):
        for name in _third_party_imports(path):
            assert DIST_NAMES.get(name, name).lower() in everything, f"{path.relative_to(ROOT)} imports {name}"


def test_package_data_ships_in_the_wheel():
    # A non-editable install carries only .py files and what [tool.setuptools.package-data] lists.
    package_data = PYPROJECT["tool"]["setuptools"]["package-data"]
    data = [f for package in (LIBRARY, COURSE_TOOLING) for f in package.rglob("*")
            if f.is_file() and f.suffix not in (".py", ".pyc") and "__pycache__" not in f.parts]
    assert data, "expected the interview question files"
    for f in data:
        rel = f.relative_to(ROOT)
        assert any(rel.relative_to(Path(*pkg.split("."))).match(glob)
                   for pkg, globs in package_data.items() if rel.is_relative_to(Path(*pkg.split(".")))
                   for glob in globs), f"{rel} is not in [tool.setuptools.package-data]"


def test_make_installs_the_course_extra():
    makefile = (ROOT / "Makefile").read_text()
    extras = set(re.findall(r'pip install -e "\.\[([a-z,]+)\]"', makefile))
    # `make site` adds the website's own extra on top of the course
    assert extras == {"course", "site"} and {"course", "site"} <= set(PROJECT["optional-dependencies"])


def _make_dry_run(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TORCH_INDEX", "VENV", "PYTHON", "JUPYTER_ARGS")}
    env["PORT"] = env["ARGS"] = "ignored-from-the-environment"
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _recipe_line(output: str, command: str) -> str:
    lines = [line for line in output.replace("\\\n", " ").splitlines() if command in line]
    assert len(lines) == 1, output
    return " ".join(lines[0].split())


def test_make_lab_roots_jupyter_at_the_repository():
    out = _make_dry_run("lab", "PORT=8899", "JUPYTER_ARGS=--no-browser --ip=0.0.0.0")
    assert out.returncode == 0, out.stderr
    line = _recipe_line(out.stdout, "jupyter lab")
    bin_dir = ROOT / ".venv" / "bin"
    assert line.startswith(f'PATH="{bin_dir}:$PATH"'), "terminals and ! commands must find .venv's minigrpo"
    assert f'--ServerApp.root_dir="{ROOT}"' in line, "exercises/ must be reachable from the file browser"
    assert "--LabApp.default_url=/lab/tree/notebooks" in line
    # a login shell (Jupyter's choice when its output is not a terminal) may reset PATH in /etc/profile
    assert '"--ServerApp.terminado_settings=shell_command=${SHELL:-' in line
    assert line.endswith("--no-browser --ip=0.0.0.0") and "--port=8899" in line
    assert ("--allow-root" in line) == (os.getuid() == 0)


def test_make_run_and_grade_pass_their_options():
    out = _make_dry_run("run", "LESSON=01", "SMOKE=1", "ARGS=--in-place")
    assert out.returncode == 0, out.stderr
    assert _recipe_line(out.stdout, "minigrpo run").endswith("/.venv/bin/minigrpo run 01 --smoke --in-place")
    out = _make_dry_run("run", "LESSON=04")
    assert _recipe_line(out.stdout, "minigrpo run").endswith("/.venv/bin/minigrpo run 04")
    out = _make_dry_run("run")
    assert out.returncode != 0 and "make run needs a lesson number, e.g. make run LESSON=01" in out.stderr
    out = _make_dry_run("grade", "EX=03", "ARGS=-v")
    assert _recipe_line(out.stdout, "minigrpo grade").endswith("/.venv/bin/minigrpo grade 03 -v")


def test_make_test_runs_files_in_parallel_workers():
    out = _make_dry_run("test", "ARGS=-k repo")
    assert out.returncode == 0, out.stderr
    line = _recipe_line(out.stdout, "pytest")
    jobs = int(re.search(r"-n (\d+)", line).group(1))
    assert 1 <= jobs <= 4 and "--dist loadfile" in line and line.endswith("-k repo")
    out = _make_dry_run("test", "JOBS=0")
    assert "-n 0 --dist loadfile" in _recipe_line(out.stdout, "pytest")


def test_make_torch_reinstalls_from_the_index():
    index = "https://download.pytorch.org/whl/cpu"
    out = _make_dry_run("torch", f"TORCH_INDEX={index}")
    assert out.returncode == 0, out.stderr
    assert "pip uninstall -y -q torch" in out.stdout
    assert _recipe_line(out.stdout, "pip install torch").endswith(f"pip install torch --index-url {index}")
    assert f"printf '%s\\n' \"{index}\" > .venv/.minigrpo-torch-index" in out.stdout


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    test_cmd = next(line.split("#")[0].strip() for b in blocks for line in b.splitlines() if "runs every test" in line)
    ci_lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert ci_lines[-1] == test_cmd == "make test"
    assert any("torch==2.13.0" in line for line in ci_lines), "CI must pin the local CPU torch before installing"


def test_makefile_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("lab", "test", "run", "grade", "exercises", "torch", "site"):
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
    if path.parent.name == "exercises" and has_learner_work(path):
        # a learner's saved work (failing checks, their paths) is theirs: the committed stub is what is checked
        text = committed_text(path, ROOT) or pytest.skip(f"{path.name} holds a learner's work, outside git")
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    assert '"output_type": "error"' not in text, "a saved output is an error traceback"
    for marker in ("/tmp/", "/root/", "/home/", "/work/", "site-packages"):
        assert marker not in text, f"an output or cell names a machine path ({marker})"
    assert json.loads(text)["nbformat"] == 4


def test_lessons_link_to_their_exercise():
    # The README's syllabus says which exercise goes with which lesson; each such lesson links to it
    # near the top and says how to grade it.
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d\d) \| \[[^]]*\]\(notebooks/([^)]+)\) \|(.*)$", readme, flags=re.M)
    assert len(rows) == len(list((ROOT / "notebooks").glob("*.ipynb")))
    linked = 0
    for number, lesson, rest in rows:
        exercise = re.search(r"\]\(exercises/(\d\d)_[^)]+\.ipynb\)", rest) or re.search(r"\| see (\d\d) \|", rest)
        if exercise is None:
            continue
        target = next((ROOT / "exercises").glob(f"{exercise.group(1)}_*.ipynb")).name
        nb = nbformat.read(ROOT / "notebooks" / lesson, as_version=4)
        top = [c.source for c in content_cells(nb)[:3] if c.cell_type == "markdown"]   # the Colab cells aside
        link = f"[exercises/{target}](../exercises/{target})"
        assert any(link in s and f"minigrpo grade {exercise.group(1)}" in s for s in top), f"{lesson} -> {target}"
        linked += 1
    assert linked >= 10


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_lessons_end_with_an_interview_corner(path):
    nb = nbformat.read(path, as_version=4)
    assert any("interview corner" in c.source.lower() for c in nb.cells if c.cell_type == "markdown")


def test_algorithms_do_not_import_the_course_tooling():
    # the library stands alone: grading and interview practice build on it, never the reverse. Docstrings may name
    # the course package (where a lesson's study lives); code may not (tests/test_import_graph.py reads the imports)
    for path in LIBRARY.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                    and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
                node.body = node.body[1:]
        code = ast.unparse(tree)
        assert "minigrpo_course" not in code and "minigrpo.course" not in code, (
            f"{path.relative_to(ROOT)} imports the course tooling")


LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_a_lesson_is_a_core_path_with_a_what_to_remember_box(path):
    """Issue 26: at most 3,000 words of markdown per lesson (studies live in deep dives), and a box that closes it."""
    nb = nbformat.read(path, as_version=4)
    markdown = [c.source for c in nb.cells if c.cell_type == "markdown"]
    words = len(re.findall(r"\S+", "\n".join(markdown)))
    assert words <= 3000, f"{path.name} has {words} words of markdown: move a study into a deep dive"
    boxes = [s for s in markdown if s.startswith("## What to remember")]
    assert len(boxes) == 1 and 4 <= boxes[0].count("\n- ") <= 7, f"{path.name}: one '## What to remember' box of 4-7"


def test_committed_notebook_outputs_stay_lean():
    """Issue 26: the lessons' and deep dives' committed outputs together under 5 MB (figures at 72 dpi as palette
    PNGs: `minigrpo run` writes them so; `python -m minigrpo_course.figures` re-encodes committed ones)."""
    paths = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "deep_dives").glob("*.ipynb"))
    total = sum(len(json.dumps(c.get("outputs", []))) for p in paths
                for c in json.loads(p.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code")
    assert total < 5_000_000, f"committed outputs are {total / 1e6:.1f} MB"
