"""Experiment tracking and resumable checkpoints, shared by the trainers.

Tracking (the trainers' ``report_to``, ``logging_dir`` and ``logging_steps`` fields, named as in TRL):
:class:`Tracker` sends each logged step's scalars to TensorBoard (``torch.utils.tensorboard``, needs the
``tensorboard`` package), trackio or Weights & Biases, or to nothing (``"none"``, the default). Without a
``logging_dir`` the logs go to ``runs/<trainer>-<timestamp>``; ``tensorboard --logdir runs`` shows them.

Checkpoints (``output_dir``, ``save_steps``, ``resume_from_checkpoint``): a folder
``<output_dir>/checkpoint-<step>`` holds the weights in the model's own format (``save_pretrained`` when it
has one, so the folder loads like any saved model) and ``trainer_state.pt``: the step, the history, the
optimizer's state and every random state the run draws from (Python's, NumPy's and torch's global
generators and the trainer's own ``random.Random`` / ``torch.Generator`` / ``numpy`` generators). Loading
all of it makes a resumed run take exactly the steps an uninterrupted run would have taken.

Nothing is lost to a crash: a trainer writes a checkpoint into a temporary folder and renames it into place
(``minigrpo.infra.atomic``), and :func:`save_state` writes its files all or nothing. Resuming from "the latest"
(``resume_from_checkpoint=True``) skips a damaged newest checkpoint (:func:`checkpoint_problem`: an empty or
truncated file, a missing weights file) with one warning naming it, and takes the previous good one.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import random
import re
import time
import warnings
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minigrpo.infra.atomic import atomic_torch_save, atomic_write_json
from minigrpo.infra.distributed import is_main_process

#: The values ``report_to`` accepts (alone, or several in a list).
REPORT_TO = ("none", "tensorboard", "trackio", "wandb")
#: The package each tracker needs (``pip install <package>``).
PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}
CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.pt"


# --------------------------------------------------------------------------- tracking
def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def report_targets(value: str | Iterable[str]) -> tuple[str, ...]:
    """``report_to`` as a tuple of trackers, without ``"none"`` and duplicates (no check)."""
    items = [value] if isinstance(value, str) else list(value)
    return tuple(dict.fromkeys(v for v in items if v != "none"))


def check_report_to(cfg: Any, name: str = "report_to") -> None:
    """The config's ``report_to`` names known trackers whose packages are installed, or one error line."""
    value = getattr(cfg, name)
    items = [value] if isinstance(value, str) else list(value)
    where = f"{type(cfg).__name__}.{name}"
    for item in items:
        if item not in REPORT_TO:
            raise ValueError(f"{where} must be one of {REPORT_TO} or a list of them, got {item!r}")
    if "none" in items and len(items) > 1:
        raise ValueError(f"{where} cannot list 'none' with trackers, got {value!r}")
    for item in report_targets(items):
        if not _installed(PACKAGES[item]):
            raise ImportError(f"{where} asks for {item!r}, but the {PACKAGES[item]} package is not installed "
                              f"(pip install {PACKAGES[item]})")


