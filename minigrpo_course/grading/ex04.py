"""Exercise 04 — PPO: the clipped surrogate loss, the clip fraction, the k3 estimate of KL, and a complete
PPO update (epochs of shuffled minibatches, early stopping at target_kl) graded by training CartPole."""

from __future__ import annotations

import math
from functools import partial

import gymnasium as gym
import torch

from minigrpo.control.agents import ActorCritic
from minigrpo.control.onpolicy import RolloutCollector, make_vec_env, normalize, run_on_policy
from minigrpo.control.ppo import PPOConfig, ppo_epochs
from minigrpo_course.grading.core import (IN_PLACE_HINT, Call, Case, Item, Made, Spread, WrongAnswer, checked_by,
                                          grads, with_ratios)
from minigrpo.losses import clipped_surrogate_loss as _package_loss
from minigrpo.losses import value_loss
from minigrpo.infra.tracking import rng_state, set_rng_state
from minigrpo.utils import torch_threads

TITLE = "PPO"

# --------------------------------------------------------------------------- references


def reference_loss(logp, old_logp, advantages, clip_eps):
    """The package's loss without its statistics: −mean(min(r·A, clip(r, 1 ± ε)·A))."""
    return _package_loss(logp, old_logp, advantages, clip_eps)[0]


def reference_clip_fraction(logp, old_logp, advantages, clip_eps):
    """Share of samples whose gradient the clip removed: (A > 0, r > 1 + ε) or (A < 0, r < 1 − ε)."""
    if logp.shape != old_logp.shape or logp.shape != advantages.shape:
        raise ValueError("logp, old_logp and advantages must have the same shape")
    ratio = torch.exp(logp.detach() - old_logp.detach())
    clipped = ((advantages > 0) & (ratio > 1 + clip_eps)) | ((advantages < 0) & (ratio < 1 - clip_eps))
    return clipped.double().mean()


def reference_approx_kl(logp, old_logp):
    """k3 estimate of KL(π_old ‖ π_θ) from actions sampled by π_old: mean((r − 1) − log r)."""
    if logp.shape != old_logp.shape:
        raise ValueError("logp and old_logp must have the same shape")
    log_ratio = (logp - old_logp).detach()
    return (torch.expm1(log_ratio) - log_ratio).mean()


# --------------------------------------------------------------------------- inputs (fresh each call)

_EPS = 0.2


#: one sample in each region of the (ratio, sign of A) plane, plus two inside the clip range
_REGIONS = (Spread(with_ratios, [-0.7, -1.2, -0.3, -2.0, -0.9, -1.5], ratios=[1.5, 0.5, 1.5, 0.5, 1.1, 0.9]),
            torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0, -2.0]))


