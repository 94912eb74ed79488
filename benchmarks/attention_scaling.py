"""Time and peak memory of causal attention against sequence length: naive softmax, fused softmax, linear.

Prints one row per length (best-of-k forward time, peak bytes of tensors allocated by the call), the
crossover length from which linear attention stays faster than naive softmax, and log-log slopes
fitted beyond it (expect about 2 for softmax time, about 1 for linear attention). ``--backward`` times
forward + backward (the gradients of q, k and v), as in training. On a GPU, benchmarks/attention_gpu.py
compares the fused kernel with linear attention in bf16. Run:
    python benchmarks/attention_scaling.py
    python benchmarks/attention_scaling.py --lengths 256 512 1024 2048 4096 --repeats 7 --threads 2
    python benchmarks/attention_scaling.py --backward --lengths 256 1024 4096
"""

from __future__ import annotations

import argparse
import time

from minigrpo.attention import crossover_length, format_scaling_table, measure_attention_scaling, scaling_slopes

METHODS = ("softmax", "sdpa", "linear")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per point; the best is kept")
    parser.add_argument("--min-seconds", type=float, default=0.5,
                        help="keep timing a point (up to 200 calls) until this much time is spent")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backward", action="store_true", help="time forward + backward instead of forward")
    args = parser.parse_args()
    lengths = sorted(args.lengths)

    start = time.perf_counter()
    rows = measure_attention_scaling(lengths, METHODS, batch_size=args.batch, n_heads=args.heads,
                                     head_dim=args.head_dim, repeats=args.repeats, threads=args.threads,
                                     device=args.device, min_seconds=args.min_seconds, backward=args.backward)
    print(f"causal attention {'forward + backward' if args.backward else 'forward'}, batch {args.batch}, {args.heads} heads x {args.head_dim}, {args.device}, "
          f"{args.threads} thread(s), best of >= {args.repeats} calls "
          f"({'CPU time of the thread' if args.threads == 1 and args.device == 'cpu' else 'wall-clock'}; "
          f"measured in {time.perf_counter() - start:.0f} s)")
    print(format_scaling_table(rows))
    cross, fit, slopes = scaling_slopes(rows, slow="softmax", fast="linear")
    print(f"crossover (linear < naive softmax from there on): n = {cross}; log-log slopes fitted on n in {fit}")
    for m, (t, mem) in slopes.items():
        print(f"  {m:8s} time ~ n^{t:.2f}   memory ~ n^{mem:.2f}")
    print(f"linear < fused softmax (sdpa) from n = {crossover_length(rows, slow='sdpa', fast='linear')}")


if __name__ == "__main__":
    main()
