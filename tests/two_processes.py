"""Shared by the 2-process tests (test_distributed.py, test_distributed_trainers.py): a free port, the start method,
and what a worker does first to join a 2-process gloo group as a launcher would have set it up."""

import os
import socket
import sys

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