def ppo_batch(seed: int, shape=(4, 16), spread: float = 0.4):
    """float64 logp, old_logp (log-ratios ~ N(0, spread²)) and advantages ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    logp = old + spread * torch.randn(shape, generator=g, dtype=torch.float64)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    return logp, old, adv


def log_prob_pair(seed: int, shape=(4, 16)):
    """The (logp, old_logp) of :func:`ppo_batch`."""
    return ppo_batch(seed, shape)[:2]


# --------------------------------------------------------------------------- 04.1 clipped_surrogate_loss


def _surrogate(logp, old_logp, adv, eps, *, ratio="exp", detach=True, pick=torch.min, clip="ratio"):
    """The clipped surrogate loss with one thing done wrong (each wrong answer below switches one knob)."""
    old = old_logp.detach() if detach else old_logp
    r = {"exp": torch.exp(logp - old), "quotient": logp / old, "difference": logp - old}[ratio]
    clipped = r * adv.clamp(1 - eps, 1 + eps) if clip == "advantage" else r.clamp(1 - eps, 1 + eps) * adv
    return -(clipped if pick is None else pick(r * adv, clipped)).mean()


_SHAPE_HINT = ("compare the three shapes and raise ValueError when they differ: [3] * [3, 1] would "
               "silently broadcast to a [3, 3] loss.")

_SAME = torch.tensor([-0.5, -1.0, -2.0])

LOSS_CASES = [
    Case("value: one sample in each clip region", (*_REGIONS, _EPS)),
    Case("gradient w.r.t. logp: 0 where clipped, −ratio·A/N elsewhere", (*_REGIONS, _EPS),
         call=grads("logp", value=False)),
    Case("no gradient flows into old_logp or the advantages", (*_REGIONS, _EPS),
         call=grads("old_logp", "advantages", value=False, requires_grad=("logp", "old_logp", "advantages")),
         hint="detach old_logp and the advantages: they are data from the rollout, not something to differentiate."),
    Case("ratio 1 gives the plain policy-gradient loss −mean(A)",
         (_SAME, _SAME, torch.tensor([1.0, 2.0, -1.0]), _EPS),
         call=grads("logp")),
    Case("a wider clip range, ε = 0.6", (*_REGIONS, 0.6), call=grads("logp")),
    Case("mismatched shapes are refused with a ValueError", (torch.zeros(3), torch.zeros(3), torch.ones(3, 1), _EPS),
         hint=_SHAPE_HINT),
    Case("a random [4, 16] float64 batch: value and gradient", (Spread(ppo_batch, 1), 0.2), call=grads("logp"),
         quick=False, rtol=1e-9, atol=1e-12),
    Case("a random [256] float64 batch with ε = 0.1", (Spread(ppo_batch, 5, shape=(256,)), 0.1), call=grads("logp"),
         quick=False, rtol=1e-9, atol=1e-12),
]

CLIPPED_SURROGATE_LOSS = Item(
    exercise="04", number=1, function="clipped_surrogate_loss", title="PPO's clipped surrogate loss",
    reference=reference_loss, cases=LOSS_CASES,
    wrong_answers=[
        WrongAnswer("max instead of min", partial(_surrogate, pick=torch.max),
                    "use the min of the two terms, not the max: PPO takes the pessimistic one, so "
                    "the clip can only remove an incentive, never add one."),
        WrongAnswer("clipped the advantage", partial(_surrogate, clip="advantage"),
                    "clip the ratio, not the advantage: the second term is clamp(ratio, 1 − ε, 1 + ε) · A."),
        WrongAnswer("clip only, no min", partial(_surrogate, pick=None),
                    "−clip(r)·A alone zeroes the gradient of every sample outside [1 − ε, 1 + ε], including "
                    "those whose move made things worse; take −min(r·A, clip(r)·A) so those keep their gradient."),
        WrongAnswer("ratio as a quotient of log-probs", partial(_surrogate, ratio="quotient"),
                    "the ratio is π/π_old = exp(logp − old_logp), not logp / old_logp."),
        WrongAnswer("ratio without exp", partial(_surrogate, ratio="difference"),
                    "logp − old_logp is the log of the ratio: take torch.exp of it (it is 0, not 1, "
                    "when the policies agree)."),
        WrongAnswer("old_logp not detached", partial(_surrogate, detach=False),
                    "gradient flows into old_logp: use old_logp.detach() in the ratio; π_old is a fixed "
                    "snapshot (the policy that sampled the data), not something to optimise."),
        WrongAnswer("sign", lambda *args: -reference_loss(*args),
                    "sign error: the objective min(r·A, clip(r)·A) is to be maximised, so the loss to "
                    "minimise is its negative mean."),
        WrongAnswer("sum", lambda *args: reference_loss(*args) * args[0].numel(),
                    "take the mean over samples, not the sum (a sum makes the step size grow with the batch)."),
    ],
)

# --------------------------------------------------------------------------- 04.2 ppo_clip_fraction


def _share(ratio, adv, eps):
    """The clip-fraction rule applied to a possibly wrong ratio or advantage sign."""
    return (((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))).double().mean()


CLIP_CASES = [
    Case("one sample in each clip region", (*_REGIONS, _EPS)),
    Case("zero advantages are never clipped; signs matter",
         (Spread(with_ratios, [-1.0] * 7, ratios=[1.5, 0.5, 2.0, 0.7, 1.3, 0.6, 1.05]),
          torch.tensor([0.5, -0.5, 0.0, -1.0, 1.0, 1.0, -1.0]), _EPS)),
    Case("nothing is clipped at ratio 1", (_SAME, _SAME, torch.tensor([1.0, -2.0, 3.0]), _EPS)),
    Case("mismatched shapes are refused with a ValueError", (torch.zeros(3), torch.zeros(3), torch.ones(3, 1), _EPS),
         hint=_SHAPE_HINT),
    Case("a random [4, 16] float64 batch", (Spread(ppo_batch, 1), 0.2), quick=False),
    Case("a random [512] float64 batch with ε = 0.1", (Spread(ppo_batch, 6, shape=(512,)), 0.1), quick=False),
]

PPO_CLIP_FRACTION = Item(
    exercise="04", number=2, function="ppo_clip_fraction", title="the share of samples the clip silenced",
    reference=reference_clip_fraction, cases=CLIP_CASES,
    wrong_answers=[
        WrongAnswer("|r − 1| > ε",
                    lambda logp, old, adv, eps: ((torch.exp(logp - old) - 1).abs() > eps).double().mean(),
                    "a ratio outside [1 − ε, 1 + ε] is clipped only if the advantage pushes it further out: "
                    "count r > 1 + ε with A > 0 and r < 1 − ε with A < 0; the other samples keep their gradient."),
        WrongAnswer("upper side only",
                    lambda logp, old, adv, eps: ((adv > 0) & (torch.exp(logp - old) > 1 + eps)).double().mean(),
                    "you counted only r > 1 + ε with A > 0; samples with A < 0 and r < 1 − ε are clipped too."),
        WrongAnswer("ratio as a quotient of log-probs",
                    checked_by(reference_clip_fraction, lambda logp, old, adv, eps: _share(logp / old, adv, eps)),
                    "the ratio is π/π_old = exp(logp − old_logp), not logp / old_logp (a quotient of two negative "
                    "log-probs, which is not a probability ratio at all)."),
        WrongAnswer("signs swapped", lambda logp, old, adv, eps: _share(torch.exp(logp - old), -adv, eps),
                    "the signs are swapped: with A > 0 the objective rewards a larger ratio, so the clip "
                    "acts above 1 + ε; with A < 0 it acts below 1 − ε."),
        WrongAnswer("a count",
                    lambda *args: reference_clip_fraction(*args) * args[0].numel(),
                    "return the share of samples (a number in [0, 1]), not their count."),
        WrongAnswer("ratio without exp", lambda logp, old, adv, eps: _share(logp - old, adv, eps),
                    "logp − old_logp is the log of the ratio: compare exp(logp − old_logp) with 1 ± ε."),
    ],
)

# --------------------------------------------------------------------------- 04.3 approx_kl


KL_CASES = [
    Case("hand-computable ratios", (Spread(with_ratios, [-1.0, -2.0, -0.5], ratios=[2.0, 0.4, 1.0]),)),
    Case("identical policies give 0", (torch.tensor([-0.3, -1.2, -2.5]), torch.tensor([-0.3, -1.2, -2.5]))),
    Case("ratios below 1 only", (Spread(with_ratios, [-0.5, -0.5], ratios=[0.5, 0.8]),)),
    Case("mismatched shapes are refused with a ValueError", (torch.zeros(3), torch.zeros(3, 1)),
         hint="compare logp.shape with old_logp.shape and raise ValueError when they differ."),
    Case("a random [4, 16] float64 batch", (Spread(log_prob_pair, 1),), quick=False, rtol=1e-9, atol=1e-12),
    Case("a random [1000] float64 batch", (Spread(log_prob_pair, 8, shape=(1000,)),), quick=False,
         rtol=1e-9, atol=1e-12),
]

APPROX_KL = Item(
    exercise="04", number=3, function="approx_kl", title="the k3 estimate of KL(π_old ‖ π_θ)",
    reference=reference_approx_kl, cases=KL_CASES,
    wrong_answers=[
        WrongAnswer("k1", lambda logp, old: (old - logp).mean(),
                    "this is k1 = mean(old_logp − logp): unbiased but noisy and negative for some "
                    "samples. k3 adds the zero-mean control variate (r − 1): mean((r − 1) − log r)."),
        WrongAnswer("k2", lambda logp, old: (0.5 * (logp - old) ** 2).mean(),
                    "this is k2 = ½·mean((log r)²), which is biased; k3 = mean((r − 1) − log r) is "
                    "unbiased and still non-negative."),
        WrongAnswer("direction", lambda logp, old: reference_approx_kl(old, logp),
                    "wrong direction: the actions were sampled by π_old, so with r = π_θ/π_old the k3 "
                    "estimate of KL(π_old ‖ π_θ) is (r − 1) − log r, not (1/r − 1) + log r."),
        WrongAnswer("sign",
                    lambda *args: -reference_approx_kl(*args),
                    "sign error: a KL divergence (and every k3 term) is ≥ 0."),
        WrongAnswer("sum",
                    lambda *args: reference_approx_kl(*args) * args[0].numel(),
                    "take the mean over samples, not the sum."),
    ],
)

# --------------------------------------------------------------------------- 04.4 ppo_update

#: what ppo_update returns, as ``minigrpo.control.ppo.ppo_epochs`` reports it: the policy loss, value loss,
#: entropy and approx_kl of the last minibatch (approx_kl at the parameters before its step), the clip fraction
#: averaged over every minibatch, and the number of optimizer steps taken
STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "num_steps")
#: torch's random generator is seeded with this before each call (and restored after), so that a learner who draws
#: ``torch.randperm(n)`` at the start of every epoch gets the reference's minibatches
GRADING_SEED = 2024


def _check_batch(cfg, batch) -> int:
    """The batch size, after refusing a batch that is not 6 tensors of one length divisible into minibatches."""
    if len(batch) != 6:
        raise ValueError("batch must be [obs, actions, old_logp, advantages, returns, old_values], "
                         f"got {len(batch)} tensors")
    n = batch[0].shape[0]
    if any(x.shape[0] != n for x in batch):
        raise ValueError(f"every tensor of batch needs the same first dimension, got {[x.shape[0] for x in batch]}")
    if n % cfg.num_minibatches:
        raise ValueError(f"num_minibatches ({cfg.num_minibatches}) must divide the batch size ({n})")
    return n


def reference_ppo_update(cfg, agent, optimizer, batch):
    """The package's update (``ppo_epochs`` with ε = cfg.clip_coef), returning :data:`STATS`."""
    _check_batch(cfg, batch)
    m = ppo_epochs(cfg, agent, optimizer, list(batch), cfg.clip_coef)
    return {**{k: m[k] for k in STATS[:-1]}, "num_steps": m["epochs_run"] * cfg.num_minibatches}


