"""Tracking (``report_to``) and checkpoints that resume, for the LLM GRPO, diffusion GRPO and PPO trainers.

A resumed run must reproduce an uninterrupted one exactly: same metric history (wall-clock timings
aside) and the same parameters, bit for bit.
"""

import math
import sys

import numpy as np
import pytest
import torch

from minigrpo.control.onpolicy import tracker_tag
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.tasks import AdditionTask
from minigrpo.llm.tokenizer import build_char_tokenizer
from minigrpo.infra.tracking import Tracker, latest_checkpoint, load_state

TIMINGS = ("step_time", "sample_time", "seconds", "sps")  # wall-clock: the only entries allowed to differ


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # one torch thread, restored afterwards (conftest.py)


def same_history(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for key in a:
        if key in TIMINGS:
            continue
        assert len(a[key]) == len(b[key]), key
        for x, y in zip(a[key], b[key]):
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), (key, a[key], b[key])


def same_parameters(m1: torch.nn.Module, m2: torch.nn.Module) -> None:
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    for k in s1:
        assert torch.equal(s1[k], s2[k]), k


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def check_logged(folder, history: dict, steps: list[int], prefix: str = "train/", tag=None) -> None:
    """Every per-step entry of the history is in the event file at its step, with the history's value (as float32).
    Its name there: ``tag(key)`` when given (the control trainers' CleanRL names), else ``prefix + key``."""
    scalars = tensorboard_scalars(folder)
    keys = [k for k in history if k not in ("step", "iteration", "env_steps") and len(history[k]) == len(steps)]
    assert len(keys) >= 5
    for key in keys:
        logged = scalars[tag(key) if tag else prefix + key]
        assert [s for s, _ in logged] == steps, key
        for (_, value), expected in zip(logged, history[key]):
            assert value == np.float32(expected) or (math.isnan(value) and math.isnan(expected)), key


# --------------------------------------------------------------------------- LLM GRPO
@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def llm_trainer(tok, **kw) -> GRPOTrainer:
    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2)
    cfg = GRPOConfig(**{"max_steps": 4, "prompts_per_step": 2, "num_generations": 4, "eval_every": 0,
                        "learning_rate": 1e-2, "beta": 0.04, "num_iterations": 2, **kw})
    return GRPOTrainer(model, tok, AdditionTask(eval_size=4), cfg)


def test_llm_grpo_writes_tensorboard_events(tok, tmp_path):
    result = llm_trainer(tok, max_steps=2, report_to="tensorboard", logging_dir=str(tmp_path)).train(progress=False)
    check_logged(tmp_path, result.history, [1, 2])
    scalars = tensorboard_scalars(tmp_path)  # TRL's dashboard: the loss and the learning rate, every step
    assert [s for s, _ in scalars["train/loss"]] == [s for s, _ in scalars["train/learning_rate"]] == [1, 2]
    assert all(v == pytest.approx(1e-2) for _, v in scalars["train/learning_rate"])


def test_llm_grpo_resume_reproduces_the_uninterrupted_run(tok, tmp_path):
    straight = llm_trainer(tok).train(progress=False)
    first = llm_trainer(tok, max_steps=2, output_dir=str(tmp_path)).train(progress=False)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-2" and len(first.history["step"]) == 2
    resumed_trainer = llm_trainer(tok, output_dir=str(tmp_path))  # a new trainer on a fresh copy of the base
    resumed = resumed_trainer.train(progress=False, resume_from_checkpoint=True)
    assert resumed.history["step"] == [1, 2, 3, 4]
    same_history(straight.history, resumed.history)
    same_parameters(straight.model, resumed.model)
    assert resumed_trainer.opt.state_dict()["state"][0]["step"] == 2 * 4  # μ = 2 optimizer steps per step


# --------------------------------------------------------------------------- report_to errors, trackers
def test_bad_report_to_is_one_line_naming_the_field():
    for bad in ("tensorbord", ["tensorboard", "mlflow"], ["none", "tensorboard"]):
        with pytest.raises(ValueError, match=r"^GRPOConfig\.report_to ") as err:
            GRPOConfig(report_to=bad)
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match=r"^GRPOConfig\.report_to must be"):
        GRPOConfig(report_to=3)


