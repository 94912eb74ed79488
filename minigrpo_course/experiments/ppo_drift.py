"""Lesson 04's measurements of how far a policy drifts from the π_old that sampled its data.

Three experiments on one idea, the clip is centred on π_old:

* :func:`scan_gradient_direction`: L^IS and L^CLIP along the batch's policy gradient (section 2);
* :func:`epoch_drift`: K epochs of PPO's policy update on one fixed batch, the ratio measured after each
  epoch (section 4);
* :func:`make_stale_update` / :func:`run_stale`: PPO trained on a rollout k iterations old, and how much of
  an old rollout the clip has already switched off when it arrives (section 7).

The printing and plotting helpers next to them keep the lesson's cells short; they print exactly what the
cells printed before they moved here.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from minigrpo.control.ppo import make_ppo_update
from minigrpo_course.experiments.ppo_ablations import surrogate_terms
from minigrpo.losses import clipped_surrogate_loss, kl_estimate


def _normalise(adv: torch.Tensor) -> torch.Tensor:
    return (adv - adv.mean()) / (adv.std() + 1e-8)


def scan_gradient_direction(agent, obs: torch.Tensor, actions: torch.Tensor, old_logp: torch.Tensor,
                            adv: torch.Tensor, alphas: torch.Tensor, eps: float = 0.2):
    """Move the actor's parameters by ``α · d`` for each α, ``d`` the unit gradient of L^IS at θ_old.

    ``adv`` are the (normalised) advantages of the samples; the agent itself is not changed (a deep copy is
    moved). Returns five lists, one entry per α: L^IS, L^CLIP (at ``eps``), the k3 estimate of
    KL(π_old ‖ π_θ) from the samples of π_old, and the per-sample ``min(rA, clip(r)A)`` terms and their
    :func:`~minigrpo_course.experiments.ppo_ablations.clip_sides` labels (numpy arrays)."""
    params = list(agent.actor.parameters())
    theta0 = torch.nn.utils.parameters_to_vector(params).detach().clone()
    surr = (torch.exp(agent.dist(obs).log_prob(actions) - old_logp) * adv).mean()
    direction = torch.nn.utils.parameters_to_vector(torch.autograd.grad(surr, params)).detach()
    direction /= direction.norm()

    probe = copy.deepcopy(agent)
    L_is, L_clip, kl, terms, sides = [], [], [], [], []
    with torch.no_grad():
        for a in alphas:
            torch.nn.utils.vector_to_parameters(theta0 + a * direction, probe.actor.parameters())
            logp = probe.dist(obs).log_prob(actions)
            L_is.append((torch.exp(logp - old_logp) * adv).mean().item())
            L_clip.append(-clipped_surrogate_loss(logp, old_logp, adv, eps)[0].item())
            kl.append(kl_estimate(old_logp, logp, "k3").mean().item())   # KL(π_old ‖ π_θ), samples of π_old
            t, s = surrogate_terms(logp, old_logp, adv, eps)
            terms.append(t.numpy()); sides.append(s.numpy())
    return L_is, L_clip, kl, terms, sides


def epoch_drift(agent, obs: torch.Tensor, actions: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                eps: float | None, epochs: int, lr: float = 1e-3, minibatches: int = 4, seed: int = 1) -> list[dict]:
    """``epochs`` epochs of PPO's policy update (Adam on the actor, advantages standardised per minibatch) on
    one fixed batch, from a copy of ``agent``; ``eps=None`` maximises the unclipped L^IS instead.

    After each epoch, over the whole batch (advantages standardised over it): the clip fraction (at ε = 0.2
    for the unclipped run), the approx KL, the largest ``|log r|`` and every ``log r``. One dict per epoch."""
    if epochs < 1 or minibatches < 1:
        raise ValueError(f"epochs and minibatches must be at least 1, got {epochs} and {minibatches}")
    torch.manual_seed(seed)
    agent = copy.deepcopy(agent)
    opt = torch.optim.Adam(agent.actor.parameters(), lr=lr, eps=1e-5)
    adv_n, rows = _normalise(adv), []
    for epoch in range(1, epochs + 1):
        for idx in torch.randperm(len(obs)).chunk(minibatches):
            a = _normalise(adv[idx])
            logp = agent.dist(obs[idx]).log_prob(actions[idx])
            if eps is None:
                loss = -(torch.exp(logp - old_logp[idx]) * a).mean()
            else:
                loss, _ = clipped_surrogate_loss(logp, old_logp[idx], a, eps)
            opt.zero_grad(); loss.backward(); opt.step()
        with torch.no_grad():
            logp = agent.dist(obs).log_prob(actions)
        _, st = clipped_surrogate_loss(logp, old_logp, adv_n, eps or 0.2)
        log_r = logp - old_logp
        rows.append({"epoch": epoch, "clip_frac": st["clip_frac"], "approx_kl": st["approx_kl"],
                     "max_abs_log_r": log_r.abs().max().item(), "log_r": log_r})
    return rows


#: The rows of :func:`print_drift_table`: key, title, number format.
DRIFT_ROWS = (("clip_frac", "clip fraction", "9.3f"), ("approx_kl", "approx KL", "9.4f"),
              ("max_abs_log_r", "max |log r|", "9.2f"))


def print_drift_table(drifts: dict[str, list[dict]], shown: Iterable[int]) -> None:
    """Three small tables (clip fraction, approx KL, max |log r|): one row per setting, one column per epoch."""
    shown = list(shown)
    for key, title, f in DRIFT_ROWS:
        print(f"{title:14}" + "".join(f"{'epoch ' + str(e):>9}" for e in shown))
        for name, rows in drifts.items():
            print(f"  {name:12}" + "".join(format(rows[e - 1][key], f) for e in shown))
        print()


def plot_drift(drifts: dict[str, list[dict]], eps_lines: Sequence[float] = (0.1, 0.2, 0.3)):
    """Clip fraction, approx KL and largest |log r| against the epoch, one line per setting; returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for name, rows in drifts.items():
        ep = [r["epoch"] for r in rows]
        style = "--" if name == "no clip" else "-"
        for ax, (key, _, _) in zip(axes, DRIFT_ROWS):
            ax.plot(ep, [r[key] for r in rows], style, marker=".", label=name)
    axes[0].set(xlabel="epochs over the same batch", ylabel="share of samples", title="clip fraction")
    axes[1].set(xlabel="epochs over the same batch", ylabel="nats", title="approx KL(π_old ‖ π_θ), k3", yscale="log")
    axes[2].set(xlabel="epochs over the same batch", ylabel="|log r|", title="largest |log ratio| in the batch",
                yscale="log")
    for i, eps in enumerate(eps_lines):
        axes[2].axhline(np.log(1 + eps), color="gray", lw=0.7, ls=":",
                        label=f"log(1 + ε), ε = {', '.join(map(str, eps_lines))}" if i == 0 else None)
    axes[0].legend(); axes[2].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def on_arrival(agent, ro, adv: torch.Tensor, eps_grid: Iterable[float]) -> tuple[float, dict[float, float]]:
    """Mean ``|log r|`` of a stored rollout under the agent's current policy, and for each ε the share of its
    samples already clipped before any step (``A > 0, r > 1 + ε`` or ``A < 0, r < 1 − ε``: gradient 0)."""
    with torch.no_grad():
        log_r = agent.dist(ro.obs).log_prob(ro.actions) - ro.logp
    r = log_r.exp()
    dead = {eps: (((adv > 0) & (r > 1 + eps)) | ((adv < 0) & (r < 1 - eps))).float().mean().item() for eps in eps_grid}
    return log_r.abs().mean().item(), dead


