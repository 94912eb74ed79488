"""Grading tests for exercise 05 (from PPO to GRPO).

By default they grade solutions/05_ppo_to_grpo.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex05.py --grade-source exercises
Each item runs every case (the notebook's check cell runs only the quick ones), and the properties
below go further than fixed cases: they hold for any rewards, so a solution that only matches the
examples will not pass them.
"""

import pytest
import torch

from minigrpo.advantages import group_advantages as reference_group_advantages
from minigrpo_course.grading import items, run_item

EXERCISE = "05"
SCALES = ["group", "batch", "none"]


@pytest.mark.parametrize("item", items(EXERCISE), ids=lambda i: f"{i.id}-{i.function}")
def test_item(item, learner):
    result = run_item(item, learner(EXERCISE).get(item.function))
    assert result.passed, "\n" + result.report()


def _fn(learner, name):
    fn = learner(EXERCISE).get(name)
    if fn is None:
        pytest.fail(f"`{name}` is not defined by the notebook")
    return fn


def _rewards(seed, num_prompts=12, group_size=6, binary=False):
    g = torch.Generator().manual_seed(seed)
    if binary:
        return (torch.rand(num_prompts * group_size, generator=g) < 0.4).double()
    return torch.randn(num_prompts * group_size, generator=g, dtype=torch.float64) * 3.0 + 1.0


def _call(fn, *args, **kwargs):
    return torch.as_tensor(fn(*args, **kwargs), dtype=torch.float64)


