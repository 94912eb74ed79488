"""Lesson 13's plumbing (minigrpo_course.experiments.t2i) on tiny random components built in a temporary folder.

The fixed-noise evaluation must be a pure measurement: the same number twice, and the trainer's generator and
group size left as they were, so that the training run after it is the one it would have been without it.
"""

from __future__ import annotations

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
pytest.importorskip("diffusers")
pytest.importorskip("peft")

from minigrpo.diffusion.text_to_image import TextToImagePolicy, tiny_components  # noqa: E402
from minigrpo.diffusion.text_to_image_grpo import TextToImageGRPOConfig, TextToImageGRPOTrainer  # noqa: E402
from minigrpo.diffusion.text_to_image_rewards import smoothness_reward  # noqa: E402
from minigrpo_course.experiments.t2i import evaluate, quiet_hub_logging, run_summary, show_images  # noqa: E402

PROMPTS = ["a red square", "a blue sky", "a green apple"]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-sd")
    tiny_components(folder, seed=0)
    cfg = TextToImageGRPOConfig(max_steps=1, prompts_per_step=2, num_generations=2, num_inference_steps=3,
                                guidance_scale=4.0, seed=5)
    return TextToImageGRPOTrainer(TextToImagePolicy.from_pretrained(folder), smoothness_reward, PROMPTS, cfg)


def test_evaluate_is_repeatable_and_leaves_the_trainer_as_it_was(trainer):
    gen, state = trainer.gen, trainer.gen.get_state().clone()
    first = evaluate(trainer, per_prompt=3, prompts_per_rollout=2)
    second = evaluate(trainer, PROMPTS, per_prompt=3, prompts_per_rollout=2)
    assert first == second
    assert trainer.gen is gen and torch.equal(trainer.gen.get_state(), state)
    assert trainer.cfg.num_generations == 2
    assert evaluate(trainer, per_prompt=3, seed=7) != first   # other noise, another mean


def test_evaluate_is_the_mean_of_the_rollouts_it_replaces(trainer):
    saved = trainer.gen
    trainer.gen, trainer.cfg.num_generations = torch.Generator().manual_seed(1234), 2
    by_hand = torch.cat([trainer.rollout(PROMPTS[:2]).rewards, trainer.rollout(PROMPTS[2:]).rewards]).mean().item()
    trainer.gen = saved
    assert evaluate(trainer, per_prompt=2, prompts_per_rollout=2) == by_hand


def test_bad_arguments_are_refused_in_one_sentence(trainer):
    with pytest.raises(ValueError, match="per_prompt must be >= 2"):
        evaluate(trainer, per_prompt=1)
    with pytest.raises(ValueError, match="prompts_per_rollout must be >= 1"):
        evaluate(trainer, prompts_per_rollout=0)
    with pytest.raises(ValueError, match=r"images must be a tensor \[N, 3, H, W\]"):
        show_images(torch.zeros(2, 16, 16))
    with pytest.raises(ValueError, match="titles has 1 entries for 2 images"):
        show_images(torch.zeros(2, 3, 4, 4), titles=["one"])


def test_show_images_and_run_summary():
    quiet_hub_logging()
    show_images(torch.rand(5, 3, 4, 4), titles=list("abcde"), rows=2, suptitle="grid")
    line = run_summary("seed 0", dict(before=-0.25, after=-0.2, curve=[-0.3] * 5 + [-0.1] * 5, clip=0.04,
                                      trainable=119_328, seconds=53.2))
    assert line == ("seed 0: eval reward -0.2500 -> -0.2000 (+0.0500); training reward first/last 5 steps "
                    "-0.3000 / -0.1000; clip fraction 0.040; 119,328 LoRA weights; 53 s")
