"""Grading tests for exercise 11 (interview quiz).

By default they grade solutions/11_quiz.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex11.py --grade-source exercises
Each item's cases run from tests/grading/test_items.py; the properties below hold for any input, so an
answer that only matches the quiz's examples will not pass them.
"""

import math

import pytest
import torch

from minigrpo.advantages import gae, group_advantages
from minigrpo.attention import kv_cache_bytes
from minigrpo_course.grading.ex11 import SCENARIOS
from minigrpo.losses import clipped_surrogate_loss

EXERCISE = "11"


def _f64(x):
    return torch.as_tensor(x, dtype=torch.float64)


# ----------------------------------------------------------------------------- 11.1 group_advantages_of


@pytest.mark.parametrize("G", [2, 3, 8, 16])
def test_group_advantages_match_the_package(learner_fn, G):
    fn = learner_fn(EXERCISE, "group_advantages_of")
    rewards = torch.randn(G, generator=torch.Generator().manual_seed(G), dtype=torch.float64) * 5 + 3
    torch.testing.assert_close(_f64(fn(rewards.tolist())), group_advantages(rewards, G), rtol=1e-9, atol=1e-12)


def test_group_advantages_ignore_a_shift_and_follow_a_permutation(learner_fn):
    fn = learner_fn(EXERCISE, "group_advantages_of")
    rewards = [0.3, 0.9, 0.1, 0.5, 0.5]
    base = _f64(fn(rewards))
    torch.testing.assert_close(_f64(fn([r + 100.0 for r in rewards])), base, rtol=1e-6, atol=1e-8)
    perm = [4, 2, 0, 3, 1]
    torch.testing.assert_close(_f64(fn([rewards[i] for i in perm])), base[perm], rtol=1e-12, atol=1e-12)
    assert abs(base.sum().item()) < 1e-12


# ----------------------------------------------------------------------------- 11.2 clipped_objective


def _package_objective_and_slope(ratio, advantage, epsilon):
    rho = torch.tensor(ratio, dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_surrogate_loss(torch.log(rho).reshape(1), torch.zeros(1, dtype=torch.float64),
                                     torch.tensor([advantage], dtype=torch.float64), clip_eps=epsilon)
    (-loss).backward()
    return -loss.item(), rho.grad.item()


@pytest.mark.parametrize("epsilon", [0.1, 0.2, 0.3])
def test_clipped_objective_matches_the_package_on_a_grid(learner_fn, epsilon):
    fn = learner_fn(EXERCISE, "clipped_objective")
    for ratio in [0.3, 0.75, 0.95, 1.0, 1.07, 1.45, 2.5]:
        if min(abs(ratio - 1 - epsilon), abs(ratio - 1 + epsilon)) < 1e-9:
            continue  # the kinks: the slope is not defined there
        for advantage in [-2.5, -0.4, 0.0, 0.7, 3.0]:
            out = fn(ratio, advantage, epsilon=epsilon)
            objective, slope = _package_objective_and_slope(ratio, advantage, epsilon)
            assert math.isclose(out["objective"], objective, rel_tol=1e-9, abs_tol=1e-12), (ratio, advantage)
            assert math.isclose(out["slope"], slope, rel_tol=1e-9, abs_tol=1e-12), (ratio, advantage)


def test_clipped_objective_is_a_pessimistic_bound_with_a_finite_difference_slope(learner_fn):
    fn = learner_fn(EXERCISE, "clipped_objective")
    h = 1e-6
    for ratio, advantage in [(0.6, 1.3), (1.4, 1.3), (0.6, -0.8), (1.4, -0.8), (1.05, 2.0)]:
        out = fn(ratio, advantage)
        assert out["objective"] <= ratio * advantage + 1e-12, "the objective never exceeds the unclipped ρA"
        fd = (fn(ratio + h, advantage)["objective"] - fn(ratio - h, advantage)["objective"]) / (2 * h)
        assert math.isclose(out["slope"], fd, abs_tol=1e-6), (ratio, advantage)


# ----------------------------------------------------------------------------- 11.3 gae_segment


@pytest.mark.parametrize("terminated", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_gae_segment_matches_the_package(learner_fn, seed, terminated):
    fn = learner_fn(EXERCISE, "gae_segment")
    g = torch.Generator().manual_seed(seed)
    T = 5 + 4 * seed
    r, v = torch.randn(T, generator=g, dtype=torch.float64), torch.randn(T, generator=g, dtype=torch.float64)
    last = 1.3
    next_v = torch.cat([v[1:], torch.tensor([last], dtype=torch.float64)])
    done = torch.zeros(T, dtype=torch.float64)
    done[-1] = float(terminated)
    expected = gae(r, v, next_v, done, torch.zeros(T, dtype=torch.float64), 0.99, 0.95)
    torch.testing.assert_close(_f64(fn(r.tolist(), v.tolist(), last, 0.99, 0.95, terminated)), expected,
                               rtol=1e-9, atol=1e-12)


def test_gae_limits(learner_fn):
    """λ = 0 gives the TD residuals; λ = 1 gives the bootstrapped discounted return minus V."""
    fn = learner_fn(EXERCISE, "gae_segment")
    r, v, last, gamma = [0.5, -1.0, 2.0, 0.0], [0.1, 0.7, -0.3, 0.9], 0.4, 0.9
    nxt = v[1:] + [last]
    td = [r[t] + gamma * nxt[t] - v[t] for t in range(4)]
    torch.testing.assert_close(_f64(fn(r, v, last, gamma, 0.0, False)), _f64(td), rtol=1e-9, atol=1e-12)
    returns = [sum(gamma ** (k - t) * r[k] for k in range(t, 4)) + gamma ** (4 - t) * last for t in range(4)]
    torch.testing.assert_close(_f64(fn(r, v, last, gamma, 1.0, False)), _f64(returns) - _f64(v), rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- 11.4 kv_cache_size


def test_kv_cache_size_matches_the_package_and_scales_linearly(learner_fn):
    fn = learner_fn(EXERCISE, "kv_cache_size")
    for layers, heads, kv, d, n, b, dtype, nbytes in [(12, 12, 12, 64, 1024, 4, "fp16", 2), (40, 40, 8, 128, 8192, 2, "fp8", 1),
                                                      (24, 16, 2, 96, 100, 3, "fp32", 4)]:
        assert fn(layers, heads, kv, d, n, b, dtype) == kv_cache_bytes(layers, kv, d, n, b, nbytes)
    base = fn(32, 32, 8, 128, 1000, 1, "bf16")
    assert fn(32, 32, 8, 128, 3000, 1, "bf16") == 3 * base and fn(32, 32, 8, 128, 1000, 5, "bf16") == 5 * base
    assert fn(32, 32, 32, 128, 1000, 1, "bf16") == 4 * base, "32 -> 8 KV heads is a 4x smaller cache"


def test_kv_cache_size_of_a_7b_model_is_2_gib(learner_fn):
    assert learner_fn(EXERCISE, "kv_cache_size")(32, 32, 32, 128, 4096, 1, "fp16") == 2 * 2**30


# ----------------------------------------------------------------------------- 11.5 ratio_deviations


def test_every_scenario_gets_one_of_the_two_answers(learner_fn):
    answers = learner_fn(EXERCISE, "ratio_deviations")()
    assert set(answers) == set(SCENARIOS)
    assert set(answers.values()) <= {"design", "mismatch"}
    # Every optimizer step already taken on the batch moves the ratio by design.
    assert answers["a"] == answers["d"] == "design"
