"""Data parallelism beyond LLM GRPO (minigrpo/distributed.py): SFT, diffusion GRPO and PPO. For each, two CPU processes
(gloo) that each hold half of a global batch take the same optimizer step as one process on the whole batch.

Each test spawns two processes (imports included, ~10 s on 2 cores); the models are in float64 where the comparison
should be exact up to summation order."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, fn, args, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    torch.set_num_threads(1)
    torch.save(fn(rank, *args), os.path.join(out_dir, f"rank{rank}.pt"))


def run_two_processes(fn, args, tmp_path) -> list:
    """``fn(rank, *args)`` in two gloo processes (a module-level function); what each returned, in rank order."""
    mp.spawn(_worker, args=(_free_port(), fn, args, str(tmp_path)), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _params_and_grads(model):
    return ([p.detach().clone() for p in model.parameters()],
            [p.grad.detach().clone() for p in model.parameters() if p.grad is not None])


# ----------------------------------------------------------------------------- SFT

SFT_GLOBAL = 8  # problems in the global batch; 4 per rank


def _sft_setup(batch_size, seed=0):
    from minigrpo.llm.models import make_tiny_model
    from minigrpo.llm.sft import SFTConfig, SFTTrainer
    from minigrpo.llm.tasks import TASKS
    from minigrpo.llm.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    task = TASKS["sort"]()
    model = make_tiny_model(tok, seed=seed).double()
    return SFTTrainer(model, tok, task, SFTConfig(steps=1, batch_size=batch_size, learning_rate=1e-2)), task


def _sft_rank(rank, problems):
    trainer, _ = _sft_setup(SFT_GLOBAL // 2, seed=rank)  # rank 1 starts elsewhere: the broadcast must fix it
    assert (trainer.dist.rank, trainer.dist.world_size) == (rank, 2)
    loss = trainer.step(problems[rank * SFT_GLOBAL // 2:(rank + 1) * SFT_GLOBAL // 2])
    return loss, *_params_and_grads(trainer.model)


def test_sft_two_processes_take_the_one_process_step_of_the_global_batch(tmp_path):
    """Float64 tiny llama, 8 sorting demonstrations of different lengths (so the per-rank token counts differ): the
    summed gradients equal the one-process gradient to 1e-12 relative, the loss (the global token mean) to 1e-12, the
    parameters after AdamW to 1e-12; both ranks end with the same weights."""
    import random

    trainer, task = _sft_setup(SFT_GLOBAL)
    rng = random.Random(3)
    problems = [task.sample(rng) for _ in range(SFT_GLOBAL)]
    loss = trainer.step(problems)
    params, grads = _params_and_grads(trainer.model)
    for got_loss, p2, g2 in run_two_processes(_sft_rank, (problems,), tmp_path):
        assert got_loss == pytest.approx(loss, rel=1e-12)
        for a, b in zip(grads, g2):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-15)
        for a, b in zip(params, p2):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
