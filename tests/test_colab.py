"""Open in Colab: every notebook's badge and setup cell (``minigrpo colab``), and a lesson run from a bare folder.

Three parts:
- the checkout's notebooks carry the tool's cells, up to date, and each badge opens that very notebook at the release
  pyproject.toml names (these fail until ``python -m minigrpo_course colab`` has run on the checkout: run it, then
  ``make-exercises --check`` agrees);
- the tool itself, on copies: idempotent, touching no other cell, silent where the course is importable, installing
  the pinned course (and lesson 12's model) where it is not;
- a lesson from a bare folder: the package built into a wheel, installed into a fresh virtual environment that sees
  the course's third-party packages but not the checkout, and lesson 00 run there in smoke mode from a temporary
  folder holding only that notebook. ``MINIGRPO_COLAB_ALL=1`` runs every lesson and deep dive that way (minutes).
"""

import contextlib
import copy
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import nbformat
import pytest

from minigrpo import __version__
from minigrpo_course import colab, provenance
from minigrpo_course.cli import main as cli_main
from minigrpo_course.grading.notebooks import exercise_text

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REL = colab.release(ROOT)
NOTEBOOKS = colab.notebook_paths(ROOT)
LESSON_12 = "notebooks/12_grpo_pretrained_model.ipynb"


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _read(path: Path):
    return nbformat.read(path, as_version=4)


# ----------------------------------------------------------------------------- the checkout's notebooks

def test_every_notebook_has_its_colab_cells_up_to_date():
    # fails until the tool has run on the checkout: python -m minigrpo_course colab (then commit the notebooks)
    assert len(NOTEBOOKS) >= 40
    stale = [_rel(p) for p in NOTEBOOKS if len(set(colab.updated_text(p, ROOT, REL))) > 1]
    assert not stale, f"run `python -m minigrpo_course colab`: {len(stale)} notebooks lack up-to-date Colab cells, " \
                      f"e.g. {stale[:3]}"


def test_each_badge_opens_its_own_notebook_at_the_release():
    # fails, as the test above, until the tool has run on the checkout
    problems = []
    for path in NOTEBOOKS:
        nb = _read(path)
        target = colab.badge_target(nb)
        if target is None:
            problems.append(f"{_rel(path)}: no Colab badge")
            continue
        release, linked = target
        if linked != _rel(path) or release != REL:
            problems.append(f"{_rel(path)}: the badge opens {linked} at {release}")
        # right under the title, the setup cell next, nothing else of the tool's
        at = 1 if nb.cells[0].source.startswith("# ") else 0
        if [c.metadata.get(colab.MARKER) for c in nb.cells[at:at + 2]] != [colab.BADGE, colab.SETUP] \
                or sum(map(colab.is_colab_cell, nb.cells)) != 2:
            problems.append(f"{_rel(path)}: the badge and setup cell are not right under the title")
    assert REL.ref == f"v{PROJECT['version']}" == f"v{__version__}"
    assert not problems, f"run `python -m minigrpo_course colab`: {len(problems)} notebooks, e.g. {problems[:3]}"


# ----------------------------------------------------------------------------- the tool

def test_the_release_is_named_once_in_pyproject():
    assert REL.repository == PROJECT["urls"]["Repository"] == "https://github.com/minigrpo/minigrpo"
    tag = f"v{PROJECT['version']}"
    assert REL.colab_url("notebooks/00_rl_basics.ipynb") == (
        f"https://colab.research.google.com/github/minigrpo/minigrpo/blob/{tag}/notebooks/00_rl_basics.ipynb")
    assert REL.requirement("course") == f"minigrpo[course] @ git+https://github.com/minigrpo/minigrpo@{tag}"
    assert colab.release(ROOT, ref="0123abc").ref == "0123abc"


def test_the_colab_extra_is_the_course_without_jupyter():
    def names(reqs):
        return {r.split(">=")[0]: r for r in reqs}

    course, extra = names(PROJECT["optional-dependencies"]["course"]), names(PROJECT["optional-dependencies"]["colab"])
    assert extra and all(course.get(name) == req for name, req in extra.items()), "same floors as the course extra"
    assert not set(extra) & {"jupyterlab", "ipykernel", "ipywidgets", "nbclient", "nbval", "pytest"}


#: one notebook of each kind (the check on the checkout above covers every notebook once the tool has run)
SAMPLES = [ROOT / p for p in ("notebooks/00_rl_basics.ipynb", LESSON_12,
                              "notebooks/deep_dives/10c_kv_cache_designs.ipynb",
                              "solutions/04_ppo.ipynb", "exercises/04_ppo.ipynb")]


