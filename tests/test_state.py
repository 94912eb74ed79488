"""minigrpo_course.state: writes that are all or nothing, and read-merge-writes that two processes share."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from minigrpo_course import state

ROOT = Path(__file__).resolve().parents[1]


def test_an_atomic_write_replaces_the_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "grades.json"
    state.atomic_write_json(path, {"01": 3}, indent=1)
    assert json.loads(path.read_text()) == {"01": 3}
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, "the permissions of a plain open(), not mkstemp's 0600"
    state.atomic_write_text(path, "second")
    assert path.read_text() == "second" and sorted(p.name for p in path.parent.iterdir()) == ["grades.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    path.write_text("old")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(state.os, "replace", refuse)
    with pytest.raises(PermissionError):
        state.atomic_write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_update_json_merges_and_refuses_to_overwrite_what_it_cannot_read(tmp_path):
    path = tmp_path / "p.json"
    assert state.update_json(path, lambda old: (old or []) + [1]) == [1]
    assert state.update_json(path, lambda old: old + [2]) == [1, 2]
    assert state.lock_path(path).name == ".p.json.lock"
    path.write_text("{broken")
    with pytest.raises(ValueError):
        state.update_json(path, lambda old: [3])
    assert path.read_text() == "{broken", "an unreadable file is never overwritten"


_WORKER = """
import sys, time
from minigrpo_course.state import update_json
path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    update_json(path, lambda old: {**(old or {}), f"{name}{i}": i})
    time.sleep(0.001)
"""


def test_two_processes_updating_one_file_lose_nothing(tmp_path):
    """Each process adds 150 keys, one read-merge-write each, at the same time as the other: all 300 survive
    (a fixed temporary name and no lock lost two thirds of the updates before)."""
    path = tmp_path / "shared.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(path), name, "150"], env=env) for name in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    data = json.loads(path.read_text())
    assert len(data) == 300 and all(f"{n}{i}" in data for n in "ab" for i in range(150))


def test_check_writable_says_why_in_one_sentence(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    assert state.check_writable(tmp_path / "new" / "deeper" / "f.json") == tmp_path / "new" / "deeper" / "f.json"
    assert not (tmp_path / "new" / "deeper" / "f.json").exists() and list((tmp_path / "new" / "deeper").iterdir()) == []
    with pytest.raises(ValueError, match="a file stands where a folder of that path should be"):
        state.check_writable(tmp_path / "afile" / "f.json", "progress file")
    with pytest.raises(ValueError, match=r"the transcript path .* is a folder; give a file name"):
        state.check_writable(tmp_path, "transcript")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(state.tempfile, "mkstemp", read_only)
    with pytest.raises(ValueError, match=r"cannot write the output notebook .*f.json: Permission denied$"):
        state.check_writable(tmp_path / "f.json", "output notebook")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_writable_refuses_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ValueError, match="Permission denied"):
            state.check_writable(folder / "f.json")
    finally:
        folder.chmod(0o755)


def test_keep_elsewhere_writes_to_the_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(state.tempfile, "tempdir", str(tmp_path))
    kept = state.keep_elsewhere("my answer", "answer")
    assert kept.parent == tmp_path and kept.name.startswith("minigrpo-answer-") and kept.read_text() == "my answer"
