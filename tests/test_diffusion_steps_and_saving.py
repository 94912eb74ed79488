"""The diffusion trainers' floor on σ (``min_step_std``, in both trainers) and their writes that are whole or not at
all: checkpoints, LoRA adapters, ``results.json``, the cached base models; resuming past a damaged newest checkpoint.

Small seeded models only (``tiny_diffusion.tiny_unet``, ``text_to_image.tiny_components``): nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import DDPMScheduler

from minigrpo.diffusion.grpo import (DiffusionGRPOConfig, DiffusionGRPOTrainer, process_stds, select_steps,
                                     trainable_steps)
from minigrpo.diffusion.rewards import ink_reward
from tiny_diffusion import tiny_unet

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # one torch thread, restored afterwards (conftest.py)

PROMPTS = ["a red square", "a blue sky", "a green apple"]
TIMINGS = ("step_time", "sample_time")


def digits_trainer(**kw) -> DiffusionGRPOTrainer:
    cfg = DiffusionGRPOConfig(**{"max_steps": 4, "prompts_per_step": 2, "num_generations": 2,
                                 "num_inference_steps": 3, "learning_rate": 1e-3, "beta": 0.1,
                                 "timestep_fraction": 0.67, "num_iterations": 2, "num_minibatches": 2, **kw})
    return DiffusionGRPOTrainer(tiny_unet(seed=0), DDPMScheduler(num_train_timesteps=100), ink_reward, cfg)


def same_run(a, b) -> None:
    """The same metric history (wall-clock timings aside) and the same weights, bit for bit."""
    assert {k for k in a.history if k not in TIMINGS} == {k for k in b.history if k not in TIMINGS}
    for key in a.history:
        if key not in TIMINGS:
            assert a.history[key] == b.history[key], key
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --------------------------------------------------------------------------- min_step_std
def test_trainable_steps_keeps_the_stochastic_steps_at_or_above_the_floor():
    stds = torch.tensor([0.8, 0.5, 0.05, 0.02, 0.0])
    assert trainable_steps(stds, 0.05).tolist() == [True, True, True, False, False]  # σ = 0.05 itself is kept
    assert trainable_steps(stds).tolist() == (stds > 0).tolist()  # 0: every stochastic step, as before
    with pytest.raises(ValueError, match=r"^min_step_std=0\.9 leaves no step to train on: the largest σ of the chain "
                                         r"is 0\.8 \(lower min_step_std, or raise eta\)$"):
        trainable_steps(stds, 0.9)


def test_digits_trainer_refuses_a_floor_above_every_sigma_before_sampling():
    stds = process_stds(digits_trainer().process)
    with pytest.raises(ValueError, match="min_step_std=1 leaves no step to train on"):
        digits_trainer(min_step_std=1.0)
    trainer = digits_trainer(min_step_std=float(stds[stds > 0].min()) + 1e-3, timestep_fraction=1.0)
    assert trainer.rollout().steps.unique().tolist() == torch.nonzero(stds >= float(stds[stds > 0].min()) + 1e-3
                                                                       ).flatten().tolist()


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    from minigrpo.diffusion.text_to_image import tiny_components

    folder = tmp_path_factory.mktemp("tiny-sd")
    tiny_components(folder, seed=0)
    return folder


def t2i_trainer(folder, **overrides):
    from peft import LoraConfig

    from minigrpo.diffusion.text_to_image import UNET_LORA_TARGETS, TextToImagePolicy
    from minigrpo.diffusion.text_to_image_grpo import TextToImageGRPOConfig, TextToImageGRPOTrainer
    from minigrpo.diffusion.text_to_image_rewards import ColourReward

    cfg = dict(max_steps=2, prompts_per_step=2, num_generations=2, num_inference_steps=10, guidance_scale=4.0,
               learning_rate=1e-2, epsilon=0.2, num_minibatches=2)
    cfg.update(overrides)
    torch.manual_seed(0)  # the LoRA initialisation
    return TextToImageGRPOTrainer(TextToImagePolicy.from_pretrained(folder), ColourReward(), PROMPTS,
                                  TextToImageGRPOConfig(**cfg),
                                  peft_config=LoraConfig(r=4, lora_alpha=4, target_modules=list(UNET_LORA_TARGETS)))


def test_text_to_image_config_validates_min_step_std_in_one_sentence(pipeline_folder):
    from minigrpo.diffusion.text_to_image_grpo import TextToImageGRPOConfig

    assert TextToImageGRPOConfig().min_step_std == 0.0  # the default trains on every stochastic step
    with pytest.raises(ValueError, match=r"^TextToImageGRPOConfig\.min_step_std must be >= 0, got -0\.1$"):
        TextToImageGRPOConfig(min_step_std=-0.1)
    with pytest.raises(ValueError, match=r"^min_step_std=0\.9 leaves no step to train on: the largest σ of the chain "
                                         r"is 0\.77"):
        t2i_trainer(pipeline_folder, min_step_std=0.9)  # before any sampling


def test_text_to_image_steps_below_the_floor_are_never_trained_on(pipeline_folder, monkeypatch):
    """Stable Diffusion's schedule (the tiny model's), DDIM η = 1, 10 steps: the last two σ are 0.041 and 0.021. With
    ``min_step_std=0.05`` every loss term of a step comes from steps 0-7 (each of them, every chain: fraction 1),
    never from 8 or 9; with the default 0 all ten are trained on."""
    import minigrpo.diffusion.text_to_image_grpo as t2i

    trained = []
    real = t2i.grpo_step_loss

    def spy(process, model, chain, chains, steps, *args, **kw):
        trained.append(torch.stack([chains, steps[:, 0]], 1))  # the (chain, step) rows of this loss
        return real(process, model, chain, chains, steps, *args, **kw)

    monkeypatch.setattr(t2i, "grpo_step_loss", spy)
    trainer = t2i_trainer(pipeline_folder, min_step_std=0.05)
    sigmas = process_stds(trainer.process)
    assert sigmas[-2:].tolist() == pytest.approx([0.041, 0.021], abs=1e-3) and (sigmas[:-2] > 0.2).all()
    trainer.step()
    rows = torch.cat(trained)
    assert sorted(map(tuple, rows.tolist())) == [(b, k) for b in range(4) for k in range(8)]  # each row once
    ro = trainer.rollout()
    assert ro.steps.shape == (4, 8) and ro.steps.max() == 7
    assert t2i_trainer(pipeline_folder).rollout().steps.shape == (4, 10)  # the default keeps every step
    half = t2i_trainer(pipeline_folder, min_step_std=0.05, timestep_fraction=0.5)
    for _ in range(3):
        assert (half.rollout().steps < 8).all()  # a random half of steps 0-7


def test_select_steps_only_draws_from_the_mask():
    g = torch.Generator().manual_seed(0)
    mask = trainable_steps(torch.tensor([0.7, 0.6, 0.3, 0.04, 0.02]), 0.05)
    assert set(select_steps(mask, 200, 0.34, g).flatten().tolist()) == {0, 1, 2}


# --------------------------------------------------------------------------- whole or not at all
def test_a_digits_checkpoint_save_that_fails_midway_leaves_the_previous_one(tmp_path, monkeypatch):
    import minigrpo.diffusion.grpo as grpo

    trainer = digits_trainer(max_steps=2)
    trainer.step()
    folder = trainer.save_checkpoint(tmp_path / "ckpt")
    saved = {p.name: p.read_bytes() for p in folder.iterdir()}
    trainer.step()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(grpo, "save_state", crash)  # the weights are written, the trainer state fails
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(tmp_path / "ckpt")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folder left behind


@pytest.mark.parametrize("how", ["truncated trainer_state.pt", "truncated diffusion_pytorch_model.safetensors",
                                 "missing trainer_state.pt"])
def test_digits_resume_falls_back_past_a_damaged_newest_checkpoint(tmp_path, how):
    """Checkpoints 1-3, the newest damaged as a kill -9 mid-write would leave it: resuming warns once, naming it,
    continues from checkpoint-2 and reproduces the uninterrupted run exactly."""
    straight = digits_trainer().train(progress=False)
    digits_trainer(max_steps=3, output_dir=str(tmp_path), save_steps=1).train(progress=False)
    newest = tmp_path / "checkpoint-3"
    name = how.split()[-1]
    if how.startswith("missing"):
        (newest / name).unlink()
    else:
        data = (newest / name).read_bytes()
        (newest / name).write_bytes(data[: len(data) // 2])
    with pytest.warns(UserWarning) as caught:
        resumed = digits_trainer(output_dir=str(tmp_path), resume_from_checkpoint=True).train(progress=False)
    messages = [str(w.message) for w in caught if "damaged checkpoint" in str(w.message)]
    assert len(messages) == 1 and "checkpoint-3" in messages[0], messages
    assert resumed.history["step"] == [1, 2, 3, 4]
    same_run(straight, resumed)


def test_adapters_save_that_fails_midway_leaves_the_previous_ones(pipeline_folder, tmp_path, monkeypatch):
    trainer = t2i_trainer(pipeline_folder, num_inference_steps=4)
    trainer.save_adapter(tmp_path / "lora")
    saved = {p.name: p.read_bytes() for p in (tmp_path / "lora").iterdir()}
    assert "adapter_config.json" in saved
    trainer.step()
    real = trainer.unet.save_pretrained

    def half_then_crash(folder, *args, **kwargs):
        real(folder, *args, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(trainer.unet, "save_pretrained", half_then_crash)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_adapter(tmp_path / "lora")
    assert {p.name: p.read_bytes() for p in (tmp_path / "lora").iterdir()} == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora"]


def test_results_json_is_replaced_whole_or_not_at_all(tmp_path):
    from minigrpo.diffusion.recipes import DiffusionRunResult, save_diffusion_run
    from minigrpo.diffusion.grpo import DiffusionGRPOResult

    def run(history):
        return DiffusionRunResult(DiffusionGRPOResult(torch.nn.Linear(1, 1), history, {"seed": 0}), 0.4, 0.7, 10)

    path = save_diffusion_run(tmp_path / "out", run({"reward": [0.5]}), seed=0)
    assert path == tmp_path / "out" / "results.json"
    first = json.loads(path.read_text())
    assert first["reward_after"] == 0.7 and first["history"] == {"reward": [0.5]}

    class Unprintable:
        def __str__(self):
            raise RuntimeError("cannot serialise")

    with pytest.raises(RuntimeError, match="cannot serialise"):
        save_diffusion_run(tmp_path / "out", run({"reward": [Unprintable()]}), seed=0)
    assert json.loads(path.read_text()) == first and [p.name for p in path.parent.iterdir()] == ["results.json"]


def test_a_cached_base_model_is_written_whole_and_a_concurrent_one_is_kept(tmp_path):
    from minigrpo.diffusion.ddpm import cache_trained_model
    from minigrpo.diffusion.models import load_base_model

    folder = tmp_path / "cache" / "abc"
    cache_trained_model(folder, tiny_unet(seed=0), DDPMScheduler(num_train_timesteps=100), {"losses": [1.0]})
    assert sorted(p.name for p in folder.iterdir()) == ["scheduler", "train.json", "unet"]
    unet, _ = load_base_model(folder)
    assert all(torch.equal(a, b) for a, b in zip(unet.state_dict().values(), tiny_unet(seed=0).state_dict().values()))
    cache_trained_model(folder, tiny_unet(seed=1), DDPMScheduler(num_train_timesteps=100), {"losses": [2.0]})
    assert json.loads((folder / "train.json").read_text()) == {"losses": [1.0]}  # the first one cached is kept
    assert [p.name for p in folder.parent.iterdir()] == ["abc"]


# --------------------------------------------------------------------------- flow vs DDPM table
def test_flow_vs_ddpm_table_reports_the_sample_sd_and_says_so():
    from minigrpo_course.experiments.flow_digits import results_table

    rows = [dict(kind="ddpm", seed=s, before=b, after=a, s_per_step=2.0)
            for s, (b, a) in enumerate([(0.59, 0.87), (0.52, 0.86), (0.50, 0.86)])]
    table = results_table(rows)
    assert "0.537 ± 0.047 (3 seeds)" in table  # sample sd (n − 1); the population sd would be 0.039
    assert "0.863 ± 0.006 (3 seeds)" in table and "sample standard deviation over seeds (n − 1)" in table
    assert "0.590 (1 seed: no spread)" in results_table(rows[:1])