@pytest.mark.parametrize("path", SAMPLES, ids=_rel)
def test_the_tool_is_idempotent_and_touches_no_other_cell(path):
    original = _read(path)
    once = colab.apply(original, REL, _rel(path))
    assert nbformat.writes(colab.apply(once, REL, _rel(path))) == nbformat.writes(once)
    assert once.metadata == original.metadata
    assert json.dumps(colab.content_cells(once)) == json.dumps(colab.content_cells(original))
    assert colab.badge_target(once) == (REL, _rel(path))
    nbformat.validate(once)
    # a re-execution (minigrpo run records times and a count on the setup cell) needs no update
    rerun = copy.deepcopy(once)
    setup = next(c for c in rerun.cells if c.get("id") == colab.SETUP)
    setup.execution_count, setup.metadata["execution"] = 1, {"iopub.status.idle": "2026-11-28T10:00:00Z"}
    assert nbformat.writes(colab.apply(rerun, REL, _rel(path))) == nbformat.writes(rerun)


def test_generated_exercises_carry_cells_that_name_the_exercise(tmp_path):
    (tmp_path / "solutions").mkdir()
    for solution in sorted((ROOT / "solutions").glob("*.ipynb")):
        copy_ = tmp_path / "solutions" / solution.name
        nbformat.write(colab.apply(_read(solution), REL, _rel(solution)), copy_)
        exercise = nbformat.reads(exercise_text(copy_), as_version=4)
        assert colab.badge_target(exercise) == (REL, f"exercises/{solution.name}")
        # the tool run on exercises/ and the generator agree
        assert nbformat.writes(colab.apply(exercise, REL, f"exercises/{solution.name}")) == nbformat.writes(exercise)


def _setup_source(path: str) -> str:
    return colab.setup_source(REL, path, gpu=path == LESSON_12)


def test_the_setup_cell_says_where_the_notebook_runs():
    # the notebooks that pick their device (get_device: CUDA where there is one) say which; the others run on the CPU
    gpu = {p.name for p in NOTEBOOKS if colab.uses_gpu(_read(p))}
    assert {"06_grpo_llm.ipynb", "12_grpo_pretrained_model.ipynb", "13_grpo_text_to_image.ipynb"} <= gpu
    assert not {"00_rl_basics.ipynb", "04_ppo.ipynb", "08_ddpm.ipynb"} & gpu
    assert "torch.cuda.is_available()" in colab.setup_source(REL, LESSON_12, gpu=True)
    assert "torch" not in colab.setup_source(REL, "notebooks/00_rl_basics.ipynb", gpu=False)


def test_the_setup_cell_does_nothing_where_the_course_is_importable():
    for path in ("notebooks/00_rl_basics.ipynb", LESSON_12, "exercises/01_reinforce.ipynb"):
        source = _setup_source(path)
        assert provenance.code_imports([source]) == set(), "it must import no module of the course"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(source, path, "exec"), {})
        assert out.getvalue() == ""
        for marker in ("/tmp/", "/root/", "/home/", "/work/", "site-packages"):  # tests/test_repo.py's hygiene
            assert marker not in source


@pytest.mark.parametrize("on_colab", [False, True], ids=["bare-folder", "colab"])
def test_the_setup_cell_installs_the_pinned_course_elsewhere(monkeypatch, on_colab):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "minigrpo_course" else real_find_spec(name, *a))
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append(cmd[1:]) or subprocess.CompletedProcess(cmd, 0))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    extra = "colab" if on_colab else "course"
    fetch = ["-m", "minigrpo", "models", "fetch", "smollm2"]
    for path, needs in (("notebooks/00_rl_basics.ipynb", []), (LESSON_12, [fetch])):
        ran.clear()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(_setup_source(path), path, "exec"), {})
        assert ran == [["-m", "pip", "install", "-q", REL.requirement(extra)], *needs]
        assert f"installing the course ({REL.ref})" in out.getvalue() and "this notebook runs on the" in out.getvalue()


def test_the_command_updates_then_checks(tmp_path, monkeypatch, capsys):
    for folder in ("notebooks", "solutions", "exercises"):
        (tmp_path / folder).mkdir()
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    lesson = tmp_path / "notebooks" / "00_rl_basics.ipynb"
    nbformat.write(colab.apply(_read(ROOT / "notebooks/00_rl_basics.ipynb"), REL, "x"), lesson)  # a stale badge
    monkeypatch.chdir(tmp_path)
    assert cli_main(["colab", "--check"]) == 1
    assert "out of date: notebooks/00_rl_basics.ipynb" in capsys.readouterr().out
    assert cli_main(["colab"]) == 0 and "updated: notebooks/00_rl_basics.ipynb" in capsys.readouterr().out
    assert cli_main(["colab", "--check", str(lesson)]) == 0
    assert colab.badge_target(_read(lesson)) == (REL, "notebooks/00_rl_basics.ipynb")
    assert cli_main(["colab", "--ref", "abc1234", str(lesson)]) == 0
    assert colab.badge_target(_read(lesson))[0].ref == "abc1234"


