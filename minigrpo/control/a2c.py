"""Advantage actor-critic (A2C, the synchronous form of Mnih et al. 2016's A3C) with GAE.

Per iteration: one rollout, GAE advantages, then a single gradient step on
``reinforce_loss(log π, A) − ent_coef · entropy + vf_coef · value_loss``. It is REINFORCE with the
Monte-Carlo return replaced by a critic-based advantage: lesson 02's trainer, and the baseline
that TRPO and PPO improve on by bounding the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minigrpo.infra.checks import non_negative, positive
from minigrpo.control.agents import ActorCritic
from minigrpo.control.onpolicy import OnPolicyConfig, Rollout, TrainResult, normalize, run_on_policy
from minigrpo.losses import reinforce_loss, value_loss


@dataclass
class A2CConfig(OnPolicyConfig):
    """A2C's knobs (on top of OnPolicyConfig; ``norm_adv`` standardises the advantages over the batch)."""

    num_steps: int = 16  #: short rollouts: one gradient step per rollout
    learning_rate: float = 1e-3  #: Adam step size
    ent_coef: float = 0.01  #: weight of the entropy bonus
    vf_coef: float = 0.5  #: weight of the value loss
    max_grad_norm: float = 0.5  #: global gradient-norm clip

    def __post_init__(self):
        super().__post_init__()
        positive(self, "learning_rate")
        non_negative(self, "ent_coef", "vf_coef")
        positive(self, "max_grad_norm", finite=False)  # inf: no clipping


def make_a2c_update(cfg: A2CConfig):
    def factory(agent: ActorCritic):
        opt = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate)

        def update(agent: ActorCritic, ro: Rollout, adv: torch.Tensor, returns: torch.Tensor, it: int) -> dict:
            obs = ro.obs.reshape(-1, ro.obs.shape[-1])
            actions = ro.actions.reshape(-1, *ro.actions.shape[2:])
            a = adv.reshape(-1)
            if cfg.norm_adv:
                a = normalize(a)
            dist = agent.dist(obs)
            pg_loss = reinforce_loss(dist.log_prob(actions), a)
            v_loss = value_loss(agent.value(obs), returns.reshape(-1))
            entropy = dist.entropy().mean()
            loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
            opt.step()
            return {"policy_loss": pg_loss.item(), "value_loss": v_loss.item(), "entropy": entropy.item()}

        return update

    return factory


def train_a2c(config: A2CConfig | None = None, progress: bool = True) -> TrainResult:
    """Train an ActorCritic with A2C + GAE. History: the shared keys of ``run_on_policy`` plus
    policy_loss, value_loss, entropy, explained_variance."""
    cfg = config or A2CConfig()
    return run_on_policy(cfg, "A2C", make_a2c_update(cfg), progress)