def _step(cfg, agent, optimizer, mb, k) -> dict:
    """One minibatch step of :func:`_update`; ``k`` holds its knobs."""
    obs, actions, old_logp, adv, returns, old_values = mb
    dist = agent.dist(obs)
    logp = dist.log_prob(actions)
    if cfg.norm_adv and k["norm"] == "minibatch":
        adv = normalize(adv)
    adv, eps = adv.detach(), cfg.clip_coef
    ratio = torch.exp(logp - (old_logp.detach() if k["detach"] else old_logp))
    surrogate = torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv) if k["clip"] else ratio * adv
    policy_loss = -k["sign"] * surrogate.mean()
    v_loss = value_loss(agent.value(obs), returns, old_values, eps if cfg.clip_vloss else None)
    entropy = dist.entropy().mean()
    loss = policy_loss + (cfg.vf_coef if k["vf_coef"] is None else k["vf_coef"]) * v_loss \
        + k["ent_sign"] * cfg.ent_coef * entropy
    if k["zero_grad"]:
        optimizer.zero_grad()
    loss.backward()
    if k["clip_grad"]:
        torch.nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
    optimizer.step()
    return {"policy_loss": policy_loss.item(), "value_loss": v_loss.item(), "entropy": entropy.item(),
            "approx_kl": float(reference_approx_kl(logp, old_logp)),
            "clip_frac": float(reference_clip_fraction(logp, old_logp, adv, eps))}


