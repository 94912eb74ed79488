"""Seeding, device choice and the smoke/full switch (defined torch-free in `minigrpo.smoke`, re-exported here)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from minigrpo.smoke import SMOKE_ENV_VAR, is_smoke, smoke_or_full

__all__ = ["SMOKE_ENV_VAR", "autocast_bf16", "float32_masters", "get_device", "is_smoke", "model_device", "seed_everything",
           "smoke_or_full", "torch_threads"]


def get_device(prefer: str | None = None) -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then CPU.

    ``prefer`` (e.g. ``"cpu"``) overrides the automatic choice; so does the environment variable
    ``MINIGRPO_DEVICE``.
    """
    choice = prefer or os.environ.get("MINIGRPO_DEVICE")
    if choice:
        return torch.device(choice)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (where its inputs, masks, rewards and advantages must live)."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def autocast_bf16(device: torch.device | str, enabled: bool = True):
    """``torch.autocast`` to bfloat16 on ``device``'s type (a no-op context when ``enabled`` is False).

    The trainers' ``bf16`` option: matrix products run in bf16 while float32 weights stay the master copy
    (mixed precision, what TRL's ``bf16=True`` does through the HF Trainer)."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


def float32_masters(model: torch.nn.Module) -> torch.nn.Module:
    """Cast ``model``'s trainable bf16 / fp16 parameters to float32 in place (float32 masters); returns it.

    Hub checkpoints are stored in bf16 and load in bf16 (transformers' ``dtype="auto"``). AdamW stepping bf16
    weights loses every update smaller than half a bf16 rounding step (at lr 1e-5, most of them): the trainers
    keep float32 master weights and leave the compute to bf16 autocast (``bf16=True``). Frozen parameters (a
    LoRA base) keep their dtype; so do float32 and float64 ones (the same tensors: nothing is lost)."""
    for p in model.parameters():
        if p.requires_grad and p.is_floating_point() and torch.finfo(p.dtype).bits < 32:  # bf16, fp16
            p.data = p.data.float()
    return model


def seed_everything(seed: int, env: Any = None) -> int:
    """Seed Python's, NumPy's and PyTorch's global generators, and a gymnasium env if given.

    For an env (or a list of envs) this resets it with ``seed`` (``seed + i`` for the i-th) and
    seeds its action space, so ``env.action_space.sample()`` is reproducible too. Returns ``seed``.
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if env is not None:
        envs = env if isinstance(env, (list, tuple)) else [env]
        for i, e in enumerate(envs):
            e.reset(seed=seed + i)
            e.action_space.seed(seed + i)
    return seed


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, restoring the previous value after.

    The control lessons' networks are tiny: splitting each op over several threads only adds
    synchronisation, and on a busy 2-core machine it made REINFORCE 20x slower than one thread.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
