import numpy as np
import pytest
import torch

from minigrpo.advantages import batch_reward_to_go, reward_to_go


def rtg_float64_loop(rewards, gamma):
    """The definition, summed term by term in float64."""
    r = np.asarray(rewards, dtype=np.float64)
    return np.array([sum(gamma**k * r[t + k] for k in range(len(r) - t)) for t in range(len(r))])


def test_hand_computed():
    assert reward_to_go([1.0, 1.0, 1.0], 0.5).tolist() == [1.75, 1.5, 1.0]
    assert reward_to_go([1.0, 2.0, 3.0], 1.0).tolist() == [6.0, 5.0, 3.0]
    assert reward_to_go([3.0, -1.0, 2.0], 0.0).tolist() == [3.0, -1.0, 2.0]


@pytest.mark.parametrize("seed", range(10))
def test_against_float64_loop(seed):
    rng = np.random.default_rng(seed)
    T, gamma = int(rng.integers(1, 200)), float(rng.uniform(0, 1))
    rewards = rng.normal(size=T)
    got = reward_to_go(torch.tensor(rewards), gamma)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), rtg_float64_loop(rewards, gamma), rtol=1e-12, atol=1e-12)


def test_accepts_lists_arrays_and_ints():
    assert reward_to_go(np.array([1, 1]), 0.5).dtype == torch.float32
    assert reward_to_go([2], 0.9).tolist() == [2.0]


@pytest.mark.parametrize("bad,match", [
    (torch.ones(2, 3), r"1-D sequence of shape \[T\]; got shape \(2, 3\)"),
    (torch.zeros(0), "empty episode"),
    (torch.tensor(1.0), r"got shape \(\)"),
    (torch.tensor([1.0, float("nan")]), "NaN or inf"),
])
def test_bad_rewards_raise_clear_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        reward_to_go(bad, 0.9)


@pytest.mark.parametrize("gamma", [-0.1, 1.5])
def test_gamma_must_be_a_probability(gamma):
    with pytest.raises(ValueError, match="gamma"):
        reward_to_go([1.0], gamma)


def test_batch_equals_per_episode():
    rng = np.random.default_rng(0)
    lengths = [1, 4, 9, 2, 1, 6]
    eps = [rng.normal(size=n) for n in lengths]
    dones = np.concatenate([np.arange(n) == n - 1 for n in lengths])
    got = batch_reward_to_go(torch.tensor(np.concatenate(eps)), torch.tensor(dones), 0.9)
    expected = np.concatenate([rtg_float64_loop(e, 0.9) for e in eps])
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def test_batch_treats_the_last_step_as_an_end():
    assert batch_reward_to_go([1.0, 2.0, 3.0], [False, False, False], 1.0).tolist() == [6.0, 5.0, 3.0]
    assert batch_reward_to_go([1.0, 1.0, 1.0, 1.0, 1.0], [0, 0, 1, 0, 1], 0.5).tolist() == [1.75, 1.5, 1.0, 1.5, 1.0]


def test_batch_shape_mismatch():
    with pytest.raises(ValueError, match="same shape"):
        batch_reward_to_go(torch.ones(4), torch.zeros(3, dtype=torch.bool), 0.9)