def _update(cfg, agent, optimizer, batch, *, shuffle="epoch", norm="minibatch", sign=1.0, clip=True, ent_sign=-1.0,
            vf_coef=None, clip_grad=True, zero_grad=True, kl="epoch", count="steps", detach=True, in_place=False):
    """ppo_update written out; each typical mistake below changes one knob (the defaults are right:
    the grader's tests check that this equals the reference)."""
    n = _check_batch(cfg, batch)
    k = dict(norm=norm, sign=sign, clip=clip, ent_sign=ent_sign, vf_coef=vf_coef, clip_grad=clip_grad,
             zero_grad=zero_grad, detach=detach)
    if in_place and cfg.norm_adv:  # "normalise once, up front" on the caller's tensor
        batch[3].sub_(batch[3].mean()).div_(batch[3].std() + 1e-8)
    if norm == "batch" and cfg.norm_adv:
        batch = [*batch[:3], normalize(batch[3]), *batch[4:]]
    size, steps, fracs = n // cfg.num_minibatches, 0, []
    order = torch.randperm(n) if shuffle == "once" else torch.arange(n)
    for epoch in range(1, cfg.update_epochs + 1):
        order = torch.randperm(n) if shuffle == "epoch" else order
        for start in range(0, n, size):
            mb = [x[order[start: start + size]] for x in batch]
            m = _step(cfg, agent, optimizer, mb, k)
            steps, fracs = steps + 1, fracs + [m["clip_frac"]]
            if kl == "minibatch" and cfg.target_kl is not None and m["approx_kl"] > cfg.target_kl:
                break
        else:
            measured = m["approx_kl"]
            if kl == "after":  # a fresh forward pass after the step
                with torch.no_grad():
                    measured = float(reference_approx_kl(agent.dist(mb[0]).log_prob(mb[1]), mb[2]))
            if kl in ("epoch", "after") and cfg.target_kl is not None and measured > cfg.target_kl:
                break
            continue
        break
    return {**m, "clip_frac": sum(fracs) / len(fracs), "num_steps": epoch if count == "epochs" else steps}


# --- what a case gives the update: a recording optimizer, a small float64 problem, a real CartPole rollout

class _Recorded:
    """Mixed into an optimizer: counts its steps and records which samples reached the policy (with grad
    enabled) before each one; equal to another of its kind with the same settings (so that a verdict's input
    line, run again, gives the same arguments)."""

    def record(self, agent: ActorCritic, obs: torch.Tensor) -> None:
        self.steps, self.visits, self._seen = 0, [], set()
        rows = {row.tobytes(): i for i, row in enumerate(obs.detach().cpu().numpy())}

        def hook(module, args):
            if torch.is_grad_enabled():
                self._seen.update(rows.get(r.tobytes(), -1) for r in args[0].detach().cpu().numpy())

        agent.actor.register_forward_pre_hook(hook)

    def step(self, closure=None):
        self.steps += 1
        self.visits.append(sorted(self._seen))
        self._seen = set()
        return super().step(closure)

    def __eq__(self, other):
        return type(other) is type(self) and self.defaults == other.defaults

    __hash__ = object.__hash__


class RecordingSGD(_Recorded, torch.optim.SGD):
    pass


class RecordingAdam(_Recorded, torch.optim.Adam):
    pass


def ppo_config(**fields) -> PPOConfig:
    """A PPOConfig for a grading case: ``fields`` on top of clip_coef 0.2, ent_coef 0.05, vf_coef 0.5, no value
    clipping, max_grad_norm inf (no clipping), norm_adv, no target_kl (and 8 envs × 8 steps = 64 samples)."""
    base = dict(num_envs=8, num_steps=8, clip_coef=0.2, clip_vloss=False, ent_coef=0.05, vf_coef=0.5,
                max_grad_norm=math.inf, norm_adv=True, target_kl=None)
    return PPOConfig(**{**base, **fields})


def ppo_problem(seed: int, n: int = 64, stale: float = 0.3, lr: float = 0.1, optimizer: str = "sgd",
                graph: bool = False):
    """``(agent, optimizer, batch)``: a float64 ActorCritic (4 observations, 3 actions, 16 hidden units), a
    recording SGD (or Adam) for it, and ``n`` samples ``[obs, actions, old_logp, advantages, returns,
    old_values]``: old_logp is the agent's log-prob plus ``stale`` · N(0, 1) (data from a slightly different
    policy), advantages ~ 0.5 + 2·N(0, 1) (normalising them matters). ``graph``: the last four require grad."""
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]), torch_threads(1), torch.no_grad():
        torch.manual_seed(seed)
        agent = ActorCritic(gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(3), (16,)).double()
        obs = torch.randn(n, 4, generator=g, dtype=torch.float64)
        dist = agent.dist(obs)
        actions = torch.multinomial(dist.probs, 1, generator=g).squeeze(-1)
        logp, values = dist.log_prob(actions), agent.value(obs)

    def noise(scale):
        return scale * torch.randn(n, generator=g, dtype=torch.float64)

    batch = [obs, actions, logp + noise(stale), 0.5 + noise(2.0), values + 0.5 + noise(1.0), values + noise(0.2)]
    if graph:
        batch[2:] = [x.clone().requires_grad_() for x in batch[2:]]
    opt = (RecordingAdam if optimizer == "adam" else RecordingSGD)(agent.parameters(), lr=lr)
    opt.record(agent, obs)
    return agent, opt, batch


