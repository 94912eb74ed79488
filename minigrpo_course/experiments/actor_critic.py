"""Lesson 02's measurements: GAE's bias and variance at fixed (s, a) pairs of CartPole against Monte-Carlo
truth, and A2C learning curves for several λ over seeds.

The Monte-Carlo part steps a whole batch of CartPole states at once in torch (:func:`cartpole_step`, the
physics of gymnasium's ``CartPole-v1``; :func:`check_batched_physics` compares the two step for step),
which makes tens of thousands of continuations affordable on a CPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch

# CartPole-v1's constants (gymnasium's cartpole.py), Euler integration.
GRAVITY, MASSCART, MASSPOLE, HALF_LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS, POLEMASS_LENGTH = MASSCART + MASSPOLE, MASSPOLE * HALF_LENGTH
X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * math.pi / 360


def cartpole_step(state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of CartPole-v1 for a batch: ``state`` ``[B, 4]`` (x, x_dot, theta, theta_dot), ``action``
    ``[B]`` in {0, 1}. Returns the next states ``[B, 4]`` and whether each one terminates ``[B]``."""
    if state.ndim != 2 or state.shape[-1] != 4:
        raise ValueError(f"state must have shape [B, 4], got {tuple(state.shape)}")
    x, x_dot, theta, theta_dot = state.unbind(-1)
    force = torch.where(action == 1, FORCE_MAG, -FORCE_MAG).to(state.dtype)
    cos, sin = torch.cos(theta), torch.sin(theta)
    temp = (force + POLEMASS_LENGTH * theta_dot**2 * sin) / TOTAL_MASS
    theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - MASSPOLE * cos**2 / TOTAL_MASS))
    x_acc = temp - POLEMASS_LENGTH * theta_acc * cos / TOTAL_MASS
    nxt = torch.stack([x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot, theta_dot + TAU * theta_acc], -1)
    terminated = (nxt[:, 0].abs() > X_LIMIT) | (nxt[:, 2].abs() > THETA_LIMIT)
    return nxt, terminated


