"""Grading tests for exercise 04 (PPO).

By default they grade solutions/04_ppo.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex04.py --grade-source exercises
The items' cases run in test_items.py; the properties below test random batches against what the clipped objective
must satisfy, and the learner's ppo_update against what any correct update must do (invariances, step counts, the
losses of a step of size zero, where target_kl stops).
"""

import math

import pytest
import torch

from minigrpo_course.grading.ex04 import ppo_config, ppo_problem
from minigrpo.losses import clipped_surrogate_loss, value_loss
from minigrpo.utils import torch_threads


EXERCISE = "04"


def _batch(seed, n=200, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(n, generator=g, dtype=torch.float64)
    logp = old + spread * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return logp, old, adv


CASES = [(seed, eps) for seed in range(4) for eps in (0.1, 0.2, 0.3)]


@pytest.mark.parametrize("seed,eps", CASES)
def test_gradient_is_zero_exactly_where_the_clip_acts(learner_fn, seed, eps):
    """d loss / d logp_i = 0 when (A > 0, r > 1 + ε) or (A < 0, r < 1 − ε), else −r_i·A_i / N."""
    logp, old, adv = _batch(seed)
    logp.requires_grad_()
    learner_fn(EXERCISE, "clipped_surrogate_loss")(logp, old, adv, eps).backward()
    assert logp.grad is not None, "no gradient reached logp"
    r = torch.exp(logp.detach() - old)
    clipped = ((adv > 0) & (r > 1 + eps)) | ((adv < 0) & (r < 1 - eps))
    assert clipped.any() and (~clipped).any()  # the batch exercises both kinds of samples
    expected = torch.where(clipped, torch.zeros_like(r), -r * adv / len(r))
    assert torch.all(logp.grad[clipped] == 0), "a clipped sample still has a gradient"
    torch.testing.assert_close(logp.grad, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed,eps", CASES)
def test_loss_is_a_pessimistic_bound(learner_fn, seed, eps):
    """min(rA, clip(r)A) ≤ rA per sample, so the loss is ≥ the unclipped surrogate loss −mean(rA);
    and it equals it when every ratio lies inside the clip range."""
    loss_fn = learner_fn(EXERCISE, "clipped_surrogate_loss")
    logp, old, adv = _batch(seed)
    unclipped = -(torch.exp(logp - old) * adv).mean()
    assert float(loss_fn(logp, old, adv, eps)) >= float(unclipped) - 1e-12
    inside_logp = old + torch.log1p(0.9 * eps * (2 * torch.rand(len(old), dtype=torch.float64) - 1))
    torch.testing.assert_close(torch.as_tensor(loss_fn(inside_logp, old, adv, eps), dtype=torch.float64),
                               -(torch.exp(inside_logp - old) * adv).mean(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_clip_fraction_is_the_share_of_zero_gradients(learner_fn, seed):
    """The clip fraction counts exactly the samples whose loss gradient is zero (A ≠ 0 here)."""
    logp, old, adv = _batch(seed)
    logp.requires_grad_()
    learner_fn(EXERCISE, "clipped_surrogate_loss")(logp, old, adv, 0.2).backward()
    zero_share = (logp.grad == 0).double().mean()
    got = learner_fn(EXERCISE, "ppo_clip_fraction")(logp.detach(), old, adv, 0.2)
    assert abs(float(got) - float(zero_share)) < 1e-6  # a share of 200 samples: steps of 0.005


def test_clip_fraction_grows_as_the_policy_moves(learner_fn):
    clip_fraction = learner_fn(EXERCISE, "ppo_clip_fraction")
    fracs = [float(clip_fraction(*_batch(0, 2000, spread), 0.2)) for spread in (0.0, 0.1, 0.3, 1.0)]
    assert fracs[0] == 0.0 and fracs == sorted(fracs) and 0.0 <= fracs[-1] <= 0.5


@pytest.mark.parametrize("seed", range(3))
def test_k3_is_nonnegative_and_matches_the_exact_kl(learner_fn, seed):
    """Actions drawn from π_old: the k3 average estimates KL(π_old ‖ π_θ) of two categoricals."""
    approx_kl = learner_fn(EXERCISE, "approx_kl")
    g = torch.Generator().manual_seed(seed)
    old_logits, new_logits = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    old_logits, new_logits = old_logits.log_softmax(0), (old_logits + 0.5 * new_logits).log_softmax(0)
    exact = float((old_logits.exp() * (old_logits - new_logits)).sum())
    actions = torch.multinomial(old_logits.exp(), 200_000, replacement=True, generator=g)
    est = float(approx_kl(new_logits[actions], old_logits[actions]))
    assert est >= 0
    assert abs(est - exact) < 0.1 * exact + 2e-3, (est, exact)
    for i in range(6):  # every single-sample estimate is >= 0
        assert float(approx_kl(new_logits[i:i + 1], old_logits[i:i + 1])) >= -1e-15


# --------------------------------------------------------------------------- 04.4 ppo_update


def _update(fn, cfg, problem, seed=0):
    """``fn(cfg, agent, optimizer, batch)`` with torch seeded, on one thread; returns (stats, parameter change,
    optimizer)."""
    agent, opt, batch = problem
    before = _parameters(agent)
    with torch.random.fork_rng(devices=[]), torch_threads(1):
        torch.manual_seed(seed)
        stats = fn(cfg, agent, opt, batch)
    return stats, _parameters(agent) - before, opt


def _parameters(agent):
    return torch.cat([p.detach().reshape(-1).clone() for p in agent.parameters()])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_minibatches", [1, 4])
def test_update_is_unchanged_by_a_shift_and_scale_of_the_advantages(learner_fn, seed, num_minibatches):
    """With norm_adv each minibatch's advantages are standardised, so a·A + b (a > 0) gives the same update."""
    ppo_update = learner_fn(EXERCISE, "ppo_update")
    cfg = ppo_config(update_epochs=2, num_minibatches=num_minibatches)
    _, step, _ = _update(ppo_update, cfg, ppo_problem(seed))
    agent, opt, batch = ppo_problem(seed)
    batch[3] = 7.0 * batch[3] - 3.0
    _, moved, _ = _update(ppo_update, cfg, (agent, opt, batch))
    torch.testing.assert_close(moved, step, rtol=1e-6, atol=1e-9)
    _, raw, _ = _update(ppo_update, ppo_config(update_epochs=2, num_minibatches=num_minibatches, norm_adv=False),
                        ppo_problem(seed))
    assert (raw - step).abs().max() > 1e-4, "norm_adv=False must use the advantages as they are"


@pytest.mark.parametrize("seed", range(3))
def test_the_order_of_the_samples_in_one_minibatch_does_not_matter(learner_fn, seed):
    ppo_update = learner_fn(EXERCISE, "ppo_update")
    cfg = ppo_config(update_epochs=1, num_minibatches=1, max_grad_norm=0.1, clip_vloss=True)
    stats, step, _ = _update(ppo_update, cfg, ppo_problem(seed))
    agent, opt, batch = ppo_problem(seed)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(seed))
    shuffled, moved, _ = _update(ppo_update, cfg, (agent, opt, [x[order] for x in batch]))
    torch.testing.assert_close(moved, step, rtol=1e-6, atol=1e-9)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "num_steps"):
        assert abs(float(shuffled[key]) - float(stats[key])) < 1e-9, key


@pytest.mark.parametrize("epochs,minibatches", [(1, 1), (2, 8), (3, 2), (4, 4), (1, 32)])
def test_every_epoch_takes_one_step_per_minibatch_over_every_sample(learner_fn, epochs, minibatches):
    """E epochs × M minibatches: E·M optimizer steps (returned as num_steps), each on n / M distinct samples,
    every sample once per epoch; the statistics stay in their ranges."""
    cfg = ppo_config(update_epochs=epochs, num_minibatches=minibatches)
    stats, _, opt = _update(learner_fn(EXERCISE, "ppo_update"), cfg, ppo_problem(epochs + minibatches))
    assert opt.steps == epochs * minibatches == int(stats["num_steps"])
    assert [len(v) for v in opt.visits] == [64 // minibatches] * (epochs * minibatches)
    for e in range(epochs):
        assert sorted(i for v in opt.visits[e * minibatches:(e + 1) * minibatches] for i in v) == list(range(64))
    assert 0.0 <= float(stats["clip_frac"]) <= 1.0 and float(stats["approx_kl"]) >= 0.0
    assert 0.0 < float(stats["entropy"]) <= math.log(3) + 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_a_step_of_size_zero_reports_the_losses_of_the_batch(learner_fn, seed):
    """SGD with lr 0 moves nothing, so every epoch's statistics are those of the whole batch, computed here
    from the package's losses in float64."""
    cfg = ppo_config(update_epochs=3, num_minibatches=1, clip_vloss=True)
    agent, opt, batch = problem = ppo_problem(seed, lr=0.0)
    obs, actions, old_logp, adv, returns, old_values = batch
    with torch.no_grad():
        dist = agent.dist(obs)
        logp = dist.log_prob(actions)
        norm = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss, s = clipped_surrogate_loss(logp, old_logp, norm, 0.2)
        expected = {"policy_loss": policy_loss, "value_loss": value_loss(agent.value(obs), returns, old_values, 0.2),
                    "entropy": dist.entropy().mean(), "approx_kl": s["approx_kl"], "clip_frac": s["clip_frac"],
                    "num_steps": 3}
    stats, step, _ = _update(learner_fn(EXERCISE, "ppo_update"), cfg, problem)
    assert torch.all(step == 0)
    for key, value in expected.items():
        assert abs(float(stats[key]) - float(value)) < 1e-6 * max(1.0, abs(float(value))), (key, stats[key], value)


@pytest.mark.parametrize("minibatches", [1, 2])
def test_target_kl_stops_after_the_first_epoch_exactly_when_the_kl_exceeds_it(learner_fn, minibatches):
    """With lr 0 the policy never moves, so every minibatch's approx_kl is that of the stale batch: a target
    just below the whole batch's KL (one minibatch) stops after one epoch, one just above never stops; with two
    minibatches the step count is a whole number of epochs."""
    ppo_update = learner_fn(EXERCISE, "ppo_update")
    agent, _, batch = ppo_problem(11, stale=0.5, lr=0.0)
    with torch.no_grad():
        _, s = clipped_surrogate_loss(agent.dist(batch[0]).log_prob(batch[1]), batch[2], batch[3], 0.2)
    kl = s["approx_kl"]
    for target, steps in ((0.99 * kl, minibatches), (1.01 * kl, 4 * minibatches)):
        cfg = ppo_config(update_epochs=4, num_minibatches=minibatches, target_kl=target)
        stats, _, opt = _update(ppo_update, cfg, ppo_problem(11, stale=0.5, lr=0.0))
        assert opt.steps % minibatches == 0 and opt.steps == int(stats["num_steps"])
        if minibatches == 1:
            assert opt.steps == steps, (target, kl, opt.steps)
