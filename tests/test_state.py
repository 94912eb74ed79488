"""minigrpo_course.state beyond JSON state (tests/test_grading_state.py covers read_json, update_json and the lock):
the all-or-nothing text write used for notebooks and transcripts, the up-front check of a path, and the fallback
file in the temporary folder."""

import os
import stat

import pytest

from minigrpo_course import state


def test_an_atomic_text_write_replaces_the_file_with_usual_permissions_and_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "run.ipynb"
    state.atomic_write_text(path, "first")
    state.atomic_write_text(path, "second")
    assert path.read_text() == "second" and sorted(p.name for p in path.parent.iterdir()) == ["run.ipynb"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, "what open() gives, not mkstemp's 0600"


def test_a_failed_text_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "t.md"
    path.write_text("old")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(state.os, "replace", refuse)
    with pytest.raises(PermissionError):
        state.atomic_write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.md"]


def test_write_json_goes_through_the_same_write(tmp_path, monkeypatch):
    calls = []
    real = state.atomic_write_text
    monkeypatch.setattr(state, "atomic_write_text", lambda path, text: calls.append(path) or real(path, text))
    state.update_json(tmp_path / "g.json", lambda data: {**data, "01": 1}, what="grades")
    assert calls == [tmp_path / "g.json"] and (tmp_path / "g.json").read_text() == '{\n "01": 1\n}\n'


def test_check_writable_says_why_in_one_sentence(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "new" / "deeper" / "f.json"
    assert state.check_writable(target) == target
    assert not target.exists() and list(target.parent.iterdir()) == [], "the probe file is removed"
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
    monkeypatch.setattr(state.tempfile, "tempdir", str(tmp_path / "missing"))
    assert state.keep_elsewhere("my answer", "answer") is None