# ----------------------------------------------------------------------------- 05.1 group_advantages


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("seed", range(3))
def test_matches_the_package_on_random_rewards(learner, scale, seed):
    G = [2, 4, 6][seed]
    rewards = _rewards(seed, group_size=G, binary=seed == 1)
    got = _call(_fn(learner, "group_advantages"), rewards.clone(), G, scale=scale)
    torch.testing.assert_close(got, reference_group_advantages(rewards, G, scale=scale), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scale", SCALES)
def test_each_group_averages_to_zero(learner, scale):
    G = 6
    adv = _call(_fn(learner, "group_advantages"), _rewards(11, group_size=G), G, scale=scale)
    torch.testing.assert_close(adv.view(-1, G).mean(1), torch.zeros(adv.numel() // G, dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_group_scaling_gives_each_group_sample_std_one(learner):
    """With scale='group' every group whose rewards differ has sample std s / (s + eps) ≈ 1."""
    G = 5
    rewards = _rewards(12, group_size=G)
    adv = _call(_fn(learner, "group_advantages"), rewards, G).view(-1, G)
    s = rewards.view(-1, G).std(1)
    torch.testing.assert_close(adv.std(1), s / (s + 1e-4), rtol=1e-9, atol=1e-12)
    assert (adv.std(1) - 1).abs().max() < 1e-3


@pytest.mark.parametrize("scale", ["group", "none"])
def test_adding_a_constant_to_a_group_changes_nothing(learner, scale):
    """Only differences within a group matter: shifting a prompt's rewards leaves its advantages alone."""
    fn, G = _fn(learner, "group_advantages"), 4
    rewards = _rewards(13, group_size=G)
    shifts = torch.randn(rewards.numel() // G, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 50
    shifted = rewards + shifts.repeat_interleave(G)
    torch.testing.assert_close(_call(fn, shifted, G, scale=scale), _call(fn, rewards, G, scale=scale),
                               rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("scale", SCALES)
def test_permuting_answers_within_a_group_permutes_the_advantages(learner, scale):
    fn, G = _fn(learner, "group_advantages"), 6
    rewards = _rewards(14, group_size=G)
    g = torch.Generator().manual_seed(1)
    perm = torch.cat([torch.randperm(G, generator=g) + G * p for p in range(rewards.numel() // G)])
    torch.testing.assert_close(_call(fn, rewards[perm], G, scale=scale), _call(fn, rewards, G, scale=scale)[perm],
                               rtol=1e-9, atol=1e-12)


def test_groups_are_independent(learner):
    """A prompt's advantages do not depend on the other prompts in the batch (scale='group' and 'none')."""
    fn, G = _fn(learner, "group_advantages"), 4
    rewards = _rewards(15, group_size=G)
    for scale in ["group", "none"]:
        whole = _call(fn, rewards, G, scale=scale)
        alone = torch.cat([_call(fn, rewards[i:i + G], G, scale=scale) for i in range(0, rewards.numel(), G)])
        torch.testing.assert_close(whole, alone, rtol=1e-9, atol=1e-12)


def test_all_equal_groups_give_exact_zeros_and_no_nan(learner):
    fn = _fn(learner, "group_advantages")
    rewards = torch.tensor([1.0] * 8 + [0.0] * 8 + [1.0, 0.0] * 4)
    for scale in SCALES:
        adv = _call(fn, rewards, 8, scale=scale)
        assert not torch.isnan(adv).any(), f"scale={scale!r}: NaN in the advantages"
        assert (adv[:16] == 0).all(), f"scale={scale!r}: an all-equal group must get advantage 0"


def test_group_advantages_does_not_modify_its_input(learner):
    rewards = torch.tensor([85.0, 92.0, 70.0])
    _fn(learner, "group_advantages")(rewards, 3)
    assert rewards.tolist() == [85.0, 92.0, 70.0], "group_advantages changed the rewards tensor it was given"


# ----------------------------------------------------------------------------- 05.2 rloo_advantages


def _rloo_loop(rewards, G):
    """Oracle: the definition, one answer at a time, in float64."""
    r = rewards.double().tolist()
    out = []
    for start in range(0, len(r), G):
        group = r[start:start + G]
        out += [group[i] - sum(group[:i] + group[i + 1:]) / (G - 1) for i in range(G)]
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("G", [2, 3, 8])
def test_rloo_matches_the_definition(learner, G):
    rewards = _rewards(20 + G, group_size=G)
    torch.testing.assert_close(_call(_fn(learner, "rloo_advantages"), rewards.clone(), G), _rloo_loop(rewards, G),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("G", [2, 5, 16])
def test_rloo_is_mean_centring_times_g_over_g_minus_one(learner, G):
    rewards = _rewards(30 + G, group_size=G, binary=True)
    expected = G / (G - 1) * reference_group_advantages(rewards, G, scale="none")
    torch.testing.assert_close(_call(_fn(learner, "rloo_advantages"), rewards, G), expected, rtol=1e-9, atol=1e-12)


def test_rloo_baseline_of_an_answer_ignores_its_own_reward(learner):
    """Changing r_j by δ moves A_j by δ, the other advantages of its group by −δ/(G−1), other groups not at all.
    (A_i − r_i is the baseline of answer i: it must not depend on r_i — that is what makes RLOO unbiased.)"""
    fn, G, delta = _fn(learner, "rloo_advantages"), 4, 0.5
    rewards = _rewards(40, num_prompts=3, group_size=G)
    base = _call(fn, rewards, G)
    for j in range(rewards.numel()):
        bumped = rewards.clone()
        bumped[j] += delta
        change = _call(fn, bumped, G) - base
        expected = torch.zeros_like(change)
        group = slice(j // G * G, j // G * G + G)
        expected[group] = -delta / (G - 1)
        expected[j] = delta
        torch.testing.assert_close(change, expected, rtol=1e-9, atol=1e-12)


def test_rloo_groups_sum_to_zero_and_rank_like_the_rewards(learner):
    fn, G = _fn(learner, "rloo_advantages"), 6
    rewards = _rewards(41, group_size=G)
    adv = _call(fn, rewards, G).view(-1, G)
    torch.testing.assert_close(adv.sum(1), torch.zeros(adv.shape[0], dtype=torch.float64), rtol=0, atol=1e-10)
    assert torch.equal(adv.argsort(1), rewards.view(-1, G).argsort(1))
