"""The `minigrpo` command's plumbing under bad input: `run` on files that are not notebooks and with output paths
that cannot be written (refused in one sentence, exit status 2, before any kernel starts), and output cut short by
its reader (`minigrpo list | head -1`: no traceback, exit status 0)."""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minigrpo_course.cli import BROKEN_PIPE, main

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT))


class NoKernel:
    """Stands in for nbclient.NotebookClient: any attempt to start a run fails the test."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("the run started although its input was refused")


@pytest.fixture
def no_kernel(monkeypatch):
    import nbclient

    monkeypatch.setattr(nbclient, "NotebookClient", NoKernel)


def _good(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, str(path))
    return path


def _refused(capsys, argv) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", "refused before the 'running …' line"
    assert err.count("\n") == 1 and err.startswith("minigrpo run: ") and "Traceback" not in err
    return err


# ----------------------------------------------------------------------------- run: not a notebook

@pytest.mark.parametrize("content,message", [
    (b"not json at all", "is not a notebook: it is not JSON"),
    (b"", "is empty, not a notebook"),
    (b"  \n\n", "is empty, not a notebook"),
    (b"\xff\xfe\x00binary", "is not a notebook: it is not UTF-8 text"),
    (b"[1, 2]", "is JSON but not a notebook: it has no 'cells', 'metadata', 'nbformat'"),
    (b'{"a": 1}', "is JSON but not a notebook: it has no 'cells', 'metadata', 'nbformat'"),
    (b'{"nbformat": 4}', "is JSON but not a notebook: it has no 'cells', 'metadata'"),
    (b'{"nbformat": 5, "nbformat_minor": 0, "metadata": {}, "cells": []}',
     "is not a valid Jupyter notebook (Unsupported nbformat version 5)"),
    (b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": "x"}', "is not a valid Jupyter notebook ("),
    (b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code"}]}',
     "is not a valid Jupyter notebook ("),
    (b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "weird", "source": "",'
     b' "metadata": {}, "id": "a"}]}', "is not a valid Jupyter notebook ("),
], ids=["text", "empty", "blank", "binary", "list", "object", "only-nbformat", "nbformat-5", "cells-string",
        "cell-without-source", "unknown-cell-type"])
def test_run_refuses_a_file_that_is_not_a_notebook(capsys, tmp_path, monkeypatch, no_kernel, content, message):
    source = tmp_path / "bad.ipynb"
    source.write_bytes(content)
    monkeypatch.chdir(tmp_path)
    err = _refused(capsys, ["run", "bad.ipynb"])
    assert f"minigrpo run: bad.ipynb {message}" in err
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- run: output paths, checked first

def test_run_refuses_an_output_under_a_file(capsys, tmp_path, monkeypatch, no_kernel):
    _good(tmp_path / "ok.ipynb")
    (tmp_path / "afile").write_text("x")
    monkeypatch.chdir(tmp_path)
    err = _refused(capsys, ["run", "ok.ipynb", "--output", "afile/run.ipynb"])
    assert err == ("minigrpo run: cannot write the output notebook afile/run.ipynb: a file stands where a folder "
                   "of that path should be\n")


def test_run_refuses_an_output_that_is_a_folder(capsys, tmp_path, monkeypatch, no_kernel):
    _good(tmp_path / "ok.ipynb")
    (tmp_path / "out" / "ok.ipynb").mkdir(parents=True)   # --output out/ writes out/ok.ipynb: a folder here
    monkeypatch.chdir(tmp_path)
    err = _refused(capsys, ["run", "ok.ipynb", "--output", "out/"])
    assert "the output notebook path out/ok.ipynb is a folder; give a file name" in err


def test_run_refuses_a_read_only_output_folder_before_running(capsys, tmp_path, monkeypatch, no_kernel):
    import minigrpo_course.state as state

    _good(tmp_path / "ok.ipynb")
    monkeypatch.chdir(tmp_path)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(state.tempfile, "mkstemp", read_only)
    for argv in (["--output", "elsewhere/run.ipynb"], ["--in-place"]):
        err = _refused(capsys, ["run", "ok.ipynb", *argv])
        assert "cannot write the output notebook" in err and err.strip().endswith(": Permission denied")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_run_refuses_a_read_only_folder(capsys, tmp_path, monkeypatch, no_kernel):
    _good(tmp_path / "ok.ipynb")
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o555)
    monkeypatch.chdir(tmp_path)
    try:
        assert "Permission denied" in _refused(capsys, ["run", "ok.ipynb", "--output", "ro/run.ipynb"])
    finally:
        (tmp_path / "ro").chmod(0o755)


def test_a_run_in_a_subprocess_with_a_bad_output_path_ends_at_once(tmp_path):
    """The whole command, no kernel: one line, exit 2, and the notebook's (slow) cell never ran."""
    source = tmp_path / "slow.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"open({str(tmp_path / 'ran')!r}, 'w').close()")]
    nbformat.write(nb, str(source))
    (tmp_path / "afile").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "minigrpo_course", "run", str(source), "--output",
                           str(tmp_path / "afile" / "out.ipynb")], capture_output=True, text=True, env=_env(),
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "ran").exists()


