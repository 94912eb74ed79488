"""Lesson 03's measurements: steps of growing length along a direction in parameter space (what they do to
the KL, the surrogate and the return), a functional view of a small actor for exact Fisher matrices, and
the plots and tables of TRPO runs over seeds and over trust-region radii δ.

The TRPO update itself lives in :mod:`minigrpo.control.trpo` and its pieces in :mod:`minigrpo.trust_region`;
the lesson writes them out by hand. Nothing here changes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.func import functional_call

from minigrpo.advantages import gae
from minigrpo.control import evaluate
from minigrpo.control.onpolicy import RolloutCollector, make_vec_env
from minigrpo.trust_region import set_flat_params


def policy_batch(agent, seed: int, num_envs: int = 8, num_steps: int = 256) -> dict:
    """One on-policy CartPole-v1 batch of ``num_envs × num_steps`` steps, flattened: ``obs``, ``actions``,
    ``old_logp``, ``adv`` (GAE with γ = 0.99, λ = 0.95, normalised over the batch) and ``episode_returns``."""
    envs = make_vec_env("CartPole-v1", num_envs)
    ro = RolloutCollector(envs, seed=seed).collect(agent, num_steps)
    envs.close()
    adv = gae(ro.rewards, ro.values, ro.next_values, ro.terminated, ro.truncated, gamma=0.99, lam=0.95)
    adv = adv.reshape(-1)
    return dict(obs=ro.obs.reshape(-1, ro.obs.shape[-1]), actions=ro.actions.reshape(-1),
                old_logp=ro.logp.reshape(-1), adv=(adv - adv.mean()) / (adv.std() + 1e-8),
                episode_returns=ro.episode_returns)


def sampled_return(agent, n_episodes: int, seed: int = 123) -> float:
    """Mean return of ``agent`` with sampled actions over ``n_episodes`` CartPole-v1 episodes. The episode
    seeds and the action noise are the same at every call (common random numbers), so two parameter
    values are compared on the same luck."""
    torch.manual_seed(seed)
    return float(evaluate(agent, "CartPole-v1", n_episodes, seed=seed, deterministic=False).mean())


def step_length_sweep(agent, params: Sequence[torch.Tensor], theta_old: torch.Tensor,
                      directions: dict[str, torch.Tensor], etas: Sequence[float], mean_kl: Callable[[], torch.Tensor],
                      surrogate: Callable[[], torch.Tensor], baseline: float, n_eval: int) -> dict[str, np.ndarray]:
    """Set the policy to ``θ_old + η·d`` for every unit direction ``d`` and length ``η``; record the mean KL
    from the old policy, the surrogate's gain ``L(θ) − L(θ_old)`` and the sampled return.

    Returns ``{name: array [len(etas), 3]}`` (KL, surrogate gain, return) and leaves the parameters at
    ``θ_old``. ``baseline`` is ``L(θ_old)``: the mean advantage, since every ratio is 1 there."""
    params = list(params)
    curves = {}
    for name, direction in directions.items():
        rows = []
        for eta in etas:
            set_flat_params(params, theta_old + eta * direction)
            with torch.no_grad():
                rows.append((mean_kl().item(), surrogate().item() - baseline, sampled_return(agent, n_eval)))
        curves[name] = np.array(rows)
    set_flat_params(params, theta_old)
    return curves


def print_step_sweep(etas: Sequence[float], curves: dict[str, np.ndarray]) -> None:
    """The table of :func:`step_length_sweep` for two directions side by side: KL and return per length."""
    (n1, c1), (n2, c2) = list(curves.items())[:2]
    print(f"{'|Δθ|':>7} | {n1.split()[0] + ': KL':>10} {'return':>7} | {n2.split()[0] + ': KL':>11} {'return':>7}")
    for eta, (k1, _, r1), (k2, _, r2) in zip(etas, c1, c2):
        print(f"{eta:7.3f} | {k1:10.2e} {r1:7.0f} | {k2:11.2e} {r2:7.0f}")


def functional_view(module: torch.nn.Module) -> tuple[torch.Tensor, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """``(θ₀, f)`` with θ₀ the module's parameters flattened into one vector and ``f(θ, x)`` the module's
    output at parameters ``θ`` (a flat vector of the same layout): what ``torch.func`` needs to take
    Jacobians and Hessians with respect to all parameters at once."""
    named = list(module.named_parameters())
    theta0 = torch.cat([p.detach().reshape(-1) for _, p in named])

    def unflatten(theta: torch.Tensor) -> dict[str, torch.Tensor]:
        if theta.shape != theta0.shape:
            raise ValueError(f"theta must have shape {tuple(theta0.shape)}, got {tuple(theta.shape)}")
        out, i = {}, 0
        for name, p in named:
            out[name] = theta[i:i + p.numel()].view(p.shape)
            i += p.numel()
        return out

    return theta0, lambda theta, x: functional_call(module, unflatten(theta), (x,))


def plot_cg_vs_sd(eig: torch.Tensor, histories: dict[float, tuple[list, list]]):
    """Left: the Fisher spectrum with the damping values; right: relative residuals of CG (solid) and
    steepest descent (dashed) per damping, ``histories = {damping: (cg_history, sd_history)}``."""
    import matplotlib.pyplot as plt

    n = len(eig)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    axes[0].semilogy(np.arange(1, n + 1), eig.flip(0).clamp(min=1e-18).numpy(), ".")
    for damping in histories:
        axes[0].axhline(damping, ls=":", lw=1, color="gray")
    axes[0].set(xlabel="index", ylabel="eigenvalue of F", ylim=(1e-12, 2),
                title=f"Spectrum of the Fisher matrix ({n} parameters); dotted: damping values")
    for (damping, (h_cg, h_sd)), color in zip(histories.items(), ("C0", "C1", "C2", "C3")):
        axes[1].semilogy(h_cg, "-", color=color, label=f"CG, damping {damping}")
        axes[1].semilogy(h_sd, "--", color=color, label=f"steepest descent, damping {damping}")
    axes[1].set(xlabel="iteration k", ylabel="|b − A x_k| / |b|", title="Solving (F + damping·I) x = g", ylim=(1e-14, 10))
    axes[1].legend(fontsize=8, ncol=2)
    plt.tight_layout()
    return fig


def first_solved(history: dict, target: float = 475) -> int | None:
    """The environment step of the first greedy evaluation whose mean return reaches ``target`` (None if none)."""
    return next((s for s, r in zip(history["eval_step"], history["eval_return"]) if r >= target), None)


def print_solved_table(seeds: Sequence[int], runs: dict[str, list[dict]], target: float = 475) -> None:
    """Per seed and per algorithm (two of them): the first evaluation step at ``target`` and the final evaluation."""
    (n1, h1), (n2, h2) = list(runs.items())[:2]
    fs = lambda s: f"{s:,d}" if s is not None else "not yet"   # noqa: E731
    print(f"{'seed':>4} | {f'{n1}: first eval ≥ {target:g}':>23} {'final eval':>10} | "
          f"{f'{n2}: first eval ≥ {target:g}':>22} {'final eval':>10}")
    for seed, ha, hb in zip(seeds, h1, h2):
        print(f"{seed:>4} | {fs(first_solved(ha, target)):>23} {ha['eval_return'][-1]:>10.0f} | "
              f"{fs(first_solved(hb, target)):>22} {hb['eval_return'][-1]:>10.0f}")


def band(hists: list[dict], x_key: str, y_key: str):
    """Mean, min and max over runs of ``y_key`` against ``x_key``, interpolated onto the first run's grid."""
    grid = np.asarray(hists[0][x_key])
    ys = np.stack([np.interp(grid, h[x_key], h[y_key]) for h in hists])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def plot_trpo_runs(runs: dict[str, list[dict]], seeds: Sequence[int], max_kl: float, trpo: str = "TRPO"):
    """Evaluation return (mean and min–max band) of every algorithm in ``runs``; the measured KL and the
    accepted step fraction of every update of the ``trpo`` runs, one line per seed."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for name, hists in runs.items():
        grid, mean, lo, hi = band(hists, "eval_step", "eval_return")
        line, = axes[0].plot(grid, mean, "o-", ms=3, label=name)
        axes[0].fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2)
    axes[0].axhline(475, color="gray", ls="--", lw=1, label="solved (475)")
    axes[0].set(xlabel="environment steps", ylabel="evaluation return (greedy)",
                title=f"CartPole-v1: mean and min–max over {len(seeds)} seed(s)")
    axes[0].legend()
    for seed, h in zip(seeds, runs[trpo]):
        axes[1].plot(h["iteration"], h["kl"], "o-", ms=3, lw=1, label=f"seed {seed}")
        axes[2].plot(h["iteration"], h["step_fraction"], "o", ms=4, alpha=0.7, label=f"seed {seed}")
    axes[1].axhline(max_kl, color="red", ls="--", lw=1.5, label="δ = max_kl")
    axes[1].set(xlabel="TRPO iteration", ylabel="measured mean KL of the update", ylim=(0, 1.6 * max_kl),
                title="KL after every TRPO update vs δ")
    axes[1].legend(fontsize=8)
    axes[2].set(xlabel="TRPO iteration", ylabel="accepted step fraction 2⁻ʲ", ylim=(-0.05, 1.1),
                title="Line search: fraction of the full step kept")
    axes[2].legend(fontsize=8)
    plt.tight_layout()
    return fig


def kl_summary(hists: list[dict], max_kl: float) -> str:
    """One line over all updates of ``hists``: KL min / median / max against δ, and how often the full
    step was accepted, backtracked (0 < fraction < 1) or rejected (fraction 0)."""
    kls = np.concatenate([h["kl"] for h in hists])
    fracs = np.concatenate([h["step_fraction"] for h in hists])
    return (f"{len(kls)} TRPO updates: KL min {kls.min():.4f}, median {np.median(kls):.4f}, max {kls.max():.4f} "
            f"(δ = {max_kl}); full step accepted in {np.mean(fracs == 1):.0%}, backtracked in "
            f"{np.mean((fracs > 0) & (fracs < 1)):.0%}, rejected in {np.mean(fracs == 0):.0%}")


def delta_sweep(train: Callable, make_config: Callable[[float, int], object], deltas: Sequence[float],
                seeds: Sequence[int], progress: bool = False) -> dict[float, list[dict]]:
    """``{δ: [train(make_config(δ, seed)).history for seed in seeds]}``, with a progress bar over δ."""
    from tqdm.auto import tqdm

    return {delta: [train(make_config(delta, seed), progress=False).history for seed in seeds]
            for delta in tqdm(deltas, desc="δ", disable=not progress)}


def show_delta_sweep(sweep_runs: dict[float, list[dict]]):
    """Print, per δ, the median and max of KL/δ over every update, how often the line search backtracked
    or rejected, and the mean final training return; plot each update's KL against δ (jittered) and the
    training curves."""
    import matplotlib.pyplot as plt

    deltas = list(sweep_runs)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    print(f"{'δ':>6} | {'median KL / δ':>13} {'max KL / δ':>10} | {'backtracked':>11} {'rejected':>8} | {'final train return':>18}")
    for delta, hists in sweep_runs.items():
        kl = np.concatenate([h["kl"] for h in hists])
        frac = np.concatenate([h["step_fraction"] for h in hists])
        axes[0].scatter(np.full(len(kl), delta) * np.exp(np.random.uniform(-0.1, 0.1, len(kl))), kl, s=8, alpha=0.6)
        for h in hists:
            axes[1].plot(h["env_steps"], h["train_return"], color=f"C{deltas.index(delta)}",
                         label=f"δ = {delta}" if h is hists[0] else None)
        final = np.mean([h["train_return"][-1] for h in hists])
        print(f"{delta:6.3f} | {np.median(kl) / delta:13.2f} {kl.max() / delta:10.2f} | "
              f"{np.mean((frac > 0) & (frac < 1)):11.0%} {np.mean(frac == 0):8.0%} | {final:18.0f}")
    d = np.geomspace(min(deltas) / 1.5, max(deltas) * 1.5, 10)
    axes[0].loglog(d, d, "r--", lw=1, label="KL = δ")
    axes[0].set(xlabel="δ (max_kl)", ylabel="measured KL of each update", title="Every update respects its trust region")
    axes[0].legend()
    axes[1].set(xlabel="environment steps", ylabel="training return (sampled actions)", title="Learning speed vs δ")
    axes[1].legend(fontsize=8)
    plt.tight_layout()
    return fig
