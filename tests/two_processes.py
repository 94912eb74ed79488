"""Shared by the 2-process tests (test_distributed.py, test_distributed_trainers.py): a free port, the start method,
and what a worker does first to join a 2-process gloo group as a launcher would have set it up."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

#: forked workers inherit the imports (torch, transformers, diffusers: most of a worker's start-up); the tests run
#: one torch thread (the fixture), so no thread pool is forked half-way. Spawned where fork is not the platform's habit.
START = os.environ.get("MINIGRPO_TEST_START_METHOD", "fork" if sys.platform == "linux" else "spawn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_as_launched(rank: int, port: int) -> None:
    """The environment ``accelerate launch`` / ``torchrun`` gives rank ``rank`` of 2, and one torch thread."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    from accelerate import PartialState

    if PartialState._shared_state:  # a one-process state forked from the parent would never join the group
        PartialState._reset_state()
    torch.set_num_threads(1)


def accelerate_launch(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``accelerate launch --multi_gpu --num_processes 2 -m minigrpo ARGS`` on a CPU-only machine (accelerate joins the
    two processes with gloo; its ``--cpu`` flag alone would start one). Skips where the command is not installed."""
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    if launcher is None:
        pytest.skip("the accelerate command is not installed")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return subprocess.run([launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "minigrpo", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)
