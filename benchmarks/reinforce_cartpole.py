"""Environment steps and wall-clock seconds for REINFORCE to solve CartPole-v1, over several seeds.

"Solved" = the greedy policy's mean return over 10 evaluation episodes reaches 475, evaluated each
time another `--eval-every-steps` env steps are done. Run:
    python benchmarks/reinforce_cartpole.py            # 5 seeds, value baseline
    python benchmarks/reinforce_cartpole.py --baseline none --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import statistics
import time

from minigrpo.control import ReinforceConfig, train_reinforce


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--baseline", default="value", choices=["value", "none"])
    parser.add_argument("--num-iterations", type=int, default=300, help="give up after this many updates")
    parser.add_argument("--eval-every-steps", type=int, default=5_000)
    args = parser.parse_args()

    print(f"REINFORCE on CartPole-v1, baseline={args.baseline}, evaluating every {args.eval_every_steps} env steps")
    print(f"{'seed':>4}  {'solved':>6}  {'env steps':>10}  {'seconds':>8}  {'updates':>7}")
    steps, secs = [], []
    for seed in args.seeds:
        cfg = ReinforceConfig(seed=seed, baseline=args.baseline, num_iterations=args.num_iterations,
                              eval_every_steps=args.eval_every_steps)
        start = time.perf_counter()
        result = train_reinforce(cfg, progress=False)
        elapsed = time.perf_counter() - start
        n_updates = result.history["iteration"][-1]
        if result.solved_at_step is None:
            print(f"{seed:>4}  {'no':>6}  {result.history['env_steps'][-1]:>10}  {elapsed:>8.1f}  {n_updates:>7}")
            continue
        steps.append(result.solved_at_step)
        secs.append(result.solved_at_seconds)
        print(f"{seed:>4}  {'yes':>6}  {result.solved_at_step:>10}  {result.solved_at_seconds:>8.1f}  {n_updates:>7}")
    if steps:
        print(f"solved {len(steps)}/{len(args.seeds)} seeds; median env steps {statistics.median(steps):.0f}, "
              f"median seconds {statistics.median(secs):.1f}")
    else:
        print(f"solved 0/{len(args.seeds)} seeds")


if __name__ == "__main__":
    main()
