"""Margins of the training tests in tests/test_control.py and tests/test_onpolicy.py (issue 11).

A test that trains must assert a margin that holds on any machine: the float trajectory of a
trainer depends on the CPU's kernels, so one seed on one CPU says little. For each such test this
script runs the same training as the test over several seeds and ``torch.set_num_threads(n)`` for
n in {1, 2}, and prints the measured effect per run, the smallest effect, and the threshold the
test asserts (at most half the smallest effect).

Note: every trainer (``train_reinforce``, ``run_on_policy``: both ``train_loop``) and ``collect_episodes`` /
``per_episode_gradients`` run inside ``torch_threads(1)``, so the outer thread count reaches only
the code around them; the ``fingerprint`` column (a hash of the run's history, timings left out)
shows whether it changed anything.

    python benchmarks/margins_control.py                              # every test, seeds 0-4, threads 1 and 2
    python benchmarks/margins_control.py --tests ppo_solves,a2c --seeds 0 1 --threads 1 --out runs.jsonl
    python benchmarks/margins_control.py --summary runs.jsonl         # tables from saved runs

Each run is printed as it ends and, with ``--out``, appended to a JSON-lines file, so a long
measurement can be split over several processes and summarised at the end. The full measurement
(8 tests x 5 seeds x 2 thread counts) took about 35 minutes on a busy 2-core machine, two processes
at a time; the ten Pendulum runs (1-7 minutes each) are most of it. The figures are in the tests'
docstrings.

Choice of effects. On CartPole a *greedy* evaluation of the untrained actor-critic is no "before":
its argmax over near-equal logits is some fixed linear rule of the state, which scores 9 on some
seeds and 500 (the maximum) on seed 4. The CartPole learning effects therefore compare the
*sampled* policy's return at the end of training (the trainer's rolling mean of its last 20
training episodes) with the untrained agent's sampled return (20 episodes, about 21). On Pendulum the
untrained greedy policy (mean action about 0) cannot swing up, so greedy before/after is fine.
Evaluations use their own seeded envs and greedy actions, so how often a run evaluates does not
change its training (checked: identical parameters with and without evaluations).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import torch

from minigrpo.control import (
    A2CConfig,
    ActorCritic,
    MLPPolicy,
    PPOConfig,
    ReinforceConfig,
    TRPOConfig,
    collect_episodes,
    evaluate,
    make_vec_env,
    train_a2c,
    train_ppo,
    train_reinforce,
    train_trpo,
)
from minigrpo.control.ppo import PRESETS
from minigrpo.control.reinforce import episode_weights, per_episode_gradients
from minigrpo.utils import seed_everything

import _margins  # benchmarks/_margins.py: the shared command line

# ---------------------------------------------------------------- what the tests train (keep in sync)


def variance_setup(seed: int) -> dict[str, float]:
    """test_reward_to_go_and_a_baseline_reduce_gradient_variance, on ``seed``."""
    torch.manual_seed(seed)
    policy = MLPPolicy(4, 2, (32, 32))
    envs = make_vec_env("CartPole-v1", 16, seed=seed)
    fit = collect_episodes(envs, policy, n_episodes=64)
    test = collect_episodes(envs, policy, n_episodes=128)
    horizon = max(len(e) for e in fit + test)
    table, count = torch.zeros(horizon), torch.zeros(horizon)
    for e in fit:
        table[: len(e)] += episode_weights([e], 0.99)
        count[: len(e)] += 1
    table = table / count.clamp(min=1)

    def variance(**kw) -> float:
        g = per_episode_gradients(policy, test, 0.99, **kw)
        return ((g - g.mean(0)) ** 2).sum(1).mean().item()

    return {"v_episode": variance(returns="episode"), "v_rtg": variance(returns="reward_to_go"),
            "v_baseline": variance(returns="reward_to_go", baseline=lambda e: table[: len(e)])}


def untrained_return(cfg, deterministic: bool = True, episodes: int | None = None) -> float:
    """Mean return of the agent a trainer starts from (``train_loop``'s seeding), greedy or sampled actions."""
    seed_everything(cfg.seed)
    envs = make_vec_env(cfg.env_id, cfg.num_envs)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden_sizes)
    envs.close()
    return float(evaluate(agent, cfg.env_id, episodes or cfg.eval_episodes, seed=10_000 + cfg.seed,
                          deterministic=deterministic).mean())


def reinforce_solves_cfg(seed: int) -> ReinforceConfig:
    return ReinforceConfig(seed=seed)


def reinforce_no_baseline_cfg(seed: int) -> ReinforceConfig:
    return ReinforceConfig(seed=seed, baseline="none", num_iterations=20, eval_every_steps=0)


def ppo_target_kl_cfg(seed: int) -> PPOConfig:
    return PPOConfig(seed=seed, total_timesteps=1024, num_envs=4, num_steps=128, update_epochs=10,
                     learning_rate=3e-3, target_kl=1e-4, eval_every_steps=0)


