"""Data-parallel GRPO (minigrpo/infra/distributed.py): two CPU processes (gloo) that each hold half of a global batch take
the same optimizer step as one process on the whole batch; and the one-process path stays collective-free."""

import dataclasses
import os
import statistics

import pytest
import torch
import torch.multiprocessing as mp

from minigrpo.infra.distributed import SEED_STRIDE, Distributed
from minigrpo.llm.data import DatasetTask
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.sampling import Generation
from minigrpo.llm.tokenizer import build_char_tokenizer
from two_processes import START, accelerate_launch, free_port, join_as_launched

CASES = [("grpo", 2), ("dapo", 2), ("dr_grpo", 1), ("bnpo", 1)]  # (loss_type, gradient_accumulation_steps)
PROMPTS, G = 4, 4  # global batch: 4 prompts x G = 4; each of 2 ranks holds 2 whole groups


def spread_reward(completions, **kwargs):
    """Rewards with spread inside every group (a tiny random model is never right)."""
    return [len(c) / 7 + c.count("1") for c in completions]


def _trainer(model, tok, loss_type, accum, prompts):
    task = DatasetTask([{"prompt": f"{i}+{i}="} for i in range(10)], [spread_reward], max_completion_length=6)
    cfg = GRPOConfig(prompts_per_step=prompts, num_generations=G, max_completion_length=6, beta=0.04, num_iterations=1,
                     loss_type=loss_type, gradient_accumulation_steps=accum, learning_rate=1e-2, eval_every=0)
    return GRPOTrainer(model, tok, task, cfg, ref_model=make_tiny_model(tok, seed=1))


def _rows(gen: Generation, rows: slice) -> Generation:
    return dataclasses.replace(gen, **{f.name: getattr(gen, f.name)[rows] for f in dataclasses.fields(gen)
                                       if isinstance(getattr(gen, f.name), torch.Tensor)})


def _recording(trainer):
    """Record what the trainer's next step draws: its problems and its completions."""
    drawn = {"problems": [], "gen": []}
    sample, sampler = trainer.task.sample, trainer.sample_completions
    trainer.task.sample = lambda rng: drawn["problems"].append(sample(rng)) or drawn["problems"][-1]
    trainer.sample_completions = lambda *a, **k: drawn["gen"].append(sampler(*a, **k)) or drawn["gen"][-1]
    return drawn


def _replaying(trainer, problems, gen):
    """Make the trainer's next step draw these problems and these completions (a rollout made elsewhere)."""
    queue = iter(problems)
    trainer.task.sample = lambda rng: next(queue)
    trainer.sample_completions = lambda *a, **k: gen


def _one_step(trainer):
    """One GRPO step; returns (parameters, gradients as clipped, metrics)."""
    metrics = trainer.step()
    params = [p.detach().clone() for p in trainer.model.parameters()]
    grads = [p.grad.detach().clone() for p in trainer.model.parameters()]
    return params, grads, metrics


