"""PPO-Penalty: the PPO paper's second variant (Schulman et al. 2017, section 4), an adaptive KL penalty
instead of the clip.

Each minibatch step minimises ``−mean(r · A) + β · KL + vf_coef · value_loss − ent_coef · entropy``, the KL
being the k3 estimate of KL(π_old ‖ π_θ) on the minibatch's samples (the paper uses the exact per-state KL;
k3 is its unbiased sample estimate and needs only the stored log-probs). After the epochs the KL ``d`` of
the whole batch is measured and β adapts so that ``d`` stays near ``kl_target``:
``d < kl_target / 1.5 → β / 2`` and ``d > 1.5 · kl_target → β · 2`` (the paper's constants).
Everything else (rollouts, GAE, minibatches, learning-rate annealing) is :mod:`minigrpo.control.ppo`'s.
History adds ``kl_coef`` (β used during the iteration) and ``kl`` (d after it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minigrpo.infra.checks import positive
from minigrpo.control.agents import ActorCritic
from minigrpo.control.onpolicy import Rollout, TrainResult, normalize, run_on_policy
from minigrpo.control.ppo import PPOConfig, _flat, _schedule
from minigrpo.losses import kl_estimate, value_loss


@dataclass
class PPOPenaltyConfig(PPOConfig):
    """PPOConfig plus the adaptive KL penalty; ``clip_coef`` is then used only by value clipping
    (``clip_vloss``) and ``target_kl`` still stops the epochs early if set."""

    kl_coef: float = 1.0  #: initial β, the weight of the KL penalty (the paper starts at 1)
    kl_target: float = 0.01  #: d_targ, the KL per iteration β is adapted towards

    def __post_init__(self):
        super().__post_init__()
        positive(self, "kl_coef", "kl_target")


def adaptive_kl_coef(kl_coef: float, kl: float, kl_target: float) -> float:
    """The paper's β update after an iteration whose measured KL is ``kl``: halve β if ``kl`` is below
    ``kl_target / 1.5``, double it if above ``1.5 · kl_target``, else keep it."""
    if not np.isfinite(kl) or kl < 0:
        raise ValueError(f"kl must be a finite, non-negative number, got {kl}")
    if kl < kl_target / 1.5:
        return kl_coef / 2
    if kl > kl_target * 1.5:
        return kl_coef * 2
    return kl_coef


def penalty_loss(cfg: PPOPenaltyConfig, agent: ActorCritic, mb: list[torch.Tensor], kl_coef: float,
                 clip: float) -> tuple[torch.Tensor, dict]:
    """Loss of one minibatch ``(obs, actions, old_logp, advantages, returns, old_values)``:
    ``−mean(r·A) + β·k3 + vf_coef·value_loss − ent_coef·entropy``, and its parts."""
    obs, actions, old_logp, adv, ret, old_values = mb
    dist = agent.dist(obs)
    logp = dist.log_prob(actions)
    adv = normalize(adv) if cfg.norm_adv else adv
    kl = kl_estimate(old_logp, logp, "k3").mean()         # KL(π_old ‖ π_θ) from samples of π_old
    pg_loss = -(torch.exp(logp - old_logp) * adv).mean()
    v_loss = value_loss(agent.value(obs), ret, old_values, clip if cfg.clip_vloss else None)
    entropy = dist.entropy().mean()
    loss = pg_loss + kl_coef * kl + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
    return loss, {"policy_loss": pg_loss.item(), "value_loss": v_loss.item(), "entropy": entropy.item(),
                  "approx_kl": kl.item()}


def make_ppo_penalty_update(cfg: PPOPenaltyConfig):
    """``factory(agent) -> update`` for :func:`run_on_policy`: PPO's epochs on the penalised loss, then β adapts."""
    def factory(agent: ActorCritic):
        opt = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5, foreach=True)
        state = {"kl_coef": cfg.kl_coef}

        def update(agent: ActorCritic, ro: Rollout, adv: torch.Tensor, returns: torch.Tensor, it: int) -> dict:
            lr, clip = _schedule(cfg, it)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = [_flat(x) for x in (ro.obs, ro.actions, ro.logp, adv, returns, ro.values)]
            n, beta = batch[0].shape[0], state["kl_coef"]
            for epoch in range(1, cfg.update_epochs + 1):
                for idx in torch.randperm(n).chunk(cfg.num_minibatches):
                    loss, m = penalty_loss(cfg, agent, [x[idx] for x in batch], beta, clip)
                    opt.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
                    opt.step()
                if cfg.target_kl is not None and m["approx_kl"] > cfg.target_kl:
                    break
            with torch.no_grad():                               # d: the KL of the whole batch after the epochs
                kl = kl_estimate(batch[2], agent.dist(batch[0]).log_prob(batch[1]), "k3").mean().item()
            state["kl_coef"] = adaptive_kl_coef(beta, kl, cfg.kl_target)
            return {**m, "kl": kl, "kl_coef": beta, "learning_rate": lr, "epochs_run": epoch}

        update.state_dict = lambda: {"opt": opt.state_dict(), "kl_coef": state["kl_coef"]}
        update.load_state_dict = lambda s: (opt.load_state_dict(s["opt"]), state.update(kl_coef=s["kl_coef"]))
        return update

    return factory


def train_ppo_penalty(config: PPOPenaltyConfig | None = None, progress: bool = True) -> TrainResult:
    """Train an ActorCritic with PPO-Penalty (adaptive KL coefficient, no clipped surrogate)."""
    cfg = config or PPOPenaltyConfig()
    return run_on_policy(cfg, "PPO-Penalty", make_ppo_penalty_update(cfg), progress)
