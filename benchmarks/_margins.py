"""The command line shared by the margin scripts (margins_control.py, margins_models.py): run each named
measurement for every seed × torch thread count, print and optionally append each run as a JSON line, then
print the summary table; or, with --summary, only summarise saved runs."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch


def main(description: str, names: Iterable[str], measure: Callable[[str, int], dict],
         summarise: Callable[[list[dict]], None], show: Callable[[dict], None] = lambda r: print(json.dumps(r))) -> None:
    """``measure(name, seed)`` returns one run's figures (the thread count is set before it is called)."""
    names = list(names)
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tests", default=",".join(names), help=f"comma-separated, of: {', '.join(names)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", help="append each run as a JSON line to this file")
    parser.add_argument("--summary", nargs="+", metavar="JSONL", help="only print the tables of saved runs")
    args = parser.parse_args()
    if args.summary:
        summarise([json.loads(line) for path in args.summary for line in Path(path).read_text().splitlines()
                   if line.strip()])
        return
    chosen = [n.strip() for n in args.tests.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown --tests {unknown}; known: {', '.join(names)}")
    records = []
    for name in chosen:
        for threads in args.threads:
            for seed in args.seeds:
                torch.set_num_threads(threads)
                start = time.perf_counter()
                rec = {"test": name, "seed": seed, "threads": threads, **measure(name, seed)}
                rec["seconds"] = round(time.perf_counter() - start, 2)
                show(rec)
                records.append(rec)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")
    summarise(records)