def cartpole_rollout(seed: int, num_envs: int = 8, num_steps: int = 32, lr: float = 3e-3):
    """``(agent, optimizer, batch)`` as the training loop hands them to the update: a fresh float32 ActorCritic,
    a recording Adam (``lr``, eps 1e-5) and one CartPole-v1 rollout with GAE (γ 0.99, λ 0.95), flattened to
    ``num_envs · num_steps`` rows."""
    from minigrpo.advantages import gae

    with torch.random.fork_rng(devices=[]), torch_threads(1):
        torch.manual_seed(seed)
        envs = make_vec_env("CartPole-v1", num_envs)
        agent = ActorCritic(envs.single_observation_space, envs.single_action_space)
        ro = RolloutCollector(envs, seed=seed).collect(agent, num_steps)
        envs.close()
    adv = gae(ro.rewards, ro.values, ro.next_values, ro.terminated, ro.truncated, 0.99, 0.95)
    batch = [x.reshape(-1, *x.shape[2:]) for x in (ro.obs, ro.actions, ro.logp, adv, adv + ro.values, ro.values)]
    opt = RecordingAdam(agent.parameters(), lr=lr, eps=1e-5)
    opt.record(agent, batch[0])
    return agent, opt, batch


# --- what a case compares

def _seeded(fn, inputs):
    """``fn(cfg, agent, optimizer, batch)`` with torch's random generator seeded (and restored after), on one
    thread (these networks are tiny: more threads only wait for each other)."""
    with torch.random.fork_rng(devices=[]), torch_threads(1):
        torch.manual_seed(GRADING_SEED)
        return inputs(fn)


def _parameters(agent) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in agent.parameters()])


def _with_returned(stats, keys, measured: dict):
    """What a case compares: ``measured``, then the returned statistics ``keys`` (a missing one is reported)."""
    if not isinstance(stats, dict):
        return stats
    return {**measured, **{k: stats[k] for k in keys if k in stats}}


def _run_step(fn, inputs):
    agent, opt = inputs["agent"], inputs["optimizer"]
    before = _parameters(agent)
    stats = _seeded(fn, inputs)
    return _with_returned(stats, STATS, {"parameter change": _parameters(agent) - before,
                                          "optimizer steps": opt.steps})


def _run_count(fn, inputs):
    opt = inputs["optimizer"]
    stats = _seeded(fn, inputs)
    return _with_returned(stats, ("num_steps",), {"optimizer steps": opt.steps,
                                                   "samples per step": torch.tensor([len(v) for v in opt.visits])})


def _run_cover(fn, inputs):
    m, n, opt = inputs["cfg"].num_minibatches, inputs["batch"][0].shape[0], inputs["optimizer"]
    stats = _seeded(fn, inputs)
    epochs = [opt.visits[i: i + m] for i in range(0, len(opt.visits), m)]
    firsts = [tuple(e[0]) for e in epochs]
    return _with_returned(stats, ("num_steps",), {
        "every sample once in each epoch": torch.tensor([sorted(i for v in e for i in v) == list(range(n))
                                                          for e in epochs]),
        "shuffled": bool(firsts) and firsts[0] != tuple(range(len(firsts[0]))),
        "a new order each epoch": len(firsts) > 1 and len(set(firsts)) == len(firsts)})


def _run_detached(fn, inputs):
    agent, batch = inputs["agent"], inputs["batch"]
    before = _parameters(agent)
    stats = _seeded(fn, inputs)
    reached = torch.tensor([x.grad is not None and bool(x.grad.abs().sum() > 0) for x in batch[2:]])
    return _with_returned(stats, ("num_steps",), {"a gradient reached old_logp, advantages, returns, old_values":
                                                  reached, "parameter change": _parameters(agent) - before})


STEP = Call(_run_step, "torch seeded; compared: each parameter's change, the optimizer steps taken, the returned stats")
COUNT = Call(_run_count, "torch seeded; compared: the optimizer steps taken, the samples each step's loss saw, "
                         "the returned num_steps")
COVER = Call(_run_cover, "torch seeded; compared: which samples each epoch's minibatches hold, and num_steps")
DETACHED = Call(_run_detached, "torch seeded; compared: whether a gradient reached those four tensors, each "
                               "parameter's change, the returned num_steps")

_SHUFFLE_HINT = ("draw a new permutation at the start of every epoch, `perm = torch.randperm(n)`, and take the "
                 "minibatches as its consecutive slices `perm[start:start + n // num_minibatches]`: every sample "
                 "once per epoch, in a new order each epoch.")
_MINIBATCH_HINT = ("with several minibatches the parameters differ although each step on one minibatch is right: "
                   "shuffle with `torch.randperm(n)` once at the start of every epoch and nothing else random (the "
                   "grader seeds torch so that the reference draws the same minibatches), and normalise the "
                   "advantages within each minibatch.")