def default_logging_dir(name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>`` (relative to the working directory, as TRL and CleanRL do)."""
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _scalar(value: Any) -> float | None:
    """A loggable float, or None for what is not a number (strings, lists, tensors with many entries)."""
    if isinstance(value, torch.Tensor):
        return float(value) if value.numel() == 1 else None
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return float(value)
    return None


class Tracker:
    """Writes scalar metrics to the trackers ``report_to`` names; a no-op for ``"none"``.

    ``log(metrics, step)`` sends every numeric entry of ``metrics`` (others are skipped) as ``prefix + key``
    at ``step``; ``close()`` flushes and ends the run. Also a context manager.
    """

    def __init__(self, report_to: str | Iterable[str] = "none", logging_dir: str | Path | None = None,
                 name: str = "run", config: Mapping[str, Any] | None = None, project: str = "minigrpo"):
        self.targets = report_targets(report_to) if is_main_process() else ()  # only rank 0 writes
        self.logging_dir = Path(logging_dir) if logging_dir else default_logging_dir(name)
        self._sinks: list[tuple[str, Any]] = []
        config = json.loads(json.dumps(dict(config or {}), default=str))  # plain values (Paths become str)
        for target in self.targets:
            self._sinks.append((target, self._open(target, name, config, project)))

    def _open(self, target: str, name: str, config: dict, project: str):
        if not _installed(PACKAGES[target]):
            raise ImportError(f"report_to={target!r} needs the {PACKAGES[target]} package "
                              f"(pip install {PACKAGES[target]})")
        if target == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(log_dir=str(self.logging_dir))
            writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)
            return writer
        # trackio and wandb are optional: imported by name so that the library needs neither
        module = importlib.import_module(target)
        if target == "trackio":
            return module.init(project=project, name=self.logging_dir.name, config=config)
        self.logging_dir.mkdir(parents=True, exist_ok=True)
        return module.init(project=project, name=self.logging_dir.name, dir=str(self.logging_dir), config=config)

    @property
    def active(self) -> bool:
        return bool(self._sinks)

    def log(self, metrics: Mapping[str, Any], step: int, prefix: str = "") -> None:
        if not self._sinks:
            return
        scalars = {f"{prefix}{k}": v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not None}
        for target, sink in self._sinks:
            if target == "tensorboard":
                for key, value in scalars.items():
                    sink.add_scalar(key, value, step)
            else:  # a trackio Run or a wandb Run
                sink.log(scalars, step=step)

    def close(self) -> None:
        for target, sink in self._sinks:
            if target == "tensorboard":
                sink.close()
            else:
                sink.finish()
        self._sinks = []

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def should_log(step: int, logging_steps: int, last_step: int) -> bool:
    """Log every ``logging_steps`` steps, and always the last one."""
    return step % logging_steps == 0 or step == last_step


# --------------------------------------------------------------------------- checkpoints
def checkpoint_folder(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"{CHECKPOINT_PREFIX}{step}"


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``output_dir``, newest (highest step) first."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob(f"{CHECKPOINT_PREFIX}*")
             if (m := re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The ``checkpoint-<step>`` folder of ``output_dir`` with the highest step that holds a trainer state."""
    return next((p for p in checkpoints(output_dir) if (p / STATE_FILE).is_file()), None)


def checkpoint_problem(folder: str | Path, needs_state: bool = True) -> str | None:
    """Why ``folder`` cannot be resumed from, in a few words, or None when it looks whole.

    Cheap checks that catch what an interrupted write leaves (nothing is unpickled): the trainer state and every
    ``.pt``/``.bin`` file is a complete zip archive (``torch.save``'s format: a cut one has lost its central
    directory), every ``.safetensors`` file covers what its header promises, every ``.json`` parses, a model's
    weights are there (``config.json`` or ``adapter_config.json`` without them: a missing file), and the same in
    sub-folders (a LoRA checkpoint's ``base_model/``)."""
    folder = Path(folder)
    if needs_state and not (folder / STATE_FILE).is_file():
        return f"no {STATE_FILE}"
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    for path in entries:
        problem = checkpoint_problem(path, False) if path.is_dir() else _file_problem(path)
        if problem is not None:
            return f"{path.name}/{problem}" if path.is_dir() else problem
    names = {p.name for p in entries}
    if "adapter_config.json" in names and not names & {"adapter_model.safetensors", "adapter_model.bin"}:
        return "adapter_model.safetensors is missing (the adapters' weights)"
    weights = [n for n in names if n.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json"))]
    if "config.json" in names and not weights:  # a transformers or diffusers model folder without its weights
        return "model.safetensors is missing (the model's weights)"
    return None


def _file_problem(path: Path) -> str | None:
    if path.stat().st_size == 0:
        return f"{path.name} is empty"
    try:
        if path.suffix in (".pt", ".bin"):
            zipfile.ZipFile(path).close()  # reads the central directory at the end: gone if the file was cut
        elif path.suffix == ".safetensors":
            return _safetensors_problem(path)
        elif path.suffix == ".json":
            index = json.loads(path.read_text())
            shards = set(index.get("weight_map", {}).values()) if path.name.endswith(".index.json") else set()
            missing = sorted(s for s in shards if not (path.parent / s).is_file())
            if missing:
                return f"{missing[0]} is missing (a shard {path.name} lists)"
    except Exception as exc:  # noqa: BLE001 - any failure to read it means "damaged"
        return f"{path.name} is damaged ({type(exc).__name__})"
    return None


def should_save(step: int, save_steps: int, last_step: int) -> bool:
    """Save every ``save_steps`` steps (0: never in between), and always at the last one."""
    return (save_steps > 0 and step % save_steps == 0) or step == last_step


def _safetensors_problem(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header giving each tensor's byte range, then the
    data: the file must hold exactly what the header promises (a cut file holds less)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if path.stat().st_size != 8 + size + end:
        return f"{path.name} is damaged (truncated: {path.stat().st_size} of {8 + size + end} bytes)"
    return None


def resolve_checkpoint(cfg: Any, value: str | Path | bool | None) -> Path | None:
    """Where to resume from: ``True`` is the latest good checkpoint in ``cfg.output_dir`` (a damaged newer one is
    skipped with one warning naming it); a path is that folder, which must be whole. An error in one sentence when
    there is none: call this before any training, so that a run never trains first and fails after."""
    if value is None or value is False:
        return None
    name = type(cfg).__name__
    if value is True:
        if cfg.output_dir is None:
            raise ValueError(f"{name}.resume_from_checkpoint=True needs {name}.output_dir (where to look)")
        found = checkpoints(cfg.output_dir)
        if not found:
            raise FileNotFoundError(f"{name}.resume_from_checkpoint=True: no {CHECKPOINT_PREFIX}<step> folder "
                                    f"with a {STATE_FILE} in {cfg.output_dir}")
        skipped = []
        for folder in found:
            problem = checkpoint_problem(folder)
            if problem is None:
                return folder
            warnings.warn(f"skipping the damaged checkpoint {folder} ({problem}); trying the previous one",
                          stacklevel=2)
            skipped.append(f"{folder.name}: {problem}")
        raise FileNotFoundError(f"{name}.resume_from_checkpoint=True: no checkpoint in {cfg.output_dir} is whole "
                                f"({'; '.join(skipped)})")
    path = Path(value)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{name}.resume_from_checkpoint: {path} holds no {STATE_FILE} (not a checkpoint)")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(f"{name}.resume_from_checkpoint: {path} is damaged ({problem}); resume from an earlier "
                         f"checkpoint, or resume_from_checkpoint=True for the latest whole one")
    return path


def _generators(owner: Any) -> dict[str, Any]:
    """The random generators an object holds as attributes (``random.Random``, torch and numpy generators)."""
    kinds = (random.Random, torch.Generator, np.random.Generator, np.random.RandomState)
    return {k: v for k, v in vars(owner).items() if isinstance(v, kinds)} if owner is not None else {}


def _get(gen: Any) -> Any:
    if isinstance(gen, random.Random):
        return gen.getstate()
    if isinstance(gen, torch.Generator):
        return gen.get_state()
    if isinstance(gen, np.random.Generator):
        return gen.bit_generator.state
    return gen.get_state()


def _set(gen: Any, state: Any) -> None:
    if isinstance(gen, random.Random):
        gen.setstate(state)
    elif isinstance(gen, torch.Generator):
        gen.set_state(state)
    elif isinstance(gen, np.random.Generator):
        gen.bit_generator.state = state
    else:
        gen.set_state(state)


def rng_state(owner: Any = None) -> dict[str, Any]:
    """Python's, NumPy's and torch's global random states, CUDA's if present, and ``owner``'s generators."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "owned": {k: _get(g) for k, g in _generators(owner).items()}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any], owner: Any = None) -> None:
    """Restore what :func:`rng_state` recorded (the generators ``owner`` holds under the same names)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    owned = _generators(owner)
    missing = set(state["owned"]) - set(owned)
    if missing:
        raise ValueError(f"the checkpoint has random states for {sorted(missing)}, which the trainer does not hold")
    for key, value in state["owned"].items():
        _set(owned[key], value)


#: the sub-folder of a LoRA save that holds the frozen base model the adapters were trained on
BASE_MODEL_FOLDER = "base_model"


def is_adapter_model(model: torch.nn.Module) -> bool:
    """True for a peft model (adapters on a frozen base): its ``save_pretrained`` writes only the adapters."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def save_weights(model: torch.nn.Module, folder: str | Path, final_folder: str | Path | None = None) -> None:
    """The weights in the model's own format: ``save_pretrained`` if it has one, else ``model.pt``.

    A peft model saves its adapters and, in ``base_model/``, the frozen base they were trained on, so that what
    was saved reloads as the trained model even when the base was changed in memory first (SFT of the whole
    model, then GRPO with LoRA: adapters alone would point at the un-SFT'd checkpoint). ``adapter_config.json``'s
    ``base_model_name_or_path`` names that folder (``final_folder``: where ``folder`` will be renamed to, for an
    atomic save), so ``AutoModelForCausalLM.from_pretrained(folder)`` and peft's ``AutoPeftModel`` load it too;
    :func:`load_saved_model` finds it relative to the folder, wherever the folder was moved. It costs the base's
    size on disk, in its stored dtype."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not hasattr(model, "save_pretrained"):
        torch.save(model.state_dict(), folder / "model.pt")
        return
    model.save_pretrained(folder)
    if is_adapter_model(model):
        base = model.get_base_model()
        weights = {name.replace(".base_layer.", "."): t for name, t in base.state_dict().items() if "lora_" not in name}
        base.save_pretrained(folder / BASE_MODEL_FOLDER, state_dict=weights)
        config = json.loads((folder / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = str(Path(final_folder or folder).resolve() / BASE_MODEL_FOLDER)
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def load_weights(model: torch.nn.Module, folder: str | Path) -> None:
    """Load what :func:`save_weights` wrote into ``model``, in place (its device and dtype are kept); for a peft
    model, the adapters, and the base weights from ``base_model/`` when the folder has it (so a resumed LoRA run
    gets the base it was trained on, e.g. after SFT, whatever base it was built from)."""
    folder = Path(folder)
    if (folder / "adapter_config.json").is_file() and is_adapter_model(model):
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        if (folder / BASE_MODEL_FOLDER).is_dir():
            base = model.get_base_model()
            names = {n.replace(".base_layer.", "."): n for n in base.state_dict() if "lora_" not in n}
            saved = type(base).from_pretrained(folder / BASE_MODEL_FOLDER).state_dict()
            if set(saved) != set(names):
                raise ValueError(f"{folder / BASE_MODEL_FOLDER} holds another model's weights than this trainer's "
                                 f"base (build the trainer as the run that saved it did)")
            base.load_state_dict({names[k]: v for k, v in saved.items()}, strict=False)
        set_peft_model_state_dict(model, load_peft_weights(str(folder), device=str(next(model.parameters()).device)))
        return
    if (folder / "model.pt").is_file():
        state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    else:
        state = type(model).from_pretrained(folder).state_dict()
    model.load_state_dict(state)


def load_saved_model(folder: str | Path, auto_class: Any = None, **from_pretrained_kwargs: Any) -> torch.nn.Module:
    """The model a trainer's ``save`` (or a checkpoint) holds, ready to use: ``auto_class.from_pretrained(folder)``
    (default ``AutoModelForCausalLM``), or for LoRA adapters the base from ``folder/base_model`` (else the one
    ``adapter_config.json`` names) with the adapters put back on it (a ``peft.PeftModel``)."""
    if auto_class is None:
        from transformers import AutoModelForCausalLM as auto_class
    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        return auto_class.from_pretrained(folder, **from_pretrained_kwargs)
    from peft import PeftModel

    base = folder / BASE_MODEL_FOLDER
    if not base.is_dir():
        base = json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]
    return PeftModel.from_pretrained(auto_class.from_pretrained(base, **from_pretrained_kwargs), folder)


def save_state(folder: str | Path, state: Mapping[str, Any], config: Any = None) -> None:
    """``trainer_state.pt`` (and the config as readable JSON, when given) in ``folder``, each file written whole
    (a temporary file renamed into place). A trainer that writes several files puts them in one
    ``atomic_folder`` (``minigrpo.infra.atomic``) so that the checkpoint appears whole or not at all."""
    folder = Path(folder)
    atomic_torch_save(dict(state), folder / STATE_FILE)  # all or nothing: a crash never leaves half a file
    if config is not None:
        atomic_write_json(folder / "trainer_config.json", config, indent=2, default=str)


def load_state(folder: str | Path) -> dict[str, Any]:
    """What :func:`save_state` wrote. The file holds Python objects (random states, history): load only
    checkpoints you made or trust, as with any pickle."""
    return torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=False)


def trainer_state(trainer: Any, **extra: Any) -> dict[str, Any]:
    """What a GRPO trainer's checkpoint holds besides the weights: its step, history, optimizer state and
    every random state (``trainer`` has ``step_count``, ``history`` and ``opt``)."""
    return {"step": trainer.step_count, "history": trainer.history, "optimizer": trainer.opt.state_dict(),
            "rng": rng_state(trainer), **extra}


def restore_trainer(trainer: Any, folder: str | Path) -> dict[str, Any]:
    """Put a trainer back where :func:`trainer_state` (and :func:`save_weights`) left it: weights, optimizer,
    random states, step and history. Returns the whole state, for what else the trainer saved."""
    state = load_state(folder)
    load_weights(trainer.model, folder)
    trainer.opt.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"], trainer)
    trainer.step_count, trainer.history = state["step"], state["history"]
    return state


__all__ = ["BASE_MODEL_FOLDER", "CHECKPOINT_PREFIX", "PACKAGES", "REPORT_TO", "STATE_FILE", "Tracker", "check_report_to",
           "checkpoint_folder", "checkpoint_problem", "checkpoints", "default_logging_dir", "is_adapter_model", "latest_checkpoint", "load_saved_model", "load_state",
           "load_weights",
           "report_targets", "resolve_checkpoint", "restore_trainer", "rng_state", "save_state", "save_weights",
           "set_rng_state", "should_log", "should_save", "trainer_state"]