# ----------------------------------------------------------------------------- a lesson from a bare folder

@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The package built into a wheel, from a copy of what it is made of (the build leaves build/ and egg-info)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    for package in ("minigrpo", "minigrpo_course"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (found,) = (tmp / "dist").glob("minigrpo-*.whl")
    return found


def test_the_wheel_ships_what_the_lessons_read(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    questions = (ROOT / "minigrpo_course/interview/questions").glob("*.md")
    package_data = ["minigrpo_course/matplotlibrc", *(p.relative_to(ROOT).as_posix() for p in questions)]
    assert len(package_data) > 5
    missing = [f for f in package_data if f not in names]
    assert not missing, f"not in the wheel: {missing}"
    sources = [p.relative_to(ROOT).as_posix() for pkg in ("minigrpo", "minigrpo_course")
               for p in (ROOT / pkg).rglob("*.py")]
    assert not [f for f in sources if f not in names]


@pytest.fixture(scope="module")
def bare_python(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed: the course's third-party packages come from this
    interpreter's site-packages through a .pth line (a folder added that way has its own .pth files left unread, so
    the checkout's editable install stays out); minigrpo comes from the wheel only."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "course_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    return python


def _bare_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(MPLBACKEND="Agg", TQDM_DISABLE="1", PIP_NO_INDEX="1")  # no index: a setup cell that installs fails
    return env


PROBE = ("import json, sys, minigrpo, minigrpo_course\n"
         "print(json.dumps([sys.executable, minigrpo.__file__, minigrpo_course.__file__]))")


def _run_bare(python: Path, notebook: Path, folder: Path, timeout: int = 600) -> None:
    """Run ``notebook`` (with the tool's cells) in smoke mode from ``folder``, holding only that notebook."""
    folder.mkdir()
    nb = colab.apply(_read(notebook), REL, _rel(notebook))
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    nbformat.write(nb, folder / notebook.name)
    assert sorted(p.name for p in folder.iterdir()) == [notebook.name]
    done = subprocess.run([str(python), "-m", "minigrpo_course", "run", notebook.name, "--smoke", "--output",
                           "out.ipynb", "--timeout", str(timeout)], cwd=folder, env=_bare_env(), capture_output=True,
                          text=True, timeout=timeout * 3)
    assert done.returncode == 0, (
        f"{notebook.name} failed from a bare folder:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    ran = _read(folder / "out.ipynb")
    setup = next(c for c in ran.cells if c.get("id") == colab.SETUP)
    assert setup.outputs == [], "the setup cell found no course and tried to install it"
    executable, library, course = json.loads(ran.cells[-1].outputs[0].text)
    venv = python.parent.parent
    assert Path(executable).parent.parent == venv, "the kernel is not the bare environment's Python"
    for module in (library, course):
        assert Path(module).is_relative_to(venv) and not Path(module).is_relative_to(ROOT), module


def test_the_bare_environment_imports_the_wheel_only(bare_python):
    code = "import minigrpo, minigrpo_course.colab, sys; print(minigrpo.__file__); print(minigrpo_course.__file__)"
    out = subprocess.run([str(bare_python), "-c", code], cwd=bare_python.parent, env=_bare_env(), check=True,
                         capture_output=True, text=True).stdout.split()
    assert all(Path(f).is_relative_to(bare_python.parent.parent) for f in out), out


def test_a_lesson_runs_from_a_bare_folder_with_only_the_wheel(bare_python, tmp_path):
    _run_bare(bare_python, ROOT / "notebooks" / "00_rl_basics.ipynb", tmp_path / "lesson")


EVERY_LESSON = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks/deep_dives").glob("*.ipynb"))


@pytest.mark.skipif(os.environ.get("MINIGRPO_COLAB_ALL") != "1", reason="every lesson from a bare folder: minutes; "
                    "MINIGRPO_COLAB_ALL=1 runs them")
@pytest.mark.parametrize("path", EVERY_LESSON, ids=_rel)
def test_every_lesson_runs_from_a_bare_folder(bare_python, tmp_path, path):
    _run_bare(bare_python, path, tmp_path / "lesson", timeout=900)