@torch.no_grad()
def policy_episodes(agent, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Run ``agent`` (sampled actions) for ``n`` episodes of the real gymnasium CartPole-v1, seeds
    ``seed, seed + 1, ...``; keep each episode's exact simulator states ``[T, 4]``, actions ``[T]`` and
    rewards ``[T]`` (float64)."""
    env, out = gym.make("CartPole-v1"), []
    for i in range(n):
        obs, _ = env.reset(seed=seed + i)
        states, actions, rewards = [], [], []
        while True:
            states.append(env.unwrapped.state.copy())
            a = int(agent.dist(torch.as_tensor(obs)[None]).sample())
            obs, rew, term, trunc, _ = env.step(a)
            actions.append(a)
            rewards.append(rew)
            if term or trunc:
                break
        out.append((np.array(states), np.array(actions), np.array(rewards, dtype=np.float64)))
    env.close()
    return out


def check_batched_physics(agent, n_episodes: int, seed: int) -> tuple[float, int, bool]:
    """Replay ``n_episodes`` episodes of ``agent`` through :func:`cartpole_step`, one state at a time.

    Returns the largest absolute difference from gymnasium's states, the number of steps checked, and
    whether every termination happened at the same step (episodes cut at 500 steps do not terminate)."""
    max_diff, n_checked, same_ends = 0.0, 0, True
    for states, actions, _ in policy_episodes(agent, n_episodes, seed=seed):
        s = torch.tensor(states[:1])
        for t in range(len(actions)):
            s, term = cartpole_step(s, torch.tensor(actions[t:t + 1]))
            if t + 1 < len(states):
                max_diff = max(max_diff, float((s[0] - torch.tensor(states[t + 1])).abs().max()))
            same_ends &= bool(term[0]) == (t == len(actions) - 1 and len(actions) < 500)
            n_checked += 1
    return max_diff, n_checked, same_ends


@torch.no_grad()
def continuations(agent, critics: Sequence[Callable[[torch.Tensor], torch.Tensor]], s0: torch.Tensor,
                  a0: torch.Tensor, n: int, lambdas: Sequence[float], gamma: float, horizon: int):
    """``n`` continuations from each pair ``(s0[i], a0[i])``: take ``a0[i]``, then follow ``agent`` until
    the pole falls (at most ``horizon`` steps; one still balancing then is bootstrapped from ``critics[0]``).

    The GAE estimate at the first step, Â = Σ_k (γλ)^k δ_k, is accumulated on the fly for every λ and
    every critic (CartPole pays 1 per step). Returns ``(returns [S, n], estimates [C, L, S, n],
    V(s0) [C, S], number of continuations cut at the horizon)``."""
    if len(s0) != len(a0):
        raise ValueError(f"s0 and a0 must have the same length, got {len(s0)} and {len(a0)}")
    B, C = len(s0) * n, len(critics)
    state, first_action = s0.repeat_interleave(n, 0), a0.repeat_interleave(n, 0)
    lam = torch.tensor(lambdas, dtype=torch.float64)
    value = torch.stack([c(state.float()).double() for c in critics])            # [C, B]: V(s_k)
    value0 = value.clone()
    adv = torch.zeros(C, len(lambdas), B, dtype=torch.float64)
    ret = torch.zeros(B, dtype=torch.float64)
    alive = torch.arange(B)                                                       # rows whose pole is still up
    for k in range(horizon):
        s = state[alive]
        a = first_action[alive] if k == 0 else agent.dist(s.float()).sample()
        s_next, term = cartpole_step(s, a)
        v_next = torch.stack([c(s_next.float()).double() for c in critics])       # [C, b]
        delta = 1.0 + gamma * torch.where(term, 0.0, v_next) - value[:, alive]
        adv[:, :, alive] += (gamma * lam)[:, None] ** k * delta[:, None, :]
        ret[alive] += gamma**k
        state[alive], value[:, alive] = s_next, v_next
        alive = alive[~term]
        if len(alive) == 0:
            break
    ret[alive] += gamma**horizon * value[0, alive]
    S = len(s0)
    return ret.view(S, n), adv.view(C, len(lambdas), S, n), value0.view(C, S, n)[:, :, 0], len(alive)


def bias_variance(returns: torch.Tensor, estimates: torch.Tensor, v_at_s: torch.Tensor, m: int):
    """Bias², variance and Monte-Carlo noise floor of one critic's GAE estimates, per λ.

    ``returns`` ``[S, n]`` and ``estimates`` ``[L, S, n]`` come from :func:`continuations`; the first ``m``
    continuations give the truth Q^π(s, a) − V(s), the others the estimates (independent of the truth).
    Each of the three results is ``[L]``, averaged over the S test pairs."""
    if not 1 < m < returns.shape[1] - 1:
        raise ValueError(f"m must leave at least two continuations on each side, got m={m} of {returns.shape[1]}")
    k = returns.shape[1] - m
    Q, var_return = returns[:, :m].mean(1), returns[:, :m].var(1)
    truth = Q - v_at_s                                     # [S]  Q^π(s, a) − V(s)
    est = estimates[:, :, m:]                              # [L, S, K]
    bias2 = ((est.mean(-1) - truth) ** 2).mean(-1)
    var = est.var(-1).mean(-1)
    floor = (est.var(-1) / k + var_return / m).mean(-1)
    return bias2, var, floor


def print_bias_variance(name: str, lambdas: Sequence[float], bias2, var, floor, v_minus_q: float,
                        q_mean: float) -> None:
    """The table of one critic: bias², variance and MSE per λ, and the noise floor of the bias² column."""
    print(f"\n{name}: V(s) − Q^π(s, a) averages {v_minus_q:+.1f} over the test pairs (Q^π averages {q_mean:.1f})")
    print(f"{'λ':>6s} {'bias²':>10s} {'variance':>10s} {'MSE':>10s}")
    for i, lam in enumerate(lambdas):
        print(f"{lam:6.2f} {bias2[i]:10.2f} {var[i]:10.2f} {bias2[i] + var[i]:10.2f}")
    print(f"(Monte-Carlo noise floor of the bias² column: ≈ {float(floor.max()):.2f})")


def plot_bias_variance(results: dict, lambdas: Sequence[float]):
    """One panel per critic: bias², variance and MSE against λ (symlog), with the noise floor."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(12, 4), sharey=True)
    x = np.arange(len(lambdas))
    for ax, (name, (bias2, var, floor)) in zip(np.atleast_1d(axes), results.items()):
        ax.plot(x, bias2, "o-", label="bias²")
        ax.plot(x, var, "s-", label="variance")
        ax.plot(x, bias2 + var, "k^--", label="MSE = bias² + variance")
        ax.axhline(float(floor.max()), color="gray", lw=0.8, ls=":", label="MC noise floor")
        ax.set_yscale("symlog", linthresh=0.1, linscale=0.5)
        ax.set_xticks(x, [str(l) for l in lambdas])
        ax.set_xlabel("λ")
        ax.set_title(name)
    first = np.atleast_1d(axes)[0]
    first.set_ylabel("mean over test pairs (symlog scale)")
    first.legend()
    fig.suptitle("GAE(γ = 0.99, λ) on CartPole: error of the advantage at a fixed (s, a), against Monte-Carlo truth")
    plt.tight_layout()
    return fig


def lambda_sweep(train: Callable, make_config: Callable[[float, int], object], lambdas: Sequence[float],
                 seeds: Sequence[int], progress: bool = False) -> tuple[dict, float]:
    """``{(λ, seed): train(make_config(λ, seed)).history}`` for every λ and seed (λ outer, seeds inner),
    and the wall-clock seconds it took."""
    curves, t0 = {}, time.perf_counter()
    for lam in lambdas:
        for seed in seeds:
            curves[lam, seed] = train(make_config(lam, seed), progress=progress).history
    return curves, time.perf_counter() - t0


def smooth(y, w: int = 20) -> np.ndarray:
    """Trailing moving average over ``w`` points that ignores NaN (the first iterations have no episode)."""
    y = np.asarray(y, dtype=float)
    return np.array([np.nanmean(y[max(0, i - w + 1):i + 1]) for i in range(len(y))])


def plot_lambda_curves(curves: dict, lambdas: Sequence[float], seeds: Sequence[int]):
    """Training return and explained variance against environment steps, mean ± one standard error
    over seeds (smoothed over 20 iterations), one line per λ."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for lam in lambdas:
        hs = [curves[lam, s] for s in seeds]
        x = np.asarray(hs[0]["env_steps"])
        for ax, key in zip(axes, ["train_return", "explained_variance"]):
            ys = np.stack([smooth(h[key]) for h in hs])
            mean = np.nanmean(ys, 0)
            line, = ax.plot(x, mean, label=f"λ = {lam}")
            if len(seeds) > 1:
                se = np.nanstd(ys, 0, ddof=1) / np.sqrt(len(seeds))
                ax.fill_between(x, mean - se, mean + se, color=line.get_color(), alpha=0.2)
    axes[0].set_ylabel("training return (last 20 episodes)")
    axes[0].set_title(f"A2C on CartPole-v1, mean ± s.e. over {len(seeds)} seed(s)")
    axes[1].set_ylabel("explained variance of the critic")
    axes[1].set_ylim(-0.5, 1.05)
    axes[1].set_title("how well V tracks its λ-return targets")
    for ax in axes:
        ax.set_xlabel("environment steps")
        ax.legend()
    plt.tight_layout()
    return fig


def mean_se(v) -> str:
    """``"mean ± standard error"`` of a list of per-seed numbers (the error is 0 for one seed)."""
    v = np.asarray(v, dtype=float)
    return f"{v.mean():6.1f} ± {v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0:5.1f}"


def print_lambda_table(curves: dict, lambdas: Sequence[float], seeds: Sequence[int]) -> None:
    """Per λ: the training return averaged over the whole run and over its last 10 %, mean ± s.e. over seeds."""
    print(f"{'λ':>6s} {'mean return over training':>27s} {'last 10% of training':>22s}   (mean ± s.e. over seeds)")
    for lam in lambdas:
        rets = [np.asarray(curves[lam, s]["train_return"], dtype=float) for s in seeds]
        whole = [np.nanmean(r) for r in rets]
        last = [np.nanmean(r[-max(1, len(r) // 10):]) for r in rets]
        print(f"{lam:6.2f} {mean_se(whole):>27s} {mean_se(last):>22s}")
