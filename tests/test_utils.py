import random

import gymnasium as gym
import numpy as np
import pytest
import torch

from minigrpo.utils import SMOKE_ENV_VAR, get_device, is_smoke, seed_everything, smoke_or_full, torch_threads


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("YES", True), ("0", False), ("", False)])
def test_smoke_switch_reads_one_variable(monkeypatch, value, expected):
    monkeypatch.setenv(SMOKE_ENV_VAR, value)
    assert is_smoke() is expected
    assert smoke_or_full(smoke="tiny", full="big") == ("tiny" if expected else "big")


def test_smoke_switch_unset_means_full(monkeypatch):
    monkeypatch.delenv(SMOKE_ENV_VAR, raising=False)
    assert not is_smoke()


def test_seed_everything_makes_every_generator_repeat():
    env = gym.make("CartPole-v1")

    def draw():
        seed_everything(123, env=env)
        obs, _ = env.reset()
        return random.random(), np.random.rand(), torch.rand(1).item(), env.action_space.sample(), obs.tolist()

    first = draw()
    # reset(seed) inside seed_everything then an unseeded reset: same start state both times
    assert draw() == first
    seed_everything(124, env=env)
    assert random.random() != first[0]


def test_seed_must_be_an_int():
    with pytest.raises(TypeError):
        seed_everything(1.5)


def test_device_choice(monkeypatch):
    monkeypatch.delenv("MINIGRPO_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert get_device().type == expected
    assert get_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("MINIGRPO_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")


def test_torch_threads_restores_the_previous_setting():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
