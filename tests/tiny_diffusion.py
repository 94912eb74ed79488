"""A tiny class-conditional UNet for the diffusion tests: two 8/16-channel blocks on 8×8 images, built in
milliseconds, so the tests exercise the real diffusers model class without training a real one."""

import torch
from diffusers import UNet2DModel


def tiny_unet(seed: int = 0, size: int = 8, num_class_embeds: int = 10) -> UNet2DModel:
    """A seeded ``UNet2DModel`` of ``size``×``size`` one-channel images with ``num_class_embeds`` classes."""
    torch.manual_seed(seed)
    return UNet2DModel(sample_size=size, in_channels=1, out_channels=1, num_class_embeds=num_class_embeds,
                       block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
