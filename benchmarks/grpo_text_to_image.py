"""Seconds per GRPO step and peak memory of the text-to-image path (TextToImageGRPOTrainer).

    .venv/bin/python benchmarks/grpo_text_to_image.py --preset tiny   # CPU, tiny random components (~1 min)
    .venv/bin/python benchmarks/grpo_text_to_image.py --preset gpu    # one CUDA GPU, SD-1.5-shaped model

``gpu``: a UNet, VAE and CLIP text encoder with Stable Diffusion 1.5's shapes (UNet 320/640/1280/1280
channels, cross-attention 768; VAE 128/256/512/512; CLIP ViT-L/14's text tower, 77 tokens), **random
weights** in bf16 (nothing is downloaded: the timings and memory depend on the shapes, not the values),
512×512 images (64×64×4 latents), DDIM η = 1 with 20 steps, the last two (σ ≈ 0.04, 0.02) not trained on
(``min_step_std=0.05``, as in lesson 13's SD-1.5 recipe), guidance 7.5 inside the policy, 8 prompts × G = 4 per
step, ColourReward on the decoded images. Variants: LoRA (r = 16 on to_q/to_k/to_v/to_out.0)
training every step; LoRA with timestep subsampling (``timestep_fraction`` 0.5 and 0.25); and, for
contrast, every UNet weight trained (0.25 of the steps). Each: one warm-up step, then the mean of
``--steps`` steps; the peak is ``torch.cuda.max_memory_allocated`` over the measured steps.

``tiny``: the same run on the tiny components of the tests (8×8 latents, 16×16 images), 2 prompts × G = 4,
10 sampler steps, on the CPU; the peak is the process's peak resident memory (``ru_maxrss``), which only grows.

TRL's DDPOTrainer, the peer this benchmark would compare with, has been removed from TRL: the installed TRL
(1.16) has none, and its last release with DDPO does not install beside today's diffusers here, so no
comparison is run (the script says so when it starts).
"""

from __future__ import annotations

import argparse
import copy
import gc
import resource
import sys
import tempfile
import time

import torch

from minigrpo.diffusion.text_to_image import UNET_LORA_TARGETS, TextToImagePolicy, tiny_components
from minigrpo.diffusion.text_to_image_grpo import TextToImageGRPOConfig, TextToImageGRPOTrainer
from minigrpo.diffusion.text_to_image_rewards import ColourReward

PROMPTS = ["a photo of a red car", "a blue flower", "a green apple", "a yellow house", "a white cat",
           "a black dog", "an orange sunset", "a purple circle", "a cyan square", "a magenta sky"]

PRESETS = {
    "tiny": dict(prompts_per_step=2, num_generations=4, num_inference_steps=10, guidance_scale=7.5,
                 train_batch_size=None, lora_r=4),
    # min_step_std 0.05: SD's DDIM chain at η = 1 ends with σ ≈ 0.041 and 0.021 (for 10, 20 or 50 steps alike; the
    # others are ≥ 0.17 at 20 steps), and a step's ∇log π grows as 1/σ: those two are mostly noise, and lesson 09 /
    # deep dive 09a measured that training on such steps costs reward (0.76 → 0.52 on the digits). 0.05 drops just
    # them, as lesson 13's SD-1.5 recipe does. The tiny preset keeps every step (its published timings stay comparable).
    "gpu": dict(prompts_per_step=8, num_generations=4, num_inference_steps=20, guidance_scale=7.5,
                train_batch_size=8, lora_r=16, min_step_std=0.05),
}
#: (label, LoRA?, timestep_fraction)
VARIANTS = [("LoRA, all steps", True, 1.0), ("LoRA, timestep_fraction 0.5", True, 0.5),
            ("LoRA, timestep_fraction 0.25", True, 0.25), ("full UNet, timestep_fraction 0.25", False, 0.25)]