@pytest.mark.parametrize("package", ["tensorboard", "trackio", "wandb"])
def test_missing_tracker_package_is_one_line_naming_field_and_package(package, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # makes the package not importable, on any machine
    message = rf"^GRPOConfig\.report_to asks for '{package}'.*pip install {package}\)$"
    with pytest.raises(ImportError, match=message) as e:
        GRPOConfig(report_to=[package])
    assert "\n" not in str(e.value)


def test_tracker_sends_numbers_to_every_target(tmp_path, monkeypatch):
    import importlib.machinery
    import types

    calls = []

    class FakeRun:
        def log(self, metrics, step):
            calls.append(("log", dict(metrics), step))

        def finish(self):
            calls.append(("finish",))

    fake = types.ModuleType("trackio")
    fake.__spec__ = importlib.machinery.ModuleSpec("trackio", None)
    fake.init = lambda project, name, config: calls.append(("init", project, name, config)) or FakeRun()
    monkeypatch.setitem(sys.modules, "trackio", fake)
    config = {"lr": 0.5, "dir": tmp_path}
    with Tracker(["tensorboard", "trackio", "tensorboard"], tmp_path / "logs", "test", config) as t:
        assert t.targets == ("tensorboard", "trackio")
        t.log({"loss": torch.tensor(1.25), "n": 3, "note": "skipped", "vec": [1, 2]}, step=7, prefix="train/")
    assert calls == [("init", "minigrpo", "logs", {"lr": 0.5, "dir": str(tmp_path)}),
                     ("log", {"train/loss": 1.25, "train/n": 3.0}, 7), ("finish",)]
    assert tensorboard_scalars(tmp_path / "logs") == {"train/loss": [(7, 1.25)], "train/n": [(7, 3.0)]}
    assert not Tracker("none").active and not Tracker(["none"]).active


# --------------------------------------------------------------------------- diffusion GRPO
def diffusion_trainer(**kw):
    from diffusers import DDPMScheduler

    from minigrpo.diffusion.grpo import DiffusionGRPOConfig, DiffusionGRPOTrainer
    from minigrpo.diffusion.rewards import ink_reward

    from tiny_diffusion import tiny_unet

    unet = tiny_unet(seed=0)
    cfg = DiffusionGRPOConfig(**{"max_steps": 4, "prompts_per_step": 2, "num_generations": 2, "num_inference_steps": 3,
                                 "learning_rate": 1e-3, "beta": 0.1, "timestep_fraction": 0.67, "num_iterations": 2,
                                 "num_minibatches": 2, **kw})
    return DiffusionGRPOTrainer(unet, DDPMScheduler(num_train_timesteps=100), ink_reward, cfg)


def test_diffusion_grpo_writes_tensorboard_events(tmp_path):
    result = diffusion_trainer(max_steps=2, report_to="tensorboard", logging_dir=str(tmp_path)).train(progress=False)
    assert result.history["step"] == [1, 2]
    check_logged(tmp_path, result.history, [1, 2])


def test_diffusion_grpo_resume_reproduces_the_uninterrupted_run(tmp_path):
    straight = diffusion_trainer().train(progress=False)
    diffusion_trainer(max_steps=2, output_dir=str(tmp_path), save_steps=1).train(progress=False)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-2" and (tmp_path / "checkpoint-1").is_dir()
    seen = []
    resumed = diffusion_trainer(resume_from_checkpoint=str(tmp_path / "checkpoint-2")).train(
        progress=False, callback=lambda i, m: seen.append(i))
    assert seen == [2, 3] and resumed.history["step"] == [1, 2, 3, 4]
    same_history(straight.history, resumed.history)
    same_parameters(straight.model, resumed.model)


# --------------------------------------------------------------------------- PPO
def ppo_config(**kw):
    from minigrpo.control import PPOConfig

    # 3 envs x 40 steps: CartPole episodes end inside rollouts, so a checkpoint falls mid-episode
    return PPOConfig(**{"total_timesteps": 4 * 120, "num_envs": 3, "num_steps": 40, "num_minibatches": 2,
                        "update_epochs": 2, "eval_every_steps": 240, "eval_episodes": 2, **kw})


def test_ppo_writes_tensorboard_events(tmp_path):
    from minigrpo.control import train_ppo

    result = train_ppo(ppo_config(total_timesteps=240, report_to="tensorboard", logging_dir=str(tmp_path)),
                       progress=False)
    check_logged(tmp_path, result.history, result.history["env_steps"], tag=tracker_tag)
    scalars = tensorboard_scalars(tmp_path)
    assert scalars["eval/episodic_return"] == [(240, np.float32(result.history["eval_return"][0]))]
    # CleanRL's names (its ppo.py), not ours
    assert {"charts/SPS", "charts/episodic_return", "charts/episodic_length", "charts/learning_rate",
            "losses/clipfrac", "losses/approx_kl", "losses/policy_loss", "losses/value_loss", "losses/entropy",
            "losses/explained_variance"} <= set(scalars)
    assert not [t for t in scalars if t.startswith("train/")]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_ppo_resume_reproduces_the_uninterrupted_run(env_id, tmp_path):
    from minigrpo.control import train_ppo

    straight = train_ppo(ppo_config(env_id=env_id), progress=False)
    saving = train_ppo(ppo_config(env_id=env_id, output_dir=str(tmp_path), save_steps=2), progress=False)
    same_history(straight.history, saving.history)  # saving changes nothing
    state = load_state(tmp_path / "checkpoint-2")
    import pickle

    envs = pickle.loads(state["collector"]["envs"])  # with gymnasium's RecordEpisodeStatistics wrapper
    assert (envs.episode_lengths > 0).any()  # mid-episode
    resumed = train_ppo(ppo_config(env_id=env_id, resume_from_checkpoint=str(tmp_path / "checkpoint-2")),
                        progress=False)
    assert resumed.history["iteration"] == [1, 2, 3, 4]
    same_history(straight.history, resumed.history)
    same_parameters(straight.agent, resumed.agent)


def test_reinforce_writes_tensorboard_events(tmp_path):
    from minigrpo.control.reinforce import ReinforceConfig, train_reinforce

    cfg = ReinforceConfig(num_iterations=2, num_envs=2, eval_every_steps=10_000, eval_episodes=2, target_return=None,
                          hidden_sizes=(8,), report_to=["tensorboard"], logging_dir=str(tmp_path))
    result = train_reinforce(cfg, progress=False)
    check_logged(tmp_path, {k: result.history[k] for k in ("train_return", "episode_length", "policy_loss",
                                                            "value_loss", "entropy")}, result.history["env_steps"],
                 tag=tracker_tag)
    assert tensorboard_scalars(tmp_path)["eval/episodic_return"] == [(result.history["eval_step"][0],
                                                             np.float32(result.history["eval_return"][0]))]


def test_ppo_resume_of_an_env_that_cannot_be_restored_warns(tmp_path):
    # Box2D envs pickle by their constructor arguments (EzPickle): no mid-episode state to restore
    from minigrpo.control import train_ppo

    cfg = dict(env_id="LunarLander-v3", total_timesteps=240, num_steps=40, eval_every_steps=0)
    train_ppo(ppo_config(**cfg, output_dir=str(tmp_path), save_steps=1), progress=False)
    assert load_state(tmp_path / "checkpoint-1")["collector"]["envs"] is None
    with pytest.warns(UserWarning, match="cannot be restored mid-episode"):
        resumed = train_ppo(ppo_config(**cfg, resume_from_checkpoint=True, output_dir=str(tmp_path)), progress=False)
    assert resumed.history["iteration"] == [1, 2]


def test_checkpoint_errors_and_the_older_names(tok, tmp_path):
    with pytest.raises(ValueError, match=r"^GRPOConfig\.resume_from_checkpoint=True needs GRPOConfig\.output_dir"):
        llm_trainer(tok, resume_from_checkpoint=True).train(False)
    with pytest.raises(FileNotFoundError, match="no checkpoint-<step> folder"):
        llm_trainer(tok, output_dir=str(tmp_path), resume_from_checkpoint=True).train(False)
    with pytest.raises(FileNotFoundError, match="holds no trainer_state.pt"):
        from minigrpo.control import train_ppo
        train_ppo(ppo_config(resume_from_checkpoint=str(tmp_path)), progress=False)
    old = GRPOConfig(checkpoint_dir="runs/x", checkpoint_every=5)
    assert (old.output_dir, old.save_steps) == ("runs/x", 5)
    with pytest.raises(ValueError, match=r"^GRPOConfig\.checkpoint_dir must be output_dir's value"):
        GRPOConfig(checkpoint_dir="runs/x", output_dir="runs/y")


# --------------------------------------------------------------------------- nothing lost: atomic writes, fallback
def _damage(folder, how: str) -> None:
    """What a kill -9 during a save (or a disk) leaves: an empty state, a cut weights file, a missing file."""
    if how == "empty trainer_state.pt":
        (folder / "trainer_state.pt").write_bytes(b"")
    elif how == "truncated model.safetensors":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif how == "truncated trainer_state.pt":
        data = (folder / "trainer_state.pt").read_bytes()
        (folder / "trainer_state.pt").write_bytes(data[: len(data) - 100])
    elif how == "missing model.safetensors":
        (folder / "model.safetensors").unlink()
    else:
        (folder / "trainer_state.pt").unlink()


@pytest.mark.parametrize("how", ["empty trainer_state.pt", "truncated trainer_state.pt", "truncated model.safetensors",
                                 "missing model.safetensors", "missing trainer_state.pt"])
def test_resume_skips_a_damaged_newest_checkpoint_with_one_warning(tok, tmp_path, how):
    """Checkpoints 1, 2, 3; the newest damaged as a crash would leave it: resuming warns once, naming it, and
    continues from checkpoint-2, reproducing the uninterrupted run exactly."""
    straight = llm_trainer(tok).train(progress=False)
    llm_trainer(tok, max_steps=3, output_dir=str(tmp_path), save_steps=1).train(progress=False)
    _damage(tmp_path / "checkpoint-3", how)
    with pytest.warns(UserWarning) as caught:
        resumed = llm_trainer(tok, output_dir=str(tmp_path), resume_from_checkpoint=True).train(progress=False)
    messages = [str(w.message) for w in caught if "damaged checkpoint" in str(w.message)]
    assert len(messages) == 1 and "checkpoint-3" in messages[0], messages
    assert resumed.history["step"] == [1, 2, 3, 4]
    same_history(straight.history, resumed.history)
    same_parameters(straight.model, resumed.model)


def test_no_whole_checkpoint_is_one_sentence_before_any_training(tok, tmp_path):
    llm_trainer(tok, max_steps=2, output_dir=str(tmp_path), save_steps=1).train(progress=False)
    _damage(tmp_path / "checkpoint-1", "empty trainer_state.pt")
    _damage(tmp_path / "checkpoint-2", "truncated model.safetensors")
    trainer = llm_trainer(tok, output_dir=str(tmp_path), resume_from_checkpoint=True)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.warns(UserWarning, match="damaged"), pytest.raises(FileNotFoundError) as info:
        trainer.train(progress=False)
    assert str(info.value).startswith("GRPOConfig.resume_from_checkpoint=True: no checkpoint in")
    assert "checkpoint-2: model.safetensors is damaged" in str(info.value) and "\n" not in str(info.value)
    assert trainer.step_count == 0 and all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    with pytest.raises(ValueError, match=r"checkpoint-1 is damaged \(trainer_state.pt is empty\)"):
        llm_trainer(tok, resume_from_checkpoint=str(tmp_path / "checkpoint-1")).train(progress=False)


def test_a_checkpoint_save_that_fails_midway_leaves_the_previous_one(tok, tmp_path, monkeypatch):
    """save_checkpoint writes into a temporary folder and renames it into place: a crash after the weights were
    written (here torch.save raising on the trainer state) leaves the earlier checkpoint of that folder untouched and
    no temporary folder behind."""
    import minigrpo.infra.atomic as atomic

    trainer = llm_trainer(tok, max_steps=1)
    folder = trainer.save_checkpoint(tmp_path / "ckpt")
    saved = {p.name: p.read_bytes() for p in folder.iterdir()}
    trainer.step()

    def crash(obj, path):
        raise OSError("disk full")

    monkeypatch.setattr(atomic, "atomic_torch_save", crash)
    monkeypatch.setattr("minigrpo.infra.tracking.atomic_torch_save", crash)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(tmp_path / "ckpt")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def _cut(path, how: str) -> None:
    """A file as a kill -9 during an in-place write leaves it: empty, or without its last bytes."""
    data = path.read_bytes()
    path.write_bytes(b"" if how == "empty" else data[: len(data) - 100])


@pytest.mark.parametrize("file", ["agent.pt", "trainer_state.pt"])
@pytest.mark.parametrize("how", ["empty", "truncated"])
def test_ppo_resume_skips_a_damaged_newest_checkpoint_with_one_warning(tmp_path, file, how):
    """PPO checkpoints 1-4; the newest with its agent or its state cut: resuming warns once, naming it and the file,
    and continues from checkpoint-3, reproducing the uninterrupted run exactly."""
    from minigrpo.control import train_ppo

    straight = train_ppo(ppo_config(), progress=False)
    train_ppo(ppo_config(output_dir=str(tmp_path), save_steps=1), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint-{i}" for i in (1, 2, 3, 4)]  # no temporaries
    _cut(tmp_path / "checkpoint-4" / file, how)
    with pytest.warns(UserWarning) as caught:
        resumed = train_ppo(ppo_config(output_dir=str(tmp_path), resume_from_checkpoint=True), progress=False)
    messages = [str(w.message) for w in caught if "damaged checkpoint" in str(w.message)]
    assert len(messages) == 1 and "checkpoint-4" in messages[0] and file in messages[0], messages
    assert resumed.history["iteration"] == [1, 2, 3, 4]
    same_history(straight.history, resumed.history)
    same_parameters(straight.agent, resumed.agent)


def test_ppo_with_no_whole_checkpoint_is_one_sentence_before_any_training(tmp_path, monkeypatch):
    import minigrpo.control.ppo as ppo
    from minigrpo.control import train_ppo

    train_ppo(ppo_config(total_timesteps=2 * 120, output_dir=str(tmp_path), save_steps=1), progress=False)
    _cut(tmp_path / "checkpoint-1" / "trainer_state.pt", "empty")
    _cut(tmp_path / "checkpoint-2" / "agent.pt", "truncated")

    def no_training(*args, **kwargs):
        raise AssertionError("trained before finding that no checkpoint is whole")

    monkeypatch.setattr(ppo, "ppo_epochs", no_training)
    with pytest.warns(UserWarning, match="damaged"), pytest.raises(FileNotFoundError) as info:
        train_ppo(ppo_config(output_dir=str(tmp_path), resume_from_checkpoint=True), progress=False)
    assert str(info.value).startswith("PPOConfig.resume_from_checkpoint=True: no checkpoint in")
    assert "checkpoint-2: agent.pt is damaged" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"checkpoint-1 is damaged \(trainer_state.pt is empty\)"):
        train_ppo(ppo_config(resume_from_checkpoint=str(tmp_path / "checkpoint-1")), progress=False)


def test_a_ppo_save_that_fails_midway_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    """A crash while saving checkpoint-2 (after agent.pt was written, in the trainer state) leaves checkpoint-1 whole
    and no half folder; resuming from it reproduces the uninterrupted run. Saving over an existing checkpoint of the
    same name replaces it whole."""
    import minigrpo.control.onpolicy as onpolicy
    from minigrpo.control import train_ppo

    straight = train_ppo(ppo_config(), progress=False)
    real_save_state = onpolicy.save_state

    def crash_on_the_second(folder, state, config=None):
        if state["step"] == 2:
            assert (folder / "agent.pt").is_file()
            raise OSError("disk full")
        real_save_state(folder, state, config)

    monkeypatch.setattr(onpolicy, "save_state", crash_on_the_second)
    with pytest.raises(OSError, match="disk full"):
        train_ppo(ppo_config(output_dir=str(tmp_path), save_steps=1), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    monkeypatch.setattr(onpolicy, "save_state", real_save_state)
    resumed = train_ppo(ppo_config(output_dir=str(tmp_path), save_steps=1, resume_from_checkpoint=True),
                        progress=False)
    same_history(straight.history, resumed.history)
    same_parameters(straight.agent, resumed.agent)
    before = (tmp_path / "checkpoint-4" / "agent.pt").read_bytes()
    train_ppo(ppo_config(output_dir=str(tmp_path), save_steps=0, total_timesteps=4 * 120 + 1), progress=False)
    assert (tmp_path / "checkpoint-4" / "agent.pt").read_bytes() == before  # the same run saved again: the same
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint-{i}" for i in (1, 2, 3, 4)]


def test_atomic_json_keeps_the_old_file_when_a_write_fails(tmp_path):
    import json
    import os

    from minigrpo.infra.atomic import atomic_write_json

    path = atomic_write_json(tmp_path / "results.json", {"a": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert json.loads(path.read_text()) == {"a": 1} and path.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})  # not JSON: fails before anything replaces the file
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["results.json"]