def make_stale_update(cfg, k: int, probe_ks: Sequence[int] = (), eps_grid: Sequence[float] = ()):
    """A ``make_update`` for :func:`~minigrpo.control.onpolicy.run_on_policy`: PPO's own update
    (:func:`~minigrpo.control.ppo.make_ppo_update`), fed the rollout collected ``k`` iterations earlier
    (the oldest one kept while fewer exist) with its stored log-probs, advantages and returns.

    For each ``j`` in ``probe_ks`` it also logs, before the update, :func:`on_arrival` of the rollout ``j``
    iterations old as ``probe_logr_{j}`` and ``probe_clip_{j}_{ε}`` (``nan`` until that rollout exists)."""
    if k < 0:
        raise ValueError(f"k (the age of the data in iterations) must be ≥ 0, got {k}")
    inner_factory = make_ppo_update(cfg)

    def factory(agent):
        inner = inner_factory(agent)
        buffer = collections.deque(maxlen=max(k, max(probe_ks, default=0)) + 1)

        def update(agent, ro, adv, returns, it):
            buffer.append((ro, adv, returns))
            probes = {}
            for j in probe_ks:
                if len(buffer) > j:                          # measured before this iteration's update
                    abs_log_r, dead = on_arrival(agent, *buffer[-1 - j][:2], eps_grid)
                    probes[f"probe_logr_{j}"] = abs_log_r
                    probes.update({f"probe_clip_{j}_{e}": v for e, v in dead.items()})
                else:
                    probes[f"probe_logr_{j}"] = np.nan
                    probes.update({f"probe_clip_{j}_{e}": np.nan for e in eps_grid})
            old_ro, old_adv, old_returns = buffer[-1 - k] if len(buffer) > k else buffer[0]
            metrics = inner(agent, old_ro, old_adv, old_returns, it)  # PPO's update on data k iterations old
            metrics.update(probes)
            return metrics
        return update
    return factory