def sd15_shaped(dtype: torch.dtype, device: str, tokenizer_folder: str) -> TextToImagePolicy:
    """Random components with Stable Diffusion 1.5's shapes (the tokenizer is the tiny one, padded to 77)."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from minigrpo.diffusion.text_to_image import write_tiny_clip_tokenizer

    tok = CLIPTokenizer.from_pretrained(write_tiny_clip_tokenizer(tokenizer_folder, model_max_length=77))
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768)  # the defaults are SD's blocks
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4,
                        sample_size=512)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                                        num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                                        hidden_act="quick_gelu", bos_token_id=tok.bos_token_id,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          set_alpha_to_one=False, steps_offset=1)
    return TextToImagePolicy(text.to(device, dtype), tok, unet.to(device, dtype), vae.to(device, dtype), sched)


def peak_memory(device: str) -> float:
    """GiB: CUDA's peak allocated since the last reset, or the process's peak resident memory."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(base: TextToImagePolicy, preset: dict, lora: bool, fraction: float, steps: int, device: str) -> dict:
    """Mean s/step (after one warm-up step), the sampling share, and the peak memory of one variant."""
    from peft import LoraConfig

    policy = TextToImagePolicy(base.text_encoder, base.tokenizer, copy.deepcopy(base.unet), base.vae, base.scheduler)
    if not lora:
        policy.unet.requires_grad_(True)
    cfg = TextToImageGRPOConfig(max_steps=steps + 1, prompts_per_step=preset["prompts_per_step"],
                                num_generations=preset["num_generations"],
                                num_inference_steps=preset["num_inference_steps"],
                                guidance_scale=preset["guidance_scale"], timestep_fraction=fraction,
                                train_batch_size=preset["train_batch_size"], learning_rate=1e-4 if lora else 1e-5,
                                min_step_std=preset.get("min_step_std", 0.0))
    peft = LoraConfig(r=preset["lora_r"], lora_alpha=preset["lora_r"], target_modules=list(UNET_LORA_TARGETS))
    trainer = TextToImageGRPOTrainer(policy, ColourReward(), PROMPTS, cfg, peft_config=peft if lora else None)
    trainer.step()  # warm-up (kernels, allocator)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    t0 = time.perf_counter()
    sample = 0.0
    for _ in range(steps):
        sample += trainer.step()["sample_time"]
    sync(device)
    s = (time.perf_counter() - t0) / steps
    trainable = sum(p.numel() for p in trainer.unet.parameters() if p.requires_grad)
    out = dict(s_per_step=s, sample_s=sample / steps, peak_gib=peak_memory(device), trainable=trainable)
    del trainer, policy
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per variant (tiny 2, gpu 3)")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    if args.preset == "gpu" and not torch.cuda.is_available():
        print("no CUDA: the gpu preset needs a CUDA GPU (an SD-1.5-shaped UNet at 512×512); "
              "run --preset tiny for the CPU figures")
        return
    import trl

    print(f"TRL {trl.__version__} has no DDPOTrainer: no TRL comparison (DDPO was removed from TRL)"
          if not hasattr(trl, "DDPOTrainer") else f"TRL {trl.__version__} has a DDPOTrainer (comparison not wired)")
    device = "cuda" if args.preset == "gpu" else "cpu"
    steps = args.steps or (3 if args.preset == "gpu" else 2)
    with tempfile.TemporaryDirectory() as folder:
        if args.preset == "gpu":
            torch.manual_seed(0)
            base = sd15_shaped(torch.bfloat16, device, folder)
            where = f"{torch.cuda.get_device_name()}, bf16, SD-1.5-shaped random weights, 512x512 (64x64 latents)"
        else:
            base = tiny_components(folder, seed=0)
            where = f"CPU ({torch.get_num_threads()} threads), float32, tiny random components, 16x16 (8x8 latents)"
    P, G, K = preset["prompts_per_step"], preset["num_generations"], preset["num_inference_steps"]
    floor = f" (steps with sigma < {preset['min_step_std']} not trained on)" if preset.get("min_step_std") else ""
    print(f"{where}; torch {torch.__version__}; {P} prompts x G={G}, DDIM eta=1, {K} steps{floor}, "
          f"guidance {preset['guidance_scale']} (UNet batch doubled); {steps} measured steps after 1 warm-up")
    print(f"{'variant':36s} {'trainable':>11s} {'s/step':>8s} {'sampling':>9s} {'peak GiB':>9s}")
    for label, lora, fraction in VARIANTS:
        m = measure(base, preset, lora, fraction, steps, device)
        print(f"{label:36s} {m['trainable']:>11,d} {m['s_per_step']:8.2f} {m['sample_s']:9.2f} {m['peak_gib']:9.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
