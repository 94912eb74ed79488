"""Rewards for text-to-image GRPO: ``reward(images, prompts) -> tensor [N]``.

``images`` are the decoded samples ``[N, 3, H, W]`` in [0, 1] and ``prompts`` the N prompt strings (each
image's own prompt, so a group's G images share one). Any function with that signature plugs in — an
aesthetic predictor, a CLIP or VLM judge, a detector — the way TRL's reward functions take completions
and prompts. Two are shipped:

- :class:`ColourReward`: how close the image is to the colour its prompt names ("a red square" → red).
  Cheap, exact and easy to read: the lesson's tiny end-to-end run uses it.
- :func:`smoothness_reward`: minus the image's total variation, a stand-in for DDPO's compressibility reward;
  prompt-blind, and the one the tiny random models can move (their random VAE decoder can barely change colours).
- :class:`CLIPScoreReward`: the cosine similarity between CLIP's embeddings of the image and of the prompt
  (Hessel et al. 2021, CLIPScore, arXiv:2104.08718, without their ×2.5 rescaling), for a ``CLIPModel``
  passed in (a real one where a hub is reachable, a tiny random one in the tests).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

#: RGB in [0, 1] of the colour words :class:`ColourReward` understands
COLOURS = {"red": (1.0, 0.0, 0.0), "green": (0.0, 1.0, 0.0), "blue": (0.0, 0.0, 1.0), "yellow": (1.0, 1.0, 0.0),
           "cyan": (0.0, 1.0, 1.0), "magenta": (1.0, 0.0, 1.0), "white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0),
           "gray": (0.5, 0.5, 0.5), "orange": (1.0, 0.5, 0.0), "purple": (0.5, 0.0, 0.5)}

#: CLIP's image normalisation (the mean and std of its training images, per RGB channel)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _check_inputs(images: torch.Tensor, prompts, name: str) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"{name}: images must be a [N, 3, H, W] tensor, got "
                         f"{tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__}")
    if isinstance(prompts, str) or len(prompts) != images.shape[0]:
        raise ValueError(f"{name}: prompts must be a list of one str per image ({images.shape[0]}), got {prompts!r}")


def colour_of(prompt: str) -> tuple[float, float, float]:
    """The RGB of the first colour word of ``prompt`` (see :data:`COLOURS`), or a ValueError."""
    for word in re.findall(r"[a-z]+", prompt.lower()):
        if word in COLOURS:
            return COLOURS[word]
    raise ValueError(f"ColourReward: the prompt {prompt!r} names no colour (known: {', '.join(COLOURS)})")


class ColourReward:
    """``1 − mean |pixel − colour|`` over pixels and channels, with the colour named in each prompt; in [0, 1].

    1 is an image of exactly that colour; a uniform grey scores 0.5 for any saturated colour. A pure
    function of the pixels: cheap, deterministic and differentiable (so it also serves for checks).
    """

    __name__ = "colour_reward"

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        _check_inputs(images, prompts, "ColourReward")
        target = torch.tensor([colour_of(p) for p in prompts], dtype=images.dtype, device=images.device)
        return 1 - (images - target[:, :, None, None]).abs().mean((1, 2, 3))


def brightness_reward(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """The mean pixel value in [0, 1] (the prompt is ignored): the simplest reward there is, and easy to game."""
    _check_inputs(images, prompts, "brightness_reward")
    return images.mean((1, 2, 3))


def smoothness_reward(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Minus the total variation ``mean |x[i+1, j] − x[i, j]| + mean |x[i, j+1] − x[i, j]|`` (the prompt is ignored).

    A cheap, differentiable stand-in for DDPO's compressibility reward (the JPEG size of the image): smooth images
    compress well. 0 for a flat image; about −0.25 for the tiny random model's noise images.
    """
    _check_inputs(images, prompts, "smoothness_reward")
    dy = (images[..., 1:, :] - images[..., :-1, :]).abs().mean((1, 2, 3))
    dx = (images[..., :, 1:] - images[..., :, :-1]).abs().mean((1, 2, 3))
    return -(dx + dy)


class CLIPScoreReward:
    """Cosine similarity of CLIP's image and text embeddings, in [−1, 1] (higher: the image fits its prompt).

    Args:
        model: a ``transformers.CLIPModel``; kept frozen, on its own device and dtype.
        tokenizer: its ``CLIPTokenizer``.

    The images are resized (bilinear, antialiased) to the vision tower's ``image_size`` and normalised with
    CLIP's mean and std, as ``CLIPImageProcessor`` would up to its centre crop (our images are square).
    """

    __name__ = "clip_score"

    def __init__(self, model, tokenizer):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.size = model.config.vision_config.image_size

    def pixel_values(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, 3, S, S]`` CLIP inputs from images in [0, 1]."""
        x = F.interpolate(images.float(), size=(self.size, self.size), mode="bilinear", antialias=True,
                          align_corners=False)
        mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        _check_inputs(images, prompts, "CLIPScoreReward")
        device, dtype = self.model.device, self.model.dtype
        tok = self.tokenizer(list(prompts), padding=True, truncation=True, return_tensors="pt").to(device)
        out = self.model(input_ids=tok.input_ids, attention_mask=tok.attention_mask,
                         pixel_values=self.pixel_values(images.to(device)).to(dtype))
        img = F.normalize(out.image_embeds.float(), dim=-1)
        txt = F.normalize(out.text_embeds.float(), dim=-1)
        return (img * txt).sum(-1)


__all__ = ["CLIPScoreReward", "COLOURS", "ColourReward", "brightness_reward", "colour_of", "smoothness_reward"]
