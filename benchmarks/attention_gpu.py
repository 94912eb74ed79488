"""Fused softmax attention (SDPA) vs chunked linear attention on a GPU: wall-clock against sequence length.

Causal attention in bf16 for one fixed batch and head layout, at sequence lengths 512 ... 32k:
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, exact softmax attention
  in a fused kernel (FlashAttention-style on recent GPUs: the n x n scores are never stored, the time is n²);
- ``linear``: ``minigrpo.attention.linear_attention_chunked``, causal linear attention (elu + 1 features)
  written in plain torch: masked matmuls inside chunks, a float32 prefix sum of the chunk states between
  them (time and memory linear in n, no custom kernel).
Each is timed for the forward pass and for forward + backward (gradients of q, k, v, as in training):
a warm-up call, then the median of ``--repeats`` calls, each bracketed by ``torch.cuda.synchronize()``.
The peak is ``torch.cuda.max_memory_allocated`` during one call, minus what was allocated before it.
Prints a Markdown table and where each method wins. Without CUDA it prints a note and exits 0.
Run (about a minute on one H100):
    python benchmarks/attention_gpu.py
    python benchmarks/attention_gpu.py --lengths 1024 4096 16384 --batch 1 --heads 32 --chunk-size 128
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from minigrpo.attention import linear_attention_chunked

DEFAULT_LENGTHS = [512, 1024, 2048, 4096, 8192, 16384, 32768]


def attend(method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
    if method == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return linear_attention_chunked(q, k, v, chunk_size=chunk_size)


def time_call(fn, repeats: int) -> tuple[float, int]:
    """(median seconds over ``repeats`` calls after one warm-up, peak bytes allocated by one call)."""
    fn()  # warm-up: kernel selection, allocator growth
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return statistics.median(times), torch.cuda.max_memory_allocated() - before


def measure(n: int, method: str, backward: bool, args: argparse.Namespace) -> tuple[float, int]:
    g = torch.Generator(device="cuda").manual_seed(n)
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v, grad_out = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(backward)

    def step():
        with torch.set_grad_enabled(backward):
            out = attend(method, q, k, v, args.chunk_size)
            if backward:
                q.grad = k.grad = v.grad = None
                out.backward(grad_out)

    result = time_call(step, args.repeats)
    del q, k, v, grad_out
    torch.cuda.empty_cache()
    return result


def crossover(rows: list[dict], mode: str) -> int | None:
    """The first length from which linear attention stays faster than SDPA (None if it never does)."""
    cross = None
    for row in reversed(rows):
        if row[f"linear {mode}"] < row[f"sdpa {mode}"]:
            cross = row["n"]
        else:
            break
    return cross


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=64, help="linear attention's chunk length")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per point; the median is kept")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("No CUDA device: this benchmark times GPU kernels, so there is nothing to measure here. "
              "On a CPU, run benchmarks/attention_scaling.py instead.")
        sys.exit(0)

    start = time.perf_counter()
    rows = []
    for n in sorted(args.lengths):
        row = {"n": n}
        for method in ("sdpa", "linear"):
            for mode, backward in (("fwd", False), ("fwd+bwd", True)):
                row[f"{method} {mode}"], row[f"{method} {mode} peak"] = measure(n, method, backward, args)
        rows.append(row)

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; causal attention, bf16, batch {args.batch}, "
          f"{args.heads} heads x {args.head_dim}, linear chunk {args.chunk_size}; median of {args.repeats} calls "
          f"(wall-clock, synchronized); measured in {time.perf_counter() - start:.0f} s\n")
    print("| n | SDPA fwd ms | linear fwd ms | SDPA fwd+bwd ms | linear fwd+bwd ms | "
          "SDPA / linear (fwd, fwd+bwd) | peak fwd+bwd GiB (SDPA, linear) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']:,} | {r['sdpa fwd'] * 1e3:.2f} | {r['linear fwd'] * 1e3:.2f} | "
              f"{r['sdpa fwd+bwd'] * 1e3:.2f} | {r['linear fwd+bwd'] * 1e3:.2f} | "
              f"{r['sdpa fwd'] / r['linear fwd']:.2f}, {r['sdpa fwd+bwd'] / r['linear fwd+bwd']:.2f} | "
              f"{r['sdpa fwd+bwd peak'] / 2**30:.2f}, {r['linear fwd+bwd peak'] / 2**30:.2f} |")
    for mode in ("fwd", "fwd+bwd"):
        cross = crossover(rows, mode)
        where = f"from n = {cross:,} on" if cross is not None else "at none of the measured lengths"
        print(f"\n{mode}: chunked linear attention is faster than SDPA {where}", end="")
    print()


if __name__ == "__main__":
    main()
