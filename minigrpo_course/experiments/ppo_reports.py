"""Lesson 04's result tables and seed bands for CartPole (PPO vs TRPO) and Pendulum (value clipping).

Printing only: the runs are made in the lesson's cells with the package's trainers; these helpers keep those
cells to the idea (what is compared, the call, the plot) and print what the cells printed before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minigrpo.control.onpolicy import TrainResult
from minigrpo_course.experiments.ppo_ablations import band


def _solved(r: TrainResult) -> tuple[str, str]:
    if r.solved_at_step:
        return f"{r.solved_at_step:>9}", f"{r.solved_at_seconds:6.1f}"
    return f"{'—':>9}", f"{'—':>6}"


def print_solve_table(runs: dict[str, list[TrainResult]], seeds: Sequence[int], smoke: bool = False) -> None:
    """Steps and seconds to solve per seed for two algorithms (``runs`` has exactly two names, e.g. PPO and
    TRPO, one result per seed), then per algorithm: seeds solved, median steps and seconds, mean env steps/s."""
    if len(runs) != 2:
        raise ValueError(f"runs must name exactly two algorithms to compare, got {list(runs)}")
    (a, ra), (b, rb) = runs.items()
    print(f"\n{'seed':>4} | {a + ' steps':>9} {a + ' s':>6} | {b + ' steps':>10} {b + ' s':>6}")
    for seed, p, t in zip(seeds, ra, rb):
        (ps, pt), (ts, tt) = _solved(p), _solved(t)
        print(f"{seed:>4} | {ps} {pt} | {ts:>10} {tt}")
    for name, rs in runs.items():
        solved = [r for r in rs if r.solved_at_step]
        if solved:
            print(f"{name}: solved {len(solved)}/{len(rs)} seeds; median {np.median([r.solved_at_step for r in solved]):.0f} steps, "
                  f"{np.median([r.solved_at_seconds for r in solved]):.1f} s; "
                  f"{np.mean([np.mean(r.history['sps']) for r in rs]):.0f} env steps/s during training")
        else:
            print(f"{name}: not solved within the budget ({'smoke mode' if smoke else 'full mode'})")


def print_final_runs(runs: dict[str, list[TrainResult]]) -> None:
    """Per setting and seed: the last greedy evaluation, the median explained variance and the final σ of a
    Gaussian policy (``agent.log_std``)."""
    for name, rs in runs.items():
        last = ", ".join(f"{r.history['eval_return'][-1]:5.0f}" for r in rs if r.history["eval_return"]) or "— (smoke)"
        ev = ", ".join(f"{np.median(r.history['explained_variance']):.2f}" for r in rs)
        print(f"  {name:32} last evaluation {last}; explained variance (median) {ev}; "
              f"final σ {', '.join(f'{r.agent.log_std.exp().item():.2f}' for r in rs)}")


def plot_seed_bands(runs: dict[str, list[TrainResult]], ax, key: str = "eval_return", x: str = "eval_step") -> None:
    """On ``ax``: the mean over seeds (line) and the range (band) of a history key, one colour per setting
    (settings without that history, e.g. in smoke mode, are skipped)."""
    for name, rs in runs.items():
        if rs[0].history[key]:
            xs, mean, lo, hi = band(rs, key, x)
            line, = ax.plot(xs, mean, "o-", ms=3, label=name)
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