# ----------------------------------------------------------------------------- broken pipes

@pytest.mark.parametrize("argv", [["list"], ["interview", "--list"], ["interview", "--show", "gae"],
                                  ["interview", "--stats"], ["interview", "--mock"], ["interview", "--flaws"]],
                         ids=lambda a: " ".join(a))
def test_output_into_a_closed_pipe_ends_quietly(tmp_path, argv):
    """The reader is gone before the command writes anything (what `| head -1` does to a long output): no
    BrokenPipeError traceback (exit status 1 before), nothing on stderr, exit status 0: the reader had what it
    wanted, and a `set -o pipefail` script that pipes minigrpo into head does not fail."""
    env = dict(_env(), MINIGRPO_HOME=str(tmp_path))
    read, write = os.pipe()
    os.close(read)  # the reader has gone
    try:
        proc = subprocess.run([sys.executable, "-m", "minigrpo_course", *argv], stdout=write, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL,
                              text=True, env=env, cwd=ROOT, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == BROKEN_PIPE == 0 and proc.stderr == ""


def test_help_into_a_closed_pipe_ends_quietly():
    """argparse drops a write error of its own help text and exits 0; nothing reaches stderr either."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "minigrpo_course", "--help"], stdout=write, stderr=subprocess.PIPE,
                              text=True, env=_env(), cwd=ROOT, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 0 and proc.stderr == ""


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell pipeline")
@pytest.mark.parametrize("command,first", [("list", "lessons (notebooks/; run one with: minigrpo run NN)"),
                                           ("interview --list", "  #  id")])
def test_a_pipe_into_head_shows_the_first_line_and_no_traceback(tmp_path, command, first):
    env = dict(_env(), MINIGRPO_HOME=str(tmp_path))
    proc = subprocess.run(f"{sys.executable} -m minigrpo_course {command} | head -1; echo \"status=${{PIPESTATUS[0]}}\"",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(first) and proc.stderr == ""
    assert lines[1] == "status=0"


def test_strip_widgets_drops_progress_bar_views_and_widget_state():
    import nbformat

    from minigrpo_course.cli import WIDGET_VIEW, strip_widgets

    nb = nbformat.v4.new_notebook()
    bar = nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": "x"}, "text/plain": "  0%|  | 0/9"})
    text = nbformat.v4.new_output("stream", name="stdout", text="done\n")
    plot = nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure>"})
    card = nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": "y"}, "text/html": "<p>card</p>",
                                                        "text/plain": "VBox(...)"})
    nb.cells = [nbformat.v4.new_code_cell("train()", outputs=[bar, text, plot, card]), nbformat.v4.new_markdown_cell("x")]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    assert strip_widgets(nb) == 1
    assert [o.get("name") or sorted(o["data"]) for o in nb.cells[0].outputs] == [
        "stdout", ["image/png", "text/plain"], ["text/html", "text/plain"]]  # the card keeps its HTML fallback
    assert "widgets" not in nb.metadata
    assert strip_widgets(nb) == 0


def test_committed_notebooks_hold_no_widget_state():
    root = Path(__file__).resolve().parents[1]
    found = [str(p.relative_to(root)) for folder in ("notebooks", "solutions", "exercises")
             for p in sorted((root / folder).rglob("*.ipynb")) if "application/vnd.jupyter.widget" in p.read_text()]
    assert not found, f"progress-bar widget state in {found}: re-run them with `minigrpo run` (it strips widgets)"