def ppo_cartpole_cfg(seed: int) -> PPOConfig:
    return PPOConfig(**{**PRESETS["CartPole-v1"], "seed": seed, "total_timesteps": 60_000, "target_return": 475,
                        "eval_every_steps": 5_000})


def trpo_cfg(seed: int) -> TRPOConfig:
    return TRPOConfig(seed=seed, total_timesteps=20_480, eval_every_steps=0)


def a2c_cfg(seed: int) -> A2CConfig:
    return A2CConfig(seed=seed, total_timesteps=20_000, eval_every_steps=0)


def pendulum_cfg(seed: int) -> PPOConfig:
    # the test evaluates once at the end; the evaluations every 20k here only show the curve
    return PPOConfig(**{**PRESETS["Pendulum-v1"], "seed": seed, "eval_every_steps": 20_000, "target_return": None})


# ---------------------------------------------------------------- measurements: one dict per run


def _fingerprint(obj) -> str:
    if isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if k not in ("seconds", "sps")}
    return hashlib.sha1(repr(obj).encode()).hexdigest()[:10]


def _curve(hist: dict) -> str:
    return " ".join(f"{s // 1000}k:{r:.0f}" for s, r in zip(hist["eval_step"], hist["eval_return"]))


def m_variance(seed: int) -> dict:
    v = variance_setup(seed)
    return {**v, "ratio_ep_rtg": v["v_episode"] / v["v_rtg"], "ratio_rtg_base": v["v_rtg"] / v["v_baseline"],
            "fingerprint": _fingerprint(v)}


def m_reinforce_solves(seed: int) -> dict:
    cfg = reinforce_solves_cfg(seed)
    res = train_reinforce(cfg, progress=False)
    h = res.history
    return {"untrained_greedy": untrained_return(cfg), "solved_at_step": res.solved_at_step,
            "solved_at_iteration": h["iteration"][-1] if res.solved_at_step else None,
            "budget_iterations": cfg.num_iterations, "last_eval": h["eval_return"][-1],
            "max_eval": max(h["eval_return"]), "curve": _curve(h),
            "train_return": [round(x, 1) for x in h["train_return"]], "fingerprint": _fingerprint(h)}


def m_reinforce_no_baseline(seed: int) -> dict:
    h = train_reinforce(reinforce_no_baseline_cfg(seed), progress=False).history
    first, last = float(np.mean(h["train_return"][:5])), float(np.mean(h["train_return"][-5:]))
    return {"first5": first, "last5": last, "gain": last - first, "ratio": last / first, "fingerprint": _fingerprint(h)}


def m_ppo_target_kl(seed: int) -> dict:
    cfg = ppo_target_kl_cfg(seed)
    h = train_ppo(cfg, progress=False).history
    return {"epochs_run": h["epochs_run"], "stopped_early": h["stopped_early"],
            "epochs_saved_min": cfg.update_epochs - max(h["epochs_run"]),
            "kl_over_target_min": min(h["approx_kl"]) / cfg.target_kl, "fingerprint": _fingerprint(h)}


def _solve_run(cfg, trainer: Callable) -> dict:
    res = trainer(cfg, progress=False)
    h = res.history
    out = {"untrained": untrained_return(cfg), "solved_at_step": res.solved_at_step,
           "train_return": [round(x, 1) for x in h["train_return"]], "env_steps": h["env_steps"][-1],
           "budget": cfg.total_timesteps, "last_eval": h["eval_return"][-1], "max_eval": max(h["eval_return"]),
           "curve": _curve(h), "fingerprint": _fingerprint(h)}
    if "kl" in h:
        out["max_kl_over_delta"] = max(h["kl"]) / cfg.max_kl
    return out


def _learn_run(cfg, trainer: Callable) -> dict:
    """Sampled-policy return at the end of training (the trainer's rolling mean of the last 20
    training episodes) against the untrained agent's sampled return (20 episodes)."""
    h = trainer(cfg, progress=False).history
    out = {"untrained_sampled": untrained_return(cfg, deterministic=False, episodes=20),
           "first_train_return": h["train_return"][0], "final_train_return": h["train_return"][-1],
           "env_steps": h["env_steps"][-1], "fingerprint": _fingerprint(h)}
    out["gain"] = out["final_train_return"] - out["untrained_sampled"]
    if "kl" in h:
        out["max_kl_over_delta"] = max(h["kl"]) / cfg.max_kl
    return out


