"""Our PPO vs Stable-Baselines3's PPO (rl-zoo tuned) on CartPole-v1, same seeds, same evaluation.

For each seed and each implementation: environment steps, wall-clock seconds and CPU seconds
(training plus evaluations, from the start) until a 10-episode deterministic evaluation, run every
5,000 env steps, has a mean return >= 475. Both run with one torch thread (faster than two for these
tiny networks, for both libraries). Paired rounds (benchmarks/_paired.py): round k runs seed k of both,
the first alternating, so a change of load hits both; the ratios (SB3 ÷ ours, > 1: ours better) are the
medians of the per-seed ratios, with their spread. CPU seconds are less disturbed than wall-clock by other
processes on a busy machine. ``--compete N`` runs N competing processes beside it.

    pip install -e ".[bench]"        # stable-baselines3 (optional)
    python benchmarks/ppo_cartpole.py [--seeds 0 1 2 3 4] [--compete 2 --compete-kind torch]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from minigrpo.control import PPOConfig, train_ppo
from minigrpo.control.ppo import PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _paired  # noqa: E402

EVAL_EVERY, TARGET, MAX_STEPS = 5_000, 475.0, 100_000


def timed(run, seed: int) -> tuple[int | None, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    steps = run(seed)
    return steps, time.perf_counter() - wall, time.process_time() - cpu


def run_ours(seed: int) -> int | None:
    cfg = PPOConfig(**{**PRESETS["CartPole-v1"], "seed": seed, "total_timesteps": MAX_STEPS,
                       "eval_every_steps": EVAL_EVERY, "eval_episodes": 10, "target_return": TARGET})
    assert EVAL_EVERY % cfg.batch_size == 0  # evaluations at exact multiples of 5k, like SB3's
    return train_ppo(cfg, progress=False).solved_at_step


def run_sb3(seed: int) -> int | None:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
    from stable_baselines3.common.env_util import make_vec_env

    def linear(initial: float):
        return lambda progress_remaining: progress_remaining * initial

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=10_000 + seed)
    # rl-zoo hyperparams/ppo.yml, CartPole-v1
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed, device="cpu", verbose=0)
    stop = StopTrainingOnRewardThreshold(reward_threshold=TARGET, verbose=0)
    evaluator = EvalCallback(eval_env, callback_on_new_best=stop, n_eval_episodes=10, eval_freq=EVAL_EVERY // 8,
                             deterministic=True, verbose=0)
    model.learn(total_timesteps=MAX_STEPS, callback=evaluator)
    return model.num_timesteps if evaluator.best_mean_reward >= TARGET else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    _paired.add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    # Warm-up: the first Adam constructed in a process imports torch._dynamo (~3 s). Pay it here so
    # it is not charged to whichever implementation happens to run first.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    try:
        import stable_baselines3  # noqa: F401
        runners = {"minigrpo": run_ours, "sb3-tuned": run_sb3}
    except ImportError:
        print("stable-baselines3 not installed (pip install -e '.[bench]'): running ours only")
        runners = {"minigrpo": run_ours}

    print(f"PPO on CartPole-v1: env steps and seconds until eval mean >= {TARGET:.0f} (eval every {EVAL_EVERY}); "
          f"paired rounds: one seed per round, the first alternating; load {os.getloadavg()[0]:.2f}")
    results: dict[str, list[tuple[int | None, float, float]]] = {name: [] for name in runners}

    def side(name: str):
        seeds = iter(args.seeds)

        def one_run() -> None:
            seed = next(seeds)
            steps, wall, cpu = timed(runners[name], seed)
            results[name].append((steps, wall, cpu))
            shown = steps if steps is not None else "unsolved"
            print(f"{name:<10} {seed:>4} {shown:>10} {wall:>8.1f} {cpu:>7.1f}", flush=True)
        return one_run

    with _paired.Competitors(args.compete, args.compete_kind) as comp:
        print(f"beside: {comp}", flush=True)
        print(f"{'impl':<10} {'seed':>4} {'env steps':>10} {'seconds':>8} {'cpu s':>7}")
        names = list(runners) if len(runners) == 2 else ["minigrpo", "-"]
        pairing = _paired.Pairing(names, len(args.seeds), warmup=0, log=None)
        if len(runners) == 1:
            pairing.plan = [(k, n) for k, n in pairing.plan if n == "minigrpo"]
        steppers = {name: side(name) for name in runners}
        while not pairing.done:
            pairing.timed(steppers[pairing.next_side])

    for name, rows in results.items():
        steps = statistics.median([s if s is not None else float("inf") for s, _, _ in rows])
        wall = statistics.median([w for _, w, _ in rows])
        cpu = statistics.median([c for _, _, c in rows])
        solved = sum(s is not None for s, _, _ in rows)
        print(f"{name:<10} solved {solved}/{len(rows)}  median env steps {steps:.0f}  "
              f"median seconds {wall:.1f}  median cpu seconds {cpu:.1f}")
    summary = {"seeds": args.seeds, "results": results, "compete": args.compete, "compete_kind": args.compete_kind}
    if len(runners) == 2:
        ours, sb3 = results["minigrpo"], results["sb3-tuned"]
        per_seed = {"env steps": [(b[0] or float("inf")) / (a[0] or float("inf")) for a, b in zip(ours, sb3)],
                    "wall-clock": [b[1] / a[1] for a, b in zip(ours, sb3)],
                    "cpu": [b[2] / a[2] for a, b in zip(ours, sb3)]}
        for what, ratios in per_seed.items():
            summary[f"ratio {what}"] = _paired.spread(ratios)
            print(f"SB3 ÷ minigrpo, {what}, median of per-seed ratios: {_paired.fmt_ratio(summary[f'ratio {what}'])}")
    ld = _paired.spread(pairing.out.loads)
    print(f"1-min load average at the rounds' starts: median {ld['median']:.2f}, min–max {ld['min']:.2f}–"
          f"{ld['max']:.2f} ({comp})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