UPDATE_CASES = [
    Case("one step: 1 epoch × 1 minibatch of 64 samples (SGD, lr 0.1)",
         (Made(ppo_config, update_epochs=1, num_minibatches=1), Spread(ppo_problem, seed=0)), call=STEP,
         rtol=1e-6, atol=1e-9,
         hint="one step is loss = clipped surrogate (your 04.1 on the minibatch's normalised advantages) + "
              "vf_coef · value_loss − ent_coef · entropy; zero_grad, backward, clip the gradient norm, step."),
    Case("the gradient norm of all parameters together clipped at max_grad_norm = 0.05",
         (Made(ppo_config, update_epochs=1, num_minibatches=1, max_grad_norm=0.05), Spread(ppo_problem, seed=1)),
         call=STEP, rtol=1e-6, atol=1e-9,
         hint="clip after backward and before step: `torch.nn.utils.clip_grad_norm_(agent.parameters(), "
              "cfg.max_grad_norm)`, once over every parameter of the agent."),
    Case("2 epochs × 1 minibatch (Adam, lr 0.01): the second step starts from the first",
         (Made(ppo_config, update_epochs=2, num_minibatches=1), Spread(ppo_problem, seed=2, lr=0.01, optimizer="adam")),
         call=STEP, rtol=1e-6, atol=1e-9,
         hint="each step needs fresh gradients (optimizer.zero_grad() before backward) and a fresh forward pass "
              "through the agent (the log-probs and values of the current parameters)."),
    Case("3 epochs × 4 minibatches of 16: 12 steps",
         (Made(ppo_config, update_epochs=3, num_minibatches=4), Spread(ppo_problem, seed=3)), call=COUNT,
         hint="take one optimizer step per minibatch, cfg.update_epochs × cfg.num_minibatches in all, each on "
              "n // num_minibatches samples, and return that count as num_steps."),
    Case("every epoch visits each sample once, in a new random order",
         (Made(ppo_config, update_epochs=3, num_minibatches=4), Spread(ppo_problem, seed=3)), call=COVER,
         hint=_SHUFFLE_HINT),
    Case("3 epochs × 4 minibatches (Adam, lr 0.01): parameters and statistics",
         (Made(ppo_config, update_epochs=3, num_minibatches=4), Spread(ppo_problem, seed=4, lr=0.01,
                                                                         optimizer="adam")),
         call=STEP, rtol=1e-6, atol=1e-9, hint=_MINIBATCH_HINT),
    Case("target_kl = 0.02 and a batch far from the policy: stops after the first epoch",
         (Made(ppo_config, update_epochs=4, num_minibatches=2, target_kl=0.02), Spread(ppo_problem, seed=5, stale=1.5)),
         call=COUNT,
         hint="after each epoch (not each minibatch), stop when the approx_kl of its last minibatch — measured in "
              "that minibatch's loss, before its step — exceeds cfg.target_kl."),
    Case("target_kl = 2e-5, a fresh batch: the KL measured before step 2 crosses it, so 2 steps",
         (Made(ppo_config, update_epochs=5, num_minibatches=1, target_kl=2e-5), Spread(ppo_problem, seed=6, stale=0.0)),
         call=STEP, rtol=1e-6, atol=1e-9, quick=False,
         hint="measure approx_kl from the log-probs of the minibatch's loss (before its step) and test it after the "
              "epoch: epoch 1 sees KL 0 (the batch's own policy), epoch 2 sees the KL after step 1."),
    Case("target_kl = 10, never reached: every epoch runs",
         (Made(ppo_config, update_epochs=3, num_minibatches=2, target_kl=10.0), Spread(ppo_problem, seed=7)),
         call=COUNT, quick=False),
    Case("value clipping (clip_vloss) and ε = 0.3",
         (Made(ppo_config, update_epochs=1, num_minibatches=1, clip_vloss=True, clip_coef=0.3),
          Spread(ppo_problem, seed=8)), call=STEP, rtol=1e-6, atol=1e-9, quick=False,
         hint="with cfg.clip_vloss the value loss is value_loss(values, returns, old_values, cfg.clip_coef); "
              "without it, value_loss(values, returns)."),
    Case("norm_adv = False: the advantages as they are",
         (Made(ppo_config, update_epochs=1, num_minibatches=1, norm_adv=False), Spread(ppo_problem, seed=9)),
         call=STEP, rtol=1e-6, atol=1e-9, quick=False,
         hint="normalise the advantages only when cfg.norm_adv is True."),
    Case("vf_coef = 2 and ent_coef = 0",
         (Made(ppo_config, update_epochs=1, num_minibatches=1, vf_coef=2.0, ent_coef=0.0), Spread(ppo_problem, seed=10)),
         call=STEP, rtol=1e-6, atol=1e-9, quick=False),
    Case("old_logp, advantages, returns and old_values carry a graph: no gradient flows into them",
         (Made(ppo_config, update_epochs=1, num_minibatches=1), Spread(ppo_problem, seed=0, graph=True)),
         call=DETACHED, rtol=1e-6, atol=1e-9, quick=False,
         hint="the batch is data from the rollout: detach old_logp in the ratio, and the advantages, returns and "
              "old values in the losses (your 04.1 and the package's value_loss already do)."),
    Case("60 samples, which 8 minibatches do not divide, are refused with a ValueError",
         (Made(ppo_config, update_epochs=1, num_minibatches=8), Spread(ppo_problem, seed=0, n=60)), call=STEP,
         quick=False,
         hint="check `n % cfg.num_minibatches` first and raise ValueError: the last minibatch would be smaller."),
]