MEASURES: dict[str, tuple[str, Callable[[int], dict]]] = {
    "variance": ("test_reward_to_go_and_a_baseline_reduce_gradient_variance", m_variance),
    "reinforce_solves": ("test_reinforce_solves_cartpole", m_reinforce_solves),
    "reinforce_no_baseline": ("test_reinforce_without_baseline_learns", m_reinforce_no_baseline),
    "ppo_target_kl": ("test_ppo_target_kl_stops_epochs_early", m_ppo_target_kl),
    "ppo_solves": ("test_ppo_solves_cartpole", lambda s: _solve_run(ppo_cartpole_cfg(s), train_ppo)),
    "trpo": ("test_trpo_respects_the_trust_region_and_learns_cartpole", lambda s: _learn_run(trpo_cfg(s), train_trpo)),
    "a2c": ("test_a2c_learns_cartpole", lambda s: _learn_run(a2c_cfg(s), train_a2c)),
    "pendulum": ("test_ppo_pendulum_preset_learns_to_swing_up", lambda s: _solve_run(pendulum_cfg(s), train_ppo)),
}

# ---------------------------------------------------------------- effects, thresholds and the tables

#: Per test, what is measured on each run and what the test asserts on it:
#: (label, value of one run, kind, asserted). Kinds:
#: "effect": the test asserts value >= asserted, which must be at most half the smallest value seen;
#: "solve": env steps or iterations to reach the target; asserted is the test's budget, which should
#:          leave room (at least twice the largest value seen);
#: "exact": holds by construction (asserted is the bound), shown for information.
INF = float("inf")
EFFECTS: dict[str, list[tuple[str, Callable[[dict], float], str, float]]] = {
    "variance": [("Var(episode)/Var(rtg) - 1", lambda r: r["ratio_ep_rtg"] - 1, "effect", 1.0),
                 ("Var(rtg)/Var(rtg-b) - 1", lambda r: r["ratio_rtg_base"] - 1, "effect", 0.06)],
    "reinforce_solves": [("iterations to solve", lambda r: r["solved_at_iteration"] or INF, "solve", 150),
                         ("env steps to solve", lambda r: r["solved_at_step"] or INF, "solve", INF)],
    "reinforce_no_baseline": [("last5 - first5 train return", lambda r: r["gain"], "effect", 110)],
    "ppo_target_kl": [("10 - max epochs run", lambda r: r["epochs_saved_min"], "effect", 4.5),
                      ("min approx_kl / target_kl", lambda r: r["kl_over_target_min"], "exact", 1.0)],
    "ppo_solves": [("env steps to solve", lambda r: r["solved_at_step"] or INF, "solve", 60_000)],
    "trpo": [("train return - untrained sampled", lambda r: r["gain"], "effect", 100),
             ("max kl / max_kl", lambda r: r["max_kl_over_delta"], "exact", 1.0)],
    "a2c": [("train return - untrained sampled", lambda r: r["gain"], "effect", 65)],
    "pendulum": [("final eval - untrained eval", lambda r: r["last_eval"] - r["untrained"], "effect", 450)],
}


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def print_run(rec: dict) -> None:
    keys = [k for k in rec if k not in ("test", "seed", "threads")]
    print(f"{rec['test']:<22} seed={rec['seed']} threads={rec['threads']}  "
          + "  ".join(f"{k}={_fmt(rec[k])}" for k in keys), flush=True)


def summarise(records: list[dict]) -> None:
    for name in MEASURES:
        runs = sorted((r for r in records if r["test"] == name), key=lambda r: (r["seed"], r["threads"]))
        if not runs:
            continue
        print(f"\n== {MEASURES[name][0]}  ({len(runs)} runs)")
        labels = EFFECTS[name]
        print(f"{'seed':>4} {'thr':>3} {'fingerprint':>11} {'sec':>6}  "
              + "  ".join(f"{lab:>32}" for lab, *_ in labels))
        for r in runs:
            print(f"{r['seed']:>4} {r['threads']:>3} {r['fingerprint']:>11} {r['seconds']:>6.1f}  "
                  + "  ".join(f"{_fmt(float(f(r))):>32}" for _, f, *_ in labels))
        for lab, f, kind, asserted in labels:
            vals = [float(f(r)) for r in runs]
            line = f"  {lab}: min {min(vals):.4g}, max {max(vals):.4g}"
            if kind == "effect":
                ok = "ok" if asserted <= min(vals) / 2 else "TOO CLOSE"
                line += f"; half the min {min(vals) / 2:.4g}; asserted >= {asserted:g} ({ok})"
            elif kind == "solve" and asserted < INF:
                line += f"; budget {asserted:g} = {asserted / max(vals):.2g}x the largest"
            elif kind == "exact":
                line += f"; bound {asserted:g} (holds by construction)"
            print(line)
        same = {}
        for r in runs:
            same.setdefault(r["seed"], set()).add(r["fingerprint"])
        print("  thread count changed the run: " + (", ".join(f"seed {s}" for s, f in same.items() if len(f) > 1)
                                                   or "never (identical histories)"))


def main() -> None:
    _margins.main(__doc__.splitlines()[0], MEASURES, lambda name, seed: MEASURES[name][1](seed), summarise, print_run)


if __name__ == "__main__":
    main()
