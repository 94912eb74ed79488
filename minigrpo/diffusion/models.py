"""The base model's parts, built from diffusers: a class-conditional ``UNet2DModel`` and a ``DDPMScheduler``.

The UNet is tiny (~0.27M parameters at 16×16) so that training and sampling run on a laptop CPU.
It has ``num_classes + 1`` class embeddings: index ``num_classes`` is the "null" prompt, used for
classifier-free guidance (the base model is trained with some labels dropped to it).

Both parts save and load with ``save_pretrained`` / ``from_pretrained`` into the subfolders
``unet`` and ``scheduler`` of one folder, as a diffusers pipeline does.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import DDPMScheduler, UNet2DModel

#: Defaults chosen for 16×16 digits on a CPU (see lesson 08).
NUM_TRAIN_TIMESTEPS = 100
BETA_SCHEDULE = "squaredcos_cap_v2"


def make_unet(image_size: int = 16, num_classes: int = 10, block_out_channels: tuple[int, ...] = (16, 32, 32),
              layers_per_block: int = 1, norm_num_groups: int = 8, seed: int | None = None) -> UNet2DModel:
    """A randomly initialised class-conditional UNet for 1-channel ``image_size``² images.

    ``unet(x_t, t, class_labels=y).sample`` predicts the noise ε; ``y`` in 0..num_classes-1, or
    ``num_classes`` (see :func:`null_class`) for "no prompt". ``image_size`` must be divisible by
    2**(len(block_out_channels) - 1).
    """
    levels = len(block_out_channels)
    if image_size % 2 ** (levels - 1):
        raise ValueError(f"image_size must be divisible by {2 ** (levels - 1)} for {levels} levels, got {image_size}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if seed is not None:
        torch.manual_seed(seed)
    return UNet2DModel(
        sample_size=image_size, in_channels=1, out_channels=1,
        block_out_channels=tuple(block_out_channels), layers_per_block=layers_per_block,
        down_block_types=("DownBlock2D",) * levels, up_block_types=("UpBlock2D",) * levels,
        norm_num_groups=norm_num_groups, num_class_embeds=num_classes + 1,
    )


def null_class(unet: UNet2DModel) -> int:
    """The index of the "no prompt" embedding (= the number of real classes)."""
    return int(unet.config.num_class_embeds) - 1


def make_scheduler(num_train_timesteps: int = NUM_TRAIN_TIMESTEPS, beta_schedule: str = BETA_SCHEDULE,
                   **kwargs) -> DDPMScheduler:
    """A ``DDPMScheduler`` (ε-prediction, x̂0 clipped to [-1, 1], variance "fixed_small").

    The cosine schedule ("squaredcos_cap_v2") does not depend on the number of steps, so 100
    training steps still end in almost pure noise (ᾱ_T ≈ 0); the default linear betas
    (1e-4 → 0.02) are tuned for 1,000 steps. ``DDIMScheduler.from_config(s.config)`` gives the
    matching DDIM scheduler.
    """
    return DDPMScheduler(num_train_timesteps=num_train_timesteps, beta_schedule=beta_schedule,
                         prediction_type="epsilon", **kwargs)


def save_base_model(unet: UNet2DModel, scheduler: DDPMScheduler, folder: str | Path) -> Path:
    """Write ``folder/unet`` and ``folder/scheduler`` with ``save_pretrained``; returns ``folder``."""
    folder = Path(folder)
    unet.save_pretrained(folder / "unet")
    scheduler.save_pretrained(folder / "scheduler")
    return folder


def load_base_model(folder: str | Path) -> tuple[UNet2DModel, DDPMScheduler]:
    """Read back what :func:`save_base_model` wrote (the UNet in eval mode)."""
    folder = Path(folder)
    if not (folder / "unet").is_dir() or not (folder / "scheduler").is_dir():
        raise ValueError(f"{folder} must contain the subfolders 'unet' and 'scheduler' (see save_base_model)")
    unet = UNet2DModel.from_pretrained(folder / "unet")
    scheduler = DDPMScheduler.from_pretrained(folder / "scheduler")
    return unet.eval(), scheduler