PPO_UPDATE = Item(
    exercise="04", number=4, function="ppo_update", title="a complete PPO update",
    reference=reference_ppo_update, cases=UPDATE_CASES,
    wrong_answers=[
        WrongAnswer("never shuffles", partial(_update, shuffle="never"),
                    "the minibatches are always the same consecutive rows: " + _SHUFFLE_HINT),
        WrongAnswer("shuffles once", partial(_update, shuffle="once"),
                    "you shuffle once, before the epochs, so every epoch sees the same minibatches: " + _SHUFFLE_HINT),
        WrongAnswer("no advantage normalisation", partial(_update, norm="none"),
                    "normalise the advantages of each minibatch, (A − mean) / (std + 1e-8) with torch's default "
                    "std, when cfg.norm_adv is True: the loss's scale and the baseline depend on it."),
        WrongAnswer("advantages normalised over the batch", partial(_update, norm="batch"),
                    "normalise within each minibatch (its own mean and std, as CleanRL and the package do), "
                    "not once over the whole batch."),
        WrongAnswer("sign", partial(_update, sign=-1.0),
                    "sign error in the policy loss: minimise the negative clipped surrogate, −mean(min(r·A, "
                    "clip(r)·A)) — your 04.1 — so the step raises the probability of actions with A > 0."),
        WrongAnswer("no clipping", partial(_update, clip=False),
                    "the policy loss is not clipped: use −mean(min(r·A, clip(r, 1 ± ε)·A)) with ε = cfg.clip_coef "
                    "(your 04.1), not −mean(r·A)."),
        WrongAnswer("entropy sign", partial(_update, ent_sign=1.0),
                    "the entropy bonus has the wrong sign: loss = policy loss + vf_coef · value loss − ent_coef · "
                    "entropy (a bonus for randomness lowers the loss)."),
        WrongAnswer("no vf_coef", partial(_update, vf_coef=1.0),
                    "weigh the value loss with cfg.vf_coef: loss = policy loss + vf_coef · value loss − ent_coef · "
                    "entropy."),
        WrongAnswer("no gradient clipping", partial(_update, clip_grad=False),
                    "clip the gradient norm before each step: `torch.nn.utils.clip_grad_norm_(agent.parameters(), "
                    "cfg.max_grad_norm)` between backward and optimizer.step()."),
        WrongAnswer("no zero_grad", partial(_update, zero_grad=False),
                    "call optimizer.zero_grad() before each backward: gradients accumulate, so each step also "
                    "repeats every earlier minibatch's gradient."),
        WrongAnswer("target_kl ignored", partial(_update, kl="ignored"),
                    "stop the epochs early: after an epoch whose last minibatch's approx_kl exceeds cfg.target_kl "
                    "(when it is not None), break out of the epoch loop."),
        WrongAnswer("target_kl per minibatch", partial(_update, kl="minibatch"),
                    "test target_kl after each epoch, not after each minibatch: the package (like CleanRL) finishes "
                    "the epoch and then stops, so num_steps is a multiple of num_minibatches."),
        WrongAnswer("num_steps counts epochs", partial(_update, count="epochs"),
                    "num_steps is the number of optimizer steps (minibatches) taken, epochs run × num_minibatches, "
                    "not the number of epochs."),
        WrongAnswer("KL after the step", partial(_update, kl="after"), quick=False,
                    hint="approx_kl is the one measured in the last minibatch's loss, before its step (no extra "
                         "forward pass): the package and CleanRL test that one after each epoch."),
        WrongAnswer("old_logp not detached", partial(_update, detach=False), quick=False,
                    hint="gradient flows into old_logp: detach it in the ratio (your 04.1 does); it is data from "
                         "the rollout, not something to optimise."),
        WrongAnswer("advantages normalised in place", partial(_update, in_place=True), IN_PLACE_HINT),
    ],
)

# --------------------------------------------------------------------------- 04.5 ppo_update trains CartPole

#: The training case's settings (fields of PPOConfig): lesson 04's tuned CartPole preset (rl-zoo's: 8 envs × 32 steps a
#: rollout, 20 epochs over it as one minibatch, γ 0.98, λ 0.8) with a larger learning rate, 3e-3 annealed to 0 over
#: the budget, and ε fixed at 0.2; a seed stops once a greedy evaluation (10 episodes, every 2,048 env steps) reaches
#: CARTPOLE_THRESHOLD. Measured with benchmarks/ex04_training_item.py (2026-11-23, a busy 2-core CPU; 1 and 2 torch
#: threads give identical runs, the training loop pins one), env steps to solve, "-" for never within 30,720:
#:
#: - the reference (the package's ppo_epochs), seeds 0-9: 10,240 12,288 14,336 16,384 8,192 6,144 20,480 8,192
#:   8,192 12,288 (2.6-8.8 CPU s each; solutions/04's ppo_update gives the same on seeds 0-4): the budget is 1.5x
#:   the slowest of ten seeds. The graded seeds 5, 7, 8 solve within 8,192 steps (3.75x under the budget) in about
#:   10 CPU s together; seed 4 is not graded, its untrained greedy policy already scores 500;
#: - a policy loss of the wrong sign, seeds 0-4: - - - - - (greedy return 9.1-9.6; 13-15 CPU s each);
#: - no clip, seeds 0-9: - 12,288 - 18,432 2,048 26,624 - - - 20,480: a gamble, not a sure failure, so only
#:   04.4's one-step cases (which catch it on any seed) name it;
#: - no update at all, seeds 0-9: - - - - 2,048 - - - - - (last evaluations 9.2-263 but for seed 4's 500);
#: - unnormalised advantages (measured with a 20,480-step budget, seeds 0-5): - 10,240 14,336 - 14,336 18,432.
TRAIN_CONFIG = dict(env_id="CartPole-v1", num_envs=8, num_steps=32, update_epochs=20, num_minibatches=1, gamma=0.98,
                    gae_lambda=0.8, learning_rate=3e-3, ent_coef=0.0, clip_vloss=False, total_timesteps=30_720,
                    eval_every_steps=2_048, eval_episodes=10, target_return=475.0)
