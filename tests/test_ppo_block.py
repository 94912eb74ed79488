"""PPO's update as one block (``minigrpo.control.ppo.ppo_epochs``) takes exactly the steps of the two-function
version it replaced (``ppo_loss`` + ``ppo_epochs``, frozen below as they were on 2026-11-28): the same parameters,
optimizer state, random state and metrics, bit for bit."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from minigrpo.control.agents import ActorCritic
from minigrpo.control.onpolicy import normalize
from minigrpo.control.ppo import PPOConfig, ppo_epochs
from minigrpo.infra.distributed import Distributed
from minigrpo.losses import clipped_surrogate_loss, value_loss


# --------------------------------------------------------------------------- the frozen reference (do not edit)
def _reference_ppo_loss(cfg, agent, mb, clip, ranks=None):
    obs, actions, old_logp, adv, ret, old_values = mb
    dist = agent.dist(obs)
    logp = dist.log_prob(actions)
    if cfg.norm_adv:
        adv = normalize(adv, ranks)
    pg_loss, stats = clipped_surrogate_loss(logp, old_logp, adv, clip)
    v_loss = value_loss(agent.value(obs), ret, old_values, clip if cfg.clip_vloss else None)
    loss = pg_loss + cfg.vf_coef * v_loss
    if cfg.ent_coef:
        entropy = dist.entropy().mean()
        loss = loss - cfg.ent_coef * entropy
    else:  # keep it out of the graph: it is only logged
        with torch.no_grad():
            entropy = dist.entropy().mean()
    return loss, {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy, **stats}


def _reference_ppo_epochs(cfg, agent, opt, batch, clip, ranks=None):
    ranks = ranks or Distributed()
    n = batch[0].shape[0]
    mb_size = n // cfg.num_minibatches
    clip_fracs, stopped_early = [], False
    for epoch in range(1, cfg.update_epochs + 1):
        perm = torch.randperm(n)
        for start in range(0, n, mb_size):
            idx = perm[start: start + mb_size]
            loss, m = _reference_ppo_loss(cfg, agent, [x[idx] for x in batch], clip, ranks)
            opt.zero_grad()
            (loss / ranks.world_size if ranks.active else loss).backward()  # the global mean: the ranks' mean
            ranks.sum_gradients(agent)
            torch.nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
            opt.step()
            clip_fracs.append(m["clip_frac"])
        if cfg.target_kl is not None and ranks.sum(m["approx_kl"]) / ranks.world_size > cfg.target_kl:  # all agree
            stopped_early = True
            break
    return {"policy_loss": m["policy_loss"].item(), "value_loss": m["value_loss"].item(),
            "entropy": m["entropy"].item(), "approx_kl": m["approx_kl"], "clip_frac": float(np.mean(clip_fracs)),
            "ratio_max": m["ratio_max"], "ratio_min": m["ratio_min"], "epochs_run": epoch,
            "stopped_early": float(stopped_early)}


# --------------------------------------------------------------------------- the comparison
SPACES = {"discrete": gym.spaces.Discrete(3), "continuous": gym.spaces.Box(-2.0, 2.0, (2,))}
CASES = {  # PPOConfig fields on top of the defaults (norm_adv, clip_vloss, ent_coef 0.01, no target_kl, 4 x 4)
    "defaults": {},
    "no norm_adv": dict(norm_adv=False),
    "no clip_vloss": dict(clip_vloss=False),
    "ent_coef 0": dict(ent_coef=0.0),
    "target_kl": dict(target_kl=1e-4),  # stops after the first epoch
    "target_kl not reached": dict(target_kl=10.0),
    "everything off, 1 minibatch": dict(norm_adv=False, clip_vloss=False, ent_coef=0.0, num_minibatches=1,
                                        update_epochs=3, max_grad_norm=float("inf")),
    "uneven minibatches": dict(num_minibatches=3, num_envs=1, num_steps=48, update_epochs=2),  # 50: 16, 16, 16, 2
}


def _setup(kind: str, fields: dict):
    cfg = dataclasses.replace(PPOConfig(), **fields) if fields else PPOConfig()
    torch.manual_seed(0)
    agent = ActorCritic(gym.spaces.Box(-5.0, 5.0, (4,)), SPACES[kind], (16,))
    opt = torch.optim.Adam(agent.parameters(), lr=3e-3, eps=1e-5, foreach=True)
    g = torch.Generator().manual_seed(1)
    n = 50 if fields.get("num_minibatches") == 3 else 64
    obs = torch.randn(n, 4, generator=g)
    with torch.no_grad():
        actions = agent.dist(obs).sample()
        old_logp = agent.dist(obs).log_prob(actions) + 0.3 * torch.randn(n, generator=g)  # ratios away from 1
        values = agent.value(obs) + 0.5 * torch.randn(n, generator=g)
    adv = 2 + 3 * torch.randn(n, generator=g)
    return cfg, agent, opt, [obs, actions, old_logp, adv, values + adv, values]


def _run(update, kind: str, fields: dict):
    cfg, agent, opt, batch = _setup(kind, fields)
    torch.manual_seed(123)  # the minibatch shuffles
    metrics = update(cfg, agent, opt, batch, 0.2)
    return metrics, agent, opt, torch.get_rng_state()


def _same_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("kind", sorted(SPACES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_ppo_epochs_takes_the_steps_of_the_frozen_two_function_version(kind, case):
    got_metrics, got_agent, got_opt, got_rng = _run(ppo_epochs, kind, CASES[case])
    ref_metrics, ref_agent, ref_opt, ref_rng = _run(_reference_ppo_epochs, kind, CASES[case])
    assert got_metrics == ref_metrics  # every value equal, the same keys in the same order
    assert list(got_metrics) == list(ref_metrics)
    assert all(torch.equal(a, b) for a, b in zip(got_agent.state_dict().values(), ref_agent.state_dict().values()))
    assert _same_state(got_opt.state_dict(), ref_opt.state_dict())
    assert torch.equal(got_rng, ref_rng)
    if case == "target_kl":
        assert got_metrics["epochs_run"] == 1 and got_metrics["stopped_early"] == 1.0
    else:
        assert got_metrics["stopped_early"] == 0.0 and got_metrics["clip_frac"] > 0  # the clip acted


def test_train_ppo_gives_the_history_of_the_frozen_version(monkeypatch):
    """A short CartPole run (its preset, 1,600 env steps, two evaluations): the history (times apart) and the final
    parameters are those of a run whose update is the frozen version."""
    import minigrpo.control.ppo as ppo
    from minigrpo.control.ppo import PRESETS, train_ppo

    cfg = dict(PRESETS["CartPole-v1"], total_timesteps=1600, eval_every_steps=800, eval_episodes=2)
    got = train_ppo(PPOConfig(**cfg), progress=False)
    monkeypatch.setattr(ppo, "ppo_epochs", _reference_ppo_epochs)
    ref = train_ppo(PPOConfig(**cfg), progress=False)
    untimed = lambda h: {k: [repr(x) for x in v] for k, v in h.items() if k not in ("seconds", "sps")}  # NaN == NaN
    assert untimed(got.history) == untimed(ref.history)
    assert all(torch.equal(a, b) for a, b in zip(got.agent.state_dict().values(), ref.agent.state_dict().values()))