def _worker(rank, port, batches, state, out_dir):
    join_as_launched(rank, port)
    tok = build_char_tokenizer()
    results = {}
    for (loss_type, accum), (problems, gen) in zip(CASES, batches):
        model = make_tiny_model(tok, seed=2 + rank)  # different weights on rank 1: the broadcast must fix them
        if rank == 0:
            model.load_state_dict(state)
        trainer = _trainer(model, tok, loss_type, accum, PROMPTS // 2)
        assert (trainer.dist.rank, trainer.dist.world_size) == (rank, 2)
        half = PROMPTS // 2 * G
        _replaying(trainer, problems[rank * PROMPTS // 2:(rank + 1) * PROMPTS // 2],
                   _rows(gen, slice(rank * half, (rank + 1) * half)))
        results[loss_type] = _one_step(trainer)
    folder = os.path.join(out_dir, "checkpoint")  # a resume: rank 0 saves, every rank loads
    if rank == 0:
        trainer.save_checkpoint(folder)
    trainer.dist.barrier()
    trainer.load_checkpoint(folder)
    results["resumed"] = (trainer.gen.get_state(), trainer.rng.random())
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def test_two_processes_take_the_one_process_step_of_the_global_batch(tmp_path, one_torch_thread):
    """For each loss_type: the same global rollout (4 prompts x 4, drawn by the one-process step and replayed to the
    ranks) — one process steps on all of it, two gloo processes on two groups each; (clipped) gradients and grad_norm agree to float32 rounding (1e-4 relative, the
    sum of two halves against one sum), parameters after AdamW (lr 1e-2) within 1e-6
    (where |grad| > 1e-6); and
    both ranks end with the same weights. Resumed from rank 0's checkpoint, the ranks still draw apart."""
    from accelerate import PartialState

    PartialState()  # a one-process state in the parent, as an earlier test leaves it: forked workers must not keep it
    tok = build_char_tokenizer()
    state = make_tiny_model(tok, seed=0).state_dict()
    batches, expected, global_std = [], {}, {}
    for loss_type, accum in CASES:
        model = make_tiny_model(tok, seed=0)
        trainer = _trainer(model, tok, loss_type, accum, PROMPTS)
        drawn = _recording(trainer)
        expected[loss_type] = _one_step(trainer)
        assert expected[loss_type][2]["frac_reward_zero_std"] == 0.0  # every group has a spread: every row counts
        batches.append((drawn["problems"], drawn["gen"][0]))
        texts = drawn["gen"][0].texts(tok)
        global_std[loss_type] = statistics.stdev(spread_reward(texts))  # Bessel, as TRL's nanstd
        assert expected[loss_type][2]["rewards/spread_reward/std"] == pytest.approx(global_std[loss_type])
        per_rank = [statistics.stdev(spread_reward(texts[:8])), statistics.stdev(spread_reward(texts[8:]))]
        assert abs(sum(per_rank) / 2 - global_std[loss_type]) > 1e-3  # averaging the ranks' stds would show
    mp.start_processes(_worker, args=(free_port(), batches, state, str(tmp_path)), nprocs=2, join=True,
                       start_method=START)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    (gen0, draw0), (gen1, draw1) = (r["resumed"] for r in ranks)
    assert not torch.equal(gen0, gen1) and draw0 != draw1  # resumed from rank 0's checkpoint, still sampling apart
    for loss_type, _ in CASES:
        params, grads, metrics = expected[loss_type]
        for got in ranks:
            p2, g2, m2 = got[loss_type]
            assert m2["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5), loss_type
            assert m2["reward"] == pytest.approx(metrics["reward"])  # gathered: the global batch's mean
            # every reward statistic over the gathered rewards (TRL's), not a mean of the two ranks' own
            assert m2["rewards/spread_reward/std"] == pytest.approx(global_std[loss_type], rel=1e-12)
            assert m2["rewards/spread_reward/mean"] == pytest.approx(metrics["rewards/spread_reward/mean"])
            assert m2["loss"] == pytest.approx(metrics["loss"], rel=1e-5, abs=1e-7)  # the global batch's loss
            # kl is a mean over micro-batches, then over ranks: other micro-batches than one process's, close only
            assert m2["kl"] == pytest.approx(metrics["kl"], rel=1e-2)
            for a, b in zip(grads, g2):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)
            for a, b, g in zip(params, p2, grads):
                # AdamW's first step is lr·g/(|g| + eps), ~lr·sign(g): where |g| is below ~1e-6, float rounding of g
                # moves it by a visible share of lr, so those elements are held to the step's bound only
                tiny = g.abs() < 1e-6
                torch.testing.assert_close(b[~tiny], a[~tiny], rtol=1e-5, atol=1e-6)
                assert torch.all((b[tiny] - a[tiny]).abs() <= 2e-2)


def test_one_process_needs_no_collective():
    d = Distributed()
    assert (d.active, d.rank, d.world_size, d.is_main) == (False, 0, 1, True)
    t = torch.arange(6.0)
    assert d.gather(t) is t and d.local(6) == slice(0, 6) and d.sum(5) == 5 and d.seed(7) == 7
    metrics = {"a": 1.0}
    assert d.reduce_metrics(metrics) is metrics
    assert SEED_STRIDE > 1000


def test_accelerate_launch_runs_the_train_command_in_two_processes(tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2 -m minigrpo train llm --recipe sort --smoke`` on a CPU-only
    machine (accelerate then joins the processes with gloo; its ``--cpu`` flag alone starts one process): both ranks
    train, rank 0 alone prints the summary and writes (~25 s on 2 cores)."""
    import json

    out = tmp_path / "run"
    done = accelerate_launch("train", "llm", "--recipe", "sort", "--smoke", "--output", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "in 2 processes" in done.stdout and done.stdout.count("held-out (") == 1  # rank 0 alone reports
    history = json.loads((out / "results.json").read_text())["grpo_history"]
    assert history["step"] == [1, 2, 3, 4] and sorted(p.name for p in out.iterdir()) == ["checkpoint-4", "results.json"]


def test_a_launcher_that_starts_one_of_several_processes_is_one_warning(monkeypatch, tmp_path):
    """`accelerate launch --cpu --num_processes 2` starts one process with MASTER_ADDR set and no WORLD_SIZE: one
    warning (once per process), naming what to run instead; a plain run or a real group gets none."""
    import shutil
    import subprocess
    import sys
    import warnings
    from pathlib import Path

    import minigrpo.infra.distributed as distributed

    for key in [k for k in os.environ if k.startswith("ACCELERATE_")] + ["MASTER_ADDR", "WORLD_SIZE"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(distributed, "_warned_alone", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Distributed()  # no launcher: nothing to say
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    with pytest.warns(UserWarning, match=r"only this one runs .*--multi_gpu --num_processes N"):
        Distributed()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Distributed()  # once per process
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    if launcher is None:
        pytest.skip("the accelerate command is not installed")
    script = tmp_path / "one.py"
    script.write_text("from minigrpo.infra.distributed import Distributed\nprint(Distributed().world_size)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "ACCELERATE_USE_CPU")}
    done = subprocess.run([launcher, "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", str(script)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["1"], done.stderr[-2000:]
    assert done.stderr.count("only this one runs") == 1