TRAIN_SEEDS = (5, 7, 8)
#: a seed passes when its greedy evaluation reaches this within TRAIN_CONFIG's budget ("solved")
CARTPOLE_THRESHOLD = 475.0


def update_factory(ppo_update, cfg: PPOConfig):
    """``factory(agent) -> update`` for :func:`run_on_policy`, around the learner's ``ppo_update(cfg, agent,
    optimizer, batch)``: one Adam (eps 1e-5) for the run, its learning rate annealed linearly to 0, the rollout
    flattened to ``num_envs · num_steps`` rows; the returned statistics are logged."""
    def factory(agent):
        opt = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)

        def update(agent, ro, adv, returns, it):
            for group in opt.param_groups:
                group["lr"] = cfg.learning_rate * (1.0 - (it - 1) / cfg.num_iterations)
            batch = [x.reshape(-1, *x.shape[2:]) for x in (ro.obs, ro.actions, ro.logp, adv, returns, ro.values)]
            stats = ppo_update(cfg, agent, opt, batch)
            return {k: float(v) for k, v in stats.items()}

        return update

    return factory


def train_cartpole(ppo_update, seed: int, **fields) -> tuple[float, int]:
    """Train CartPole-v1 with ``ppo_update`` on the package's rollouts (:data:`TRAIN_CONFIG` and ``fields``) until
    an evaluation reaches the target return or the budget is spent; return the last greedy evaluation's mean
    return (NaN if none ran) and the num_steps the update reported in all."""
    cfg = PPOConfig(**{**TRAIN_CONFIG, "seed": seed, **fields})
    result = run_on_policy(cfg, "PPO (ppo_update)", update_factory(ppo_update, cfg), progress=False)
    evaluations = result.history["eval_return"]
    return (evaluations[-1] if evaluations else math.nan), int(sum(result.history.get("num_steps", [0])))


def _run_training(fn, inputs):
    """Train on each seed of :data:`TRAIN_SEEDS` until one fails; the caller's random states are restored after
    (the training loop seeds python, NumPy and torch)."""
    returns, steps, state = [], [], rng_state()
    try:
        for seed in TRAIN_SEEDS:
            ret, n = train_cartpole(fn, seed) if not returns or returns[-1] >= CARTPOLE_THRESHOLD else (0.0, 0)
            returns.append(ret)
            steps.append(n)
    finally:
        set_rng_state(state)
    return {f"last greedy return per seed, capped at {CARTPOLE_THRESHOLD:g}":
            torch.tensor(returns, dtype=torch.float64).clamp(max=CARTPOLE_THRESHOLD),
            "num_steps reported, per seed": torch.tensor(steps)}


TRAINS = Call(_run_training, f"trains CartPole-v1 with it (at most {TRAIN_CONFIG['total_timesteps']:,} env steps a "
                             f"seed, {TRAIN_CONFIG['num_envs']} envs × {TRAIN_CONFIG['num_steps']} steps a rollout, "
                             f"{TRAIN_CONFIG['update_epochs']} epochs × {TRAIN_CONFIG['num_minibatches']} minibatch, "
                             f"Adam lr {TRAIN_CONFIG['learning_rate']:g} annealed to 0, a greedy evaluation of "
                             f"{TRAIN_CONFIG['eval_episodes']} episodes every {TRAIN_CONFIG['eval_every_steps']:,} "
                             "steps); compared: each seed's last evaluation, and the num_steps it reported in all")

TRAINING_CASES = [
    Case("one update on a CartPole-v1 rollout (8 envs × 32 steps, float32, Adam lr 0.01): 4 epochs × 4 minibatches",
         (Made(ppo_config, update_epochs=4, num_minibatches=4, num_steps=32, ent_coef=0.0, max_grad_norm=0.5),
          Spread(cartpole_rollout, seed=0, lr=0.01)), call=STEP, rtol=1e-3, atol=1e-4,
         hint="the batch is what the training loop hands over: obs [256, 4] float32, actions [256] int64, and "
              "old_logp, advantages, returns, old_values [256]; pass 04.4 first."),
    Case(f"seeds {', '.join(map(str, TRAIN_SEEDS))}: each solves CartPole (a greedy evaluation of at least "
         f"{CARTPOLE_THRESHOLD:g}) within the budget (a seed after a failing one is not run: 0)", call=TRAINS,
         quick=False,
         hint="your update passes one step but does not learn CartPole: run the notebook's training section and "
              "read its curves (return, clip fraction, approx_kl); a policy loss of the wrong sign, a missing clip "
              "or unnormalised advantages are the usual causes."),
]

PPO_UPDATE_TRAINS = Item(
    exercise="04", number=5, function="ppo_update", title="your ppo_update trains CartPole-v1",
    reference=reference_ppo_update, cases=TRAINING_CASES, time_limit=300.0,
    wrong_answers=[
        WrongAnswer("sign", partial(_update, sign=-1.0),
                    "sign error in the policy loss, and CartPole is not learnt at all (greedy return about 9): "
                    "minimise −mean(min(r·A, clip(r)·A)), your 04.1, so that actions with A > 0 become likelier."),
    ],
)

ITEMS = [CLIPPED_SURROGATE_LOSS, PPO_CLIP_FRACTION, APPROX_KL, PPO_UPDATE, PPO_UPDATE_TRAINS]

