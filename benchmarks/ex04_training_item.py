"""The figures behind exercise 04's training item (04.5): how soon the reference update and typical broken
ones solve CartPole-v1 with the grader's settings (``minigrpo_course.grading.ex04.TRAIN_CONFIG``).

For each update, seed and ``torch.set_num_threads(n)``: the env steps at which a greedy evaluation (10 episodes,
every 2,048 steps) first reached 475 ("-" if never within TRAIN_CONFIG's budget of 30,720 steps), the last
evaluation, and the CPU seconds of the run. ``run_on_policy`` trains inside ``torch_threads(1)``, so the outer thread count should change
nothing (the ``fingerprint`` column, a hash of the run's history without timings, shows it). ``--source solutions``
(or ``exercises``, or a notebook path) measures the notebook's own ``ppo_update`` instead of the reference.

    python benchmarks/ex04_training_item.py                                 # reference + broken, seeds 0-9, 1 and 2 threads
    python benchmarks/ex04_training_item.py --tests reference --seeds 0 1 2 --threads 1
    python benchmarks/ex04_training_item.py --tests notebook --source solutions

The figures are in the comments of ``TRAIN_CONFIG`` in ``minigrpo_course/grading/ex04.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from functools import partial
from pathlib import Path

import torch

from minigrpo.control import PPOConfig
from minigrpo.control.onpolicy import run_on_policy
from minigrpo_course.grading import ex04

ROOT = Path(__file__).resolve().parents[1]


def _no_step(cfg, agent, optimizer, batch):
    """An update that returns statistics but never steps: the untrained agent's score."""
    return {"num_steps": 0}


BROKEN = {"sign": partial(ex04._update, sign=-1.0), "no clipping": partial(ex04._update, clip=False),
          "no advantage normalisation": partial(ex04._update, norm="none"),
          "never shuffles": partial(ex04._update, shuffle="never"), "no zero_grad": partial(ex04._update, zero_grad=False),
          "no gradient clipping": partial(ex04._update, clip_grad=False), "no step": _no_step}


def _notebook_update(source: str):
    from minigrpo_course.grading.notebooks import find_notebook, load_functions

    path = find_notebook("04", ROOT / source) if source in ("solutions", "exercises") else Path(source)
    return load_functions(path).get("ppo_update")


def measure(update, seed: int) -> dict:
    cfg = PPOConfig(**{**ex04.TRAIN_CONFIG, "seed": seed})
    cpu = time.process_time()
    result = run_on_policy(cfg, "PPO", ex04.update_factory(update, cfg), progress=False)
    h = result.history
    runs = json.dumps({k: v for k, v in h.items() if k not in ("seconds", "sps")}, sort_keys=True, default=float)
    return {"solved_at": result.solved_at_step, "last_eval": round(h["eval_return"][-1], 1),
            "cpu_s": round(time.process_time() - cpu, 1), "fingerprint": hashlib.sha256(runs.encode()).hexdigest()[:10]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="reference," + ",".join(BROKEN),
                        help=f"comma-separated, of: reference, notebook, {', '.join(BROKEN)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--source", default="solutions", help="the notebook whose ppo_update 'notebook' measures")
    args = parser.parse_args()
    for name in [n.strip() for n in args.tests.split(",") if n.strip()]:
        update = {"reference": ex04.reference_ppo_update, **BROKEN}.get(name) or (
            _notebook_update(args.source) if name == "notebook" else parser.error(f"unknown test {name!r}"))
        for threads in args.threads:
            torch.set_num_threads(threads)
            rows = [measure(update, seed) for seed in args.seeds]
            solved = [r["solved_at"] for r in rows]
            print(f"{name}, {threads} thread(s): solved at {['-' if s is None else s for s in solved]}; last "
                  f"evaluation {[r['last_eval'] for r in rows]}; CPU s {[r['cpu_s'] for r in rows]}; "
                  f"fingerprints {[r['fingerprint'] for r in rows]}", flush=True)


if __name__ == "__main__":
    main()
