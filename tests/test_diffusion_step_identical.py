"""The diffusion GRPO trainers' step, rewritten as one readable block, trains bit for bit as the step it replaced.

``_reference_diffusion_grpo.py`` and ``_reference_text_to_image_grpo.py`` are frozen copies of the two trainer
modules from before the rewrite (the step then split over ``update``, ``compute_loss`` and ``optimizer_step``).
Each case trains a few steps from the same seeded model with both, μ = 2 and several minibatches (and
micro-batches for text-to-image) so that every path runs, β > 0 so that the KL runs too, and asserts equal
parameters (``torch.equal``) and equal logged metrics (all but the wall times).
"""

from __future__ import annotations

import pytest
import torch
from diffusers import DDPMScheduler

import _reference_diffusion_grpo as reference
from minigrpo.diffusion import grpo
from minigrpo.diffusion.rewards import ink_reward

from tiny_diffusion import tiny_unet

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # one torch thread, restored afterwards (conftest.py)

TIMES = {"sample_time", "step_time"}


def _same_run(a, b, params_a, params_b):
    assert a.history.keys() == b.history.keys()
    for key in a.history.keys() - TIMES:
        assert a.history[key] == b.history[key], key
    assert [name for name, _ in params_a] == [name for name, _ in params_b]
    for (name, p), (_, q) in zip(params_a, params_b):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_diffusion_grpo_step_trains_as_the_reference(beta):
    cfg = dict(max_steps=2, prompts_per_step=2, num_generations=4, num_inference_steps=4, num_iterations=2,
               num_minibatches=2, timestep_fraction=0.5, beta=beta, learning_rate=1e-3, epsilon=0.2)
    runs = []
    for module in (reference, grpo):
        model = tiny_unet()
        trainer = module.DiffusionGRPOTrainer(model, DDPMScheduler(num_train_timesteps=100), ink_reward,
                                              module.DiffusionGRPOConfig(**cfg))
        runs.append((trainer.train(progress=False), list(model.named_parameters())))
    (a, pa), (b, pb) = runs
    assert len(a.history["reward"]) == 2 and ("kl" in a.history) == (beta > 0)
    _same_run(a, b, pa, pb)


def test_text_to_image_grpo_step_trains_as_the_reference(tmp_path):
    pytest.importorskip("peft")
    from peft import LoraConfig

    import _reference_text_to_image_grpo as t2i_reference
    from minigrpo.diffusion import text_to_image_grpo as t2i
    from minigrpo.diffusion.text_to_image import UNET_LORA_TARGETS, TextToImagePolicy, tiny_components
    from minigrpo.diffusion.text_to_image_rewards import ColourReward

    tiny_components(tmp_path, seed=0)
    cfg = dict(max_steps=2, prompts_per_step=2, num_generations=2, num_inference_steps=4, guidance_scale=4.0,
               learning_rate=1e-2, epsilon=0.2, num_iterations=2, num_minibatches=2, train_batch_size=3, beta=0.1,
               max_grad_norm=1e-3)  # small enough that the clip acts
    runs = []
    for module in (t2i_reference, t2i):
        lora = LoraConfig(r=4, lora_alpha=4, target_modules=list(UNET_LORA_TARGETS), init_lora_weights=True)
        torch.manual_seed(0)
        trainer = module.TextToImageGRPOTrainer(TextToImagePolicy.from_pretrained(tmp_path), ColourReward(),
                                                ["a red square", "a blue sky", "a green apple"],
                                                module.TextToImageGRPOConfig(**cfg), peft_config=lora)
        before = [p.detach().clone() for p in trainer.unet.parameters()]
        result = trainer.train(progress=False)
        assert any(not torch.equal(p, q) for p, q in zip(before, trainer.unet.parameters()))  # it trained
        runs.append((result, list(trainer.unet.named_parameters())))
    (a, pa), (b, pb) = runs
    assert a.history["kl"][-1] != 0
    _same_run(a, b, pa, pb)
