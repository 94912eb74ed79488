"""Grading tests for exercise 01 (REINFORCE).

By default they grade solutions/01_reinforce.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex01.py --grade-source exercises
The items' cases run in test_items.py; the properties below go further than fixed cases.
"""

import pytest
import torch

from minigrpo.advantages import reward_to_go as reference_rtg

EXERCISE = "01"


@pytest.mark.parametrize("seed", range(5))
def test_reward_to_go_random_episodes(learner_fn, seed):
    """Random lengths, rewards and discounts against the package's float64 reference."""
    g = torch.Generator().manual_seed(seed)
    T = int(torch.randint(1, 120, (1,), generator=g))
    gamma = float(torch.rand(1, generator=g))
    rewards = torch.randn(T, generator=g, dtype=torch.float64)
    got = torch.as_tensor(learner_fn(EXERCISE, "reward_to_go")(rewards.clone(), gamma), dtype=torch.float64)
    torch.testing.assert_close(got, reference_rtg(rewards, gamma), rtol=1e-9, atol=1e-9)


def test_reward_to_go_does_not_modify_its_input(learner_fn):
    rewards = torch.tensor([1.0, 2.0, 3.0])
    learner_fn(EXERCISE, "reward_to_go")(rewards, 0.9)
    assert rewards.tolist() == [1.0, 2.0, 3.0], "reward_to_go changed the rewards tensor it was given"


def test_loss_gradient_matches_finite_differences(learner_fn):
    """d loss / d logp_i should be -w_i / N: check against a central finite difference."""
    loss_fn = learner_fn(EXERCISE, "reinforce_loss")
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(6, generator=g, dtype=torch.float64)
    w = torch.randn(6, generator=g, dtype=torch.float64)
    eps = 1e-6
    for i in range(6):
        up, down = logp.clone(), logp.clone()
        up[i] += eps
        down[i] -= eps
        fd = (loss_fn(up, w) - loss_fn(down, w)) / (2 * eps)
        assert abs(float(fd) - float(-w[i] / 6)) < 1e-6


def test_batch_matches_per_episode_reward_to_go(learner_fn):
    """Concatenating episodes and flagging their ends gives the per-episode reward-to-go."""
    batch_fn = learner_fn(EXERCISE, "batch_reward_to_go")
    g = torch.Generator().manual_seed(3)
    lengths = [1, 7, 3, 12, 1, 5]
    episodes = [torch.randn(n, generator=g, dtype=torch.float64) for n in lengths]
    dones = torch.cat([torch.arange(n) == n - 1 for n in lengths])
    got = torch.as_tensor(batch_fn(torch.cat(episodes), dones, 0.9), dtype=torch.float64)
    expected = torch.cat([reference_rtg(e, 0.9) for e in episodes])
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
