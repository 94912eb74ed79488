"""Data-parallel GRPO on CPU: seconds per step with 1 and 2 processes on the same global batch.

Each configuration trains the same tiny llama (the tests' character tokenizer) on a global batch of ``--prompts``
prompts × G = 8 completions of up to ``--tokens`` tokens: one process samples and learns from all of it; two gloo
processes (``minigrpo.infra.distributed``, started here with ``torch.multiprocessing`` as ``accelerate launch`` /
``torchrun`` would) take half each, sum their gradients and step together. The first ``--warmup`` steps are not
timed. On a 2-core machine two processes of 1 thread compete with one process of 2 threads for the same cores:
the figure is the cost of the collectives and of the smaller per-process batches, not a speed-up target.

The wrapper's overhead (the issue's ≤ 5% target): in one process, the same run with and without the collectives.
"Without" is the trainer as a plain one-process run builds it (every ``Distributed`` method the identity); "with"
joins a process group of one (gloo on CPU, NCCL on CUDA) and forces every collective on (the rewards gathered, the
normalisers and gradients all-reduced, the metrics all-gathered), which is what each rank pays under
``accelerate launch`` apart from the wait for the others. The two trainers step alternately (so that a busy machine
slows both alike), on the same seed: they must end with the same weights. On CPU here; on CUDA where there is one.

    python benchmarks/grpo_distributed.py [--prompts 8] [--tokens 16] [--steps 5] [--overhead-steps 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.multiprocessing as mp


def _task(tokens: int):
    from minigrpo.llm.data import DatasetTask

    def spread(completions, **kwargs):
        return [len(c) / 7 + c.count("1") for c in completions]

    return DatasetTask([{"prompt": f"{i}+{2 * i}="} for i in range(40)], [spread], max_completion_length=tokens)


def _run(rank: int, world: int, port: int, threads: int, args, out) -> None:
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(threads)
    from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
    from minigrpo.llm.models import make_tiny_model
    from minigrpo.llm.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    cfg = GRPOConfig(prompts_per_step=args.prompts // world, num_generations=8, max_completion_length=args.tokens,
                     learning_rate=1e-4, eval_every=0, loss_type="dapo")
    trainer = GRPOTrainer(make_tiny_model(tok, seed=0), tok, _task(args.tokens), cfg)
    times = []
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        trainer.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    if rank == 0:
        out.put(statistics.median(times))


def measure(world: int, threads: int, args) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_run, args=(r, world, port, threads, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    result = out.get()
    for p in procs:
        p.join()
    return result


def overhead(device: str, args) -> dict[str, float]:
    """Median s/step, wall-clock and this process's CPU time, of the same GRPO run without and with the collectives
    (one process, see the docstring): ``{"plain": ..., "wrapped": ..., "plain_cpu": ..., "wrapped_cpu": ...}``."""
    import torch.distributed as dist

    from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
    from minigrpo.llm.models import make_tiny_model
    from minigrpo.llm.tokenizer import build_char_tokenizer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=0, world_size=1)
    tok = build_char_tokenizer()
    cfg = GRPOConfig(prompts_per_step=args.prompts, num_generations=8, max_completion_length=args.tokens,
                     learning_rate=1e-4, eval_every=0, loss_type="dapo")
    plain, wrapped = (GRPOTrainer(make_tiny_model(tok, seed=0).to(device), tok, _task(args.tokens), cfg)
                      for _ in range(2))
    wrapped.dist.active = True  # a world of one: every collective runs (gather, all_reduce, all_gather_object)
    times: dict[str, list[float]] = {"plain": [], "wrapped": [], "plain_cpu": [], "wrapped_cpu": []}
    for i in range(args.warmup + args.overhead_steps):
        for name, trainer in (("plain", plain), ("wrapped", wrapped)):
            if device == "cuda":
                torch.cuda.synchronize()
            t, cpu = time.perf_counter(), time.process_time()
            trainer.step()
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t)
                times[f"{name}_cpu"].append(time.process_time() - cpu)
    same = all(torch.equal(a, b) for a, b in zip(plain.model.parameters(), wrapped.model.parameters()))
    if not same:
        raise RuntimeError("the run with collectives ended with other weights than the run without")
    return {k: statistics.median(v) for k, v in times.items()}


def print_overhead(args) -> None:
    for device in ("cpu", "cuda"):
        if device == "cuda" and not torch.cuda.is_available():
            print("GPU: no CUDA here, not measured", flush=True)
            continue
        t = overhead(device, args)
        print(f"wrapper overhead on {device} (1 process, median of {args.overhead_steps} alternating steps, same "
              f"weights at the end; target <= +5%):\n"
              f"  wall-clock: without {t['plain']:.4f} s/step, with {t['wrapped']:.4f} s/step, "
              f"{t['wrapped'] / t['plain'] - 1:+.1%}\n"
              f"  CPU time of the process (less sensitive to other jobs on the machine): without "
              f"{t['plain_cpu']:.4f} s/step, with {t['wrapped_cpu']:.4f} s/step, "
              f"{t['wrapped_cpu'] / t['plain_cpu'] - 1:+.1%}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="global prompts per step (even)")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--overhead-steps", type=int, default=20, help="steps per side of the overhead measurement")
    parser.add_argument("--only-overhead", action="store_true", help="skip the 1-vs-2-process scaling")
    args = parser.parse_args()
    cores = os.cpu_count()
    print(f"GRPO step on CPU ({cores} cores), global batch {args.prompts} prompts x G = 8, up to {args.tokens} tokens; "
          f"median of {args.steps} steps after {args.warmup}", flush=True)
    if args.only_overhead:
        print_overhead(args)
        return
    one = measure(1, 1, args)
    print(f"1 process,  1 thread : {one:.3f} s/step", flush=True)
    one_two = measure(1, 2, args)
    print(f"1 process,  2 threads: {one_two:.3f} s/step", flush=True)
    two = measure(2, 1, args)
    print(f"2 processes, 1 thread each: {two:.3f} s/step  (speed-up over 1 process x 1 thread {one / two:.2f}x, "
          f"efficiency {one / two / 2:.0%}; over 1 process x 2 threads {one_two / two:.2f}x)", flush=True)
    print_overhead(args)


if __name__ == "__main__":
    main()
