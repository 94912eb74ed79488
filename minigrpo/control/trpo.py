"""TRPO (Schulman et al. 2015): the largest policy step whose mean KL stays within δ.

Per iteration: one rollout and GAE; then one policy step
1. g = ∇θ of the surrogate L(θ) = mean(π_θ(a|s)/π_old(a|s) · A) at θ_old (the policy gradient);
2. x ≈ F⁻¹g by conjugate gradient with Fisher-vector products (``minigrpo.trust_region``);
3. scale to the trust-region boundary: step = sqrt(2δ / xᵀFx) · x, so ½ stepᵀ F step = δ;
4. backtracking line search: accept the largest 2⁻ᵏ·step that improves L and keeps KL ≤ δ;
and ``vf_iters`` epochs of Adam on the value function. References: the paper's appendix C and
OpenAI Spinning Up's TRPO page.

Metrics: ``kl`` (measured mean KL of the accepted step, ≤ ``max_kl`` by construction),
``step_fraction`` (1 = the full quadratic-model step was accepted; 0 = rejected), ``improvement``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributions import kl_divergence

from minigrpo.infra.checks import at_least, non_negative, positive
from minigrpo.control.agents import ActorCritic
from minigrpo.control.onpolicy import OnPolicyConfig, Rollout, TrainResult, fit_value, normalize, run_on_policy
from minigrpo.trust_region import (backtracking_line_search, conjugate_gradient, fisher_vector_product, flat_grad,
                                   trust_region_step)


@dataclass
class TRPOConfig(OnPolicyConfig):
    """TRPO's knobs (on top of OnPolicyConfig; ``norm_adv`` standardises the advantages over the batch)."""

    num_steps: int = 256  #: steps per env per rollout (TRPO likes larger batches than PPO)
    max_kl: float = 0.01  #: δ, the trust-region radius in mean KL
    cg_iters: int = 10  #: conjugate-gradient iterations
    damping: float = 0.1  #: added to the Fisher matrix for a well-conditioned solve
    backtrack_iters: int = 10  #: line-search halvings before giving up
    vf_lr: float = 1e-3  #: Adam step size of the value function
    vf_iters: int = 5  #: epochs of value regression per iteration
    vf_minibatches: int = 4  #: minibatches per value epoch

    def __post_init__(self):
        super().__post_init__()
        at_least(self, 1, "cg_iters", "backtrack_iters", "vf_iters", "vf_minibatches")
        positive(self, "max_kl", "vf_lr")
        non_negative(self, "damping")


def trpo_policy_step(cfg: TRPOConfig, agent: ActorCritic, obs: torch.Tensor, actions: torch.Tensor,
                     old_logp: torch.Tensor, adv: torch.Tensor) -> dict[str, float]:
    """Steps 1–4 of the module docstring on a flat batch; changes the actor in place and returns its metrics."""
    params = list(agent.actor_parameters())
    with torch.no_grad():
        old_dist = agent.dist(obs)

    def surrogate() -> torch.Tensor:
        return (torch.exp(agent.dist(obs).log_prob(actions) - old_logp) * adv).mean()

    def mean_kl() -> torch.Tensor:
        return kl_divergence(old_dist, agent.dist(obs)).mean()

    g = flat_grad(surrogate(), params)
    fvp = fisher_vector_product(mean_kl, params, cfg.damping)
    x = conjugate_gradient(fvp, g, cfg.cg_iters)  # the exercise swaps in the learner's CG here
    full_step = trust_region_step(fvp, x, cfg.max_kl)
    with torch.no_grad():
        before = surrogate().item()
        accepted, fraction = backtracking_line_search(
            lambda: surrogate().item(), lambda: mean_kl().item(), params, full_step,
            expected_improvement=(g @ full_step).item(), max_kl=cfg.max_kl, max_backtracks=cfg.backtrack_iters)
        kl, after = mean_kl().item(), surrogate().item()
        entropy = agent.dist(obs).entropy().mean().item()
    return {"kl": kl, "step_fraction": fraction, "accepted": float(accepted), "improvement": after - before,
            "entropy": entropy, "grad_norm": g.norm().item()}


def make_trpo_update(cfg: TRPOConfig):
    """``factory(agent) -> update``, the TRPO update that :func:`run_on_policy` calls once per rollout."""
    def factory(agent: ActorCritic):
        vopt = torch.optim.Adam(agent.critic.parameters(), lr=cfg.vf_lr)

        def update(agent: ActorCritic, ro: Rollout, adv: torch.Tensor, returns: torch.Tensor, it: int) -> dict:
            obs = ro.obs.reshape(-1, ro.obs.shape[-1])
            a = normalize(adv.reshape(-1)) if cfg.norm_adv else adv.reshape(-1)
            metrics = trpo_policy_step(cfg, agent, obs, ro.actions.reshape(-1, *ro.actions.shape[2:]),
                                       ro.logp.reshape(-1), a)
            v_loss = fit_value(agent.critic, vopt, obs, returns.reshape(-1), cfg.vf_iters, cfg.vf_minibatches)
            grad_norm = metrics.pop("grad_norm")
            return {**metrics, "value_loss": v_loss, "grad_norm": grad_norm}

        return update

    return factory


def train_trpo(config: TRPOConfig | None = None, progress: bool = True) -> TrainResult:
    """Train an ActorCritic with TRPO. History: the shared keys of ``run_on_policy`` plus kl,
    step_fraction, accepted, improvement, entropy, value_loss, grad_norm, explained_variance."""
    cfg = config or TRPOConfig()
    return run_on_policy(cfg, "TRPO", make_trpo_update(cfg), progress)
