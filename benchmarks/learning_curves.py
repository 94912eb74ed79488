"""Multi-seed learning curves of PPO and TRPO on CartPole-v1, saved as a PNG for the README.

Each run trains for a fixed budget (no early stop) and is evaluated greedily (10 episodes) every
5k env steps; the plot shows the mean over seeds with a min-max band.

    python benchmarks/learning_curves.py [--seeds 0 1 2 3 4] [--steps 50000] [--out docs/cartpole_curves.png]
"""

from __future__ import annotations

import argparse
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from minigrpo.control import PPOConfig, TRPOConfig, train_ppo, train_trpo  # noqa: E402
from minigrpo.control.ppo import PRESETS  # noqa: E402


def run(name: str, seed: int, steps: int):
    common = dict(seed=seed, total_timesteps=steps, eval_every_steps=5_000, target_return=None)
    if name == "PPO":
        return train_ppo(PPOConfig(**{**PRESETS["CartPole-v1"], **common}), progress=False)
    return train_trpo(TRPOConfig(**common), progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--out", default="docs/cartpole_curves.png")
    args = parser.parse_args()
    grid = np.arange(5_000, args.steps + 1, 5_000)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, color in (("PPO", "tab:blue"), ("TRPO", "tab:orange")):
        curves, start = [], time.perf_counter()
        for seed in args.seeds:
            h = run(name, seed, args.steps).history
            curves.append(np.interp(grid, h["eval_step"], h["eval_return"]))
        curves = np.array(curves)
        print(f"{name}: final greedy return mean {curves[:, -1].mean():.0f} (min {curves[:, -1].min():.0f}) "
              f"over {len(args.seeds)} seeds, {time.perf_counter() - start:.0f} s")
        ax.plot(grid, curves.mean(0), color=color, label=f"{name} (mean of {len(args.seeds)} seeds)")
        ax.fill_between(grid, curves.min(0), curves.max(0), color=color, alpha=0.2)
    ax.axhline(475, color="gray", ls="--", lw=1, label="solved (475)")
    ax.set(xlabel="environment steps", ylabel="greedy evaluation return (10 episodes)",
           title="CartPole-v1: PPO vs TRPO, min-max band over seeds")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
