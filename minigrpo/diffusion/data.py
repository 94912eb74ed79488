"""Digit images that ship with scikit-learn, as a tiny text-to-image data set: the class is the prompt.

``sklearn.datasets.load_digits`` holds 1,797 handwritten digits of 8×8 pixels (values 0–16) bundled
with the library, so nothing is downloaded. They are scaled to [-1, 1] (the range DDPM works in) and
upsampled bilinearly to ``size``×``size``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: The "prompt" of class k is ``DIGIT_PROMPTS[k]``; the models are conditioned on the class index.
DIGIT_PROMPTS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
NUM_CLASSES = len(DIGIT_PROMPTS)


def load_digits_images(size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as ``(images, labels)``.

    ``images``: float32 ``[N, 1, size, size]`` in [-1, 1] (-1 is background, +1 full ink);
    ``labels``: int64 ``[N]`` in 0..9. ``size=8`` returns the original pixels, rescaled.
    """
    from sklearn.datasets import load_digits

    if not isinstance(size, int) or isinstance(size, bool) or size < 8:
        raise ValueError(f"size must be an int >= 8 (the digits are 8x8), got {size!r}")
    digits = load_digits()
    x = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # [N, 1, 8, 8] in [0, 1]
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    images = (x * 2.0 - 1.0).clamp(-1.0, 1.0)
    labels = torch.as_tensor(digits.target, dtype=torch.int64)
    return images.contiguous(), labels


def train_test_split(images: torch.Tensor, labels: torch.Tensor, test_fraction: float = 0.2,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed, class-stratified split: ``(train_images, train_labels, test_images, test_labels)``.

    Each class contributes ``round(test_fraction * count)`` test images, chosen by a seeded
    permutation, so the same ``seed`` always gives the same split.
    """
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"images and labels must have the same length, got {images.shape[0]} and {labels.shape[0]}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    g = torch.Generator().manual_seed(seed)
    test_mask = torch.zeros(labels.shape[0], dtype=torch.bool)
    for c in labels.unique():
        idx = (labels == c).nonzero().squeeze(1)
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        test_mask[idx[: round(test_fraction * idx.numel())]] = True
    return images[~test_mask], labels[~test_mask], images[test_mask], labels[test_mask]
