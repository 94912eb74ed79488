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


# ----------------------------------------------------------------------------- GAE

from minigrpo.advantages import gae  # noqa: E402


def gae_float64_loop(r, v, nv, term, trunc, gamma, lam):
    """Reference: per environment, per episode segment, the GAE sum written as Σ (γλ)^k δ_{t+k}."""
    r, v, nv = (np.asarray(x, dtype=np.float64) for x in (r, v, nv))
    term, trunc = np.asarray(term, bool), np.asarray(trunc, bool)
    T = len(r)
    delta = np.array([r[t] + (0.0 if term[t] else gamma * nv[t]) - v[t] for t in range(T)])
    adv = np.zeros(T)
    for t in range(T):
        total, k = 0.0, 0
        while t + k < T:
            total += (gamma * lam) ** k * delta[t + k]
            if term[t + k] or trunc[t + k]:
                break
            k += 1
        adv[t] = total
    return adv


def random_rollout(seed, T=64, N=None):
    rng = np.random.default_rng(seed)
    shape = (T,) if N is None else (T, N)
    r, v, nv = rng.normal(size=shape), rng.normal(size=shape), rng.normal(size=shape)
    term = rng.random(shape) < 0.08
    trunc = (rng.random(shape) < 0.08) & ~term
    return r, v, nv, term, trunc


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.0), (0.97, 1.0), (1.0, 0.5)])
def test_gae_against_float64_reference_with_terminations_and_truncations(seed, gamma, lam):
    r, v, nv, term, trunc = random_rollout(seed, T=50, N=3)
    got = gae(*(torch.tensor(x) for x in (r, v, nv, term, trunc)), gamma=gamma, lam=lam)
    assert got.shape == (50, 3) and got.dtype == torch.float64
    for n in range(3):
        expected = gae_float64_loop(r[:, n], v[:, n], nv[:, n], term[:, n], trunc[:, n], gamma, lam)
        np.testing.assert_allclose(got[:, n].numpy(), expected, rtol=1e-10, atol=1e-10)


def test_gae_lambda_zero_is_the_td_residual():
    r, v, nv, term, trunc = random_rollout(0)
    got = gae(*(torch.tensor(x) for x in (r, v, nv, term, trunc)), gamma=0.9, lam=0.0)
    np.testing.assert_allclose(got.numpy(), r + 0.9 * nv * (~term) - v, rtol=1e-12)


def test_gae_lambda_one_is_discounted_return_minus_value():
    # one episode that terminates: A_t = Σ γ^k r_{t+k} − V(s_t)
    rng = np.random.default_rng(1)
    T = 30
    r, v, nv = rng.normal(size=T), rng.normal(size=T), np.append(rng.normal(size=T - 1), np.nan)
    nv[:-1] = v[1:]  # consistent values inside the episode
    term = np.zeros(T, bool)
    term[-1] = True
    got = gae(torch.tensor(r), torch.tensor(v), torch.tensor(nv), torch.tensor(term), torch.zeros(T, dtype=torch.bool),
              gamma=0.95, lam=1.0)
    np.testing.assert_allclose(got.numpy(), rtg_float64_loop(r, 0.95) - v, rtol=1e-10, atol=1e-10)


def test_gae_truncation_bootstraps_but_does_not_cross_the_boundary():
    # step 1 is truncated: δ_1 uses V(final obs) = 10; step 0's advantage must not see episode 2's rewards
    r = torch.tensor([1.0, 1.0, 100.0])
    v = torch.tensor([0.0, 0.0, 0.0])
    nv = torch.tensor([0.0, 10.0, 0.0])
    trunc = torch.tensor([False, True, False])
    term = torch.tensor([False, False, True])
    adv = gae(r, v, nv, term, trunc, gamma=0.5, lam=1.0)
    assert adv.tolist() == [1.0 + 0.5 * (1.0 + 0.5 * 10.0), 1.0 + 0.5 * 10.0, 100.0]


def test_gae_terminal_next_value_is_ignored_even_if_nan():
    adv = gae(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([float("nan")]), torch.tensor([True]),
              torch.tensor([False]), gamma=0.9, lam=0.9)
    assert adv.tolist() == [0.5]


@pytest.mark.parametrize("kwargs,match", [
    ({"values": torch.zeros(4)}, "same shape"),
    ({"rewards": torch.tensor([1.0, float("nan"), 0.0, 0.0, 0.0])}, "NaN"),
    ({"lam": 1.5}, "lam"),
])
def test_gae_bad_input(kwargs, match):
    args = dict(rewards=torch.zeros(5), values=torch.zeros(5), next_values=torch.zeros(5),
                terminated=torch.zeros(5, dtype=torch.bool), truncated=torch.zeros(5, dtype=torch.bool),
                gamma=0.9, lam=0.9)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gae(**args)


# ----------------------------------------------------------------------------- group advantages

from minigrpo.advantages import group_advantages  # noqa: E402


def test_group_advantages_worked_example():
    """Rewards 85, 92, 70: mean 82.33, sample std 11.24 -> (0.24, 0.86, -1.10)."""
    adv = group_advantages(torch.tensor([85.0, 92.0, 70.0], dtype=torch.float64), 3, eps=0.0)
    std = np.std([85, 92, 70], ddof=1)
    np.testing.assert_allclose(adv.numpy(), (np.array([85, 92, 70]) - 247 / 3) / std, rtol=1e-12)
    assert adv.sum().abs() < 1e-12


def test_group_advantages_are_per_group():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 5.0, 5.0, 9.0], dtype=torch.float64)
    adv = group_advantages(r, 4, scale="none")
    assert adv.tolist() == [0.5, -0.5, 0.5, -0.5, -1.0, -1.0, -1.0, 3.0]
    g = group_advantages(r, 4, scale="group", eps=0.0)
    np.testing.assert_allclose(g.view(2, 4).numpy(), (adv.view(2, 4) / r.view(2, 4).std(1, keepdim=True)).numpy())
    b = group_advantages(r, 4, scale="batch", eps=0.0)
    np.testing.assert_allclose(b.numpy(), (adv / r.std()).numpy())


def test_all_equal_group_gives_zero_not_nan():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), 3)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0] and torch.isfinite(adv).all()
    # exactly zero even where float32 rounding makes the mean differ from the rewards
    for scale in ("group", "batch", "none"):
        assert group_advantages(torch.full((8,), 0.1), 8, scale=scale).abs().max().item() == 0.0


@pytest.mark.parametrize("rewards,g,match", [
    (torch.ones(6), 4, "multiple of group_size"),
    (torch.ones(6), 1, ">= 2"),
    (torch.ones(2, 3), 3, "flat tensor"),
    (torch.tensor([1.0, float("nan")]), 2, "NaN"),
])
def test_group_advantages_bad_input(rewards, g, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, g)