def run_stale(config: dict, staleness: Iterable[int], seeds: Iterable[int], probe_ks: Sequence[int],
              eps_grid: Sequence[float], progress: bool = False) -> dict:
    """``{(k, seed): TrainResult}``: PPO on data ``k`` iterations old for each ``k`` and seed (``config``: the
    PPOConfig fields); the ``k = 0`` runs also carry the probes of :func:`make_stale_update`."""
    from minigrpo.control import PPOConfig
    from minigrpo.control.onpolicy import run_on_policy

    seeds, runs = list(seeds), {}
    for k in staleness:
        for seed in seeds:
            cfg = PPOConfig(**{**config, "seed": seed})
            update = make_stale_update(cfg, k, probe_ks if k == 0 else (), eps_grid)
            runs[k, seed] = run_on_policy(cfg, f"PPO, data {k} iterations old", update, progress=progress)
    return runs


def probe_mean(histories: Iterable[dict], key: str) -> float:
    """Mean of one probe key over every iteration of the given histories, ignoring the ``nan`` entries."""
    return float(np.nanmean(np.concatenate([np.array(h[key], dtype=float) for h in histories])))


def print_stale_summary(runs: dict, staleness: Iterable[int], seeds: Sequence[int], probe_ks: Iterable[int],
                        eps_grid: Sequence[float]) -> None:
    """The two tables of section 7: final training return per age ``k`` and seed, then the probes of the
    ``k = 0`` runs (mean |log r| and clip fraction on arrival per ε) per rollout age ``j``."""
    print("training on data k iterations old: training return (last 20 episodes) at the end, per seed")
    for k in staleness:
        finals = [runs[k, s].history["train_return"][-1] for s in seeds]
        print(f"  k = {k:>2}: " + ", ".join(f"{f:5.0f}" for f in finals) + f"   (mean {np.mean(finals):.0f})")

    hists = [runs[0, s].history for s in seeds]
    print("\nduring ordinary PPO (k = 0): a rollout j iterations old, seen by the current policy")
    print(f"  {'j':>3} {'mean |log r|':>13}   clip fraction on arrival, ε = " + ", ".join(str(e) for e in eps_grid))
    for j in probe_ks:
        print(f"  {j:>3} {probe_mean(hists, f'probe_logr_{j}'):13.3f}   " +
              "   ".join(f"{probe_mean(hists, f'probe_clip_{j}_{e}'):.3f}" for e in eps_grid))
