"""Rewards for generated digits: ``reward(images [B, C, H, W] in [-1, 1], labels [B]) -> [B]``.

- :class:`ClassifierReward` — **prompt alignment**: how sure a small CNN, trained here on the real
  digits, is that the image shows the prompt's digit. It plays the role a CLIP score or a preference
  model plays for a text-to-image model: a learned judge of "does the image match the prompt".
  ``kind="prob"`` is p(prompt | image) ∈ [0, 1] (saturates near 1), ``kind="logprob"`` its log
  (unbounded below, keeps pushing on the worst samples).
- :func:`ink_reward` — the mean brightness of the image: a cheap image statistic that is easy to
  raise without drawing a better digit, for the reward-hacking demonstration.
- :func:`smoothness_reward` — minus the total variation, a pure-torch stand-in for JPEG
  compressibility (DDPO's hackable reward): a blank image is the most "compressible".
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minigrpo._checks import check_finite


def _check_batch(images: torch.Tensor, labels: torch.Tensor | None = None) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a tensor [B, C, H, W], got "
                         f"{tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__}")
    if labels is not None and (labels.ndim != 1 or labels.shape[0] != images.shape[0]):
        raise ValueError(f"labels must be [B] = [{images.shape[0]}], got shape {tuple(labels.shape)}")
    check_finite(images, "images")


class DigitClassifier(nn.Module):
    """A small CNN: two conv blocks and a linear head; ~20k parameters, trains in seconds on a CPU."""

    def __init__(self, image_size: int = 16, channels: int = 1, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.config = {"image_size": image_size, "channels": channels, "num_classes": num_classes, "width": width}
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width * (image_size // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def train_classifier(images: torch.Tensor, labels: torch.Tensor, epochs: int = 15, batch_size: int = 64,
                     lr: float = 3e-3, noise_std: float = 0.1, seed: int = 0, width: int = 16) -> DigitClassifier:
    """Train :class:`DigitClassifier` on ``images`` ``[N, C, H, W]`` in [-1, 1] with labels ``[N]``.

    A little Gaussian noise on the inputs (``noise_std``) makes it less brittle on generated images,
    which are never quite like the training digits.
    """
    _check_batch(images, labels)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = DigitClassifier(images.shape[-1], images.shape[1], int(labels.max()) + 1, width)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n = images.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, batch_size):
            idx = perm[i:i + batch_size]
            x = images[idx] + noise_std * torch.randn(images[idx].shape, generator=g)
            loss = F.cross_entropy(model(x), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval().requires_grad_(False)


def digits_classifier(image_size: int = 16, seed: int = 0, cache_dir: str | Path | None = None,
                      **train_kwargs) -> tuple[DigitClassifier, float]:
    """The judge for prompt alignment, trained on the training split of the digits and cached on disk.

    Returns ``(classifier, accuracy on the held-out split)`` (the fixed 20 % split of
    :func:`minigrpo.diffusion.data.train_test_split`). The cache file's name hashes every setting,
    so changing one retrains (a few seconds). Default folder: the base model's cache folder.
    """
    from minigrpo.diffusion.data import load_digits_images, train_test_split
    from minigrpo.diffusion.ddpm import default_cache_dir

    x_train, y_train, x_test, y_test = train_test_split(*load_digits_images(image_size), test_fraction=0.2, seed=0)
    settings = {"image_size": image_size, "seed": seed, **train_kwargs}
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(cache_dir or default_cache_dir()) / f"digit_classifier_{key}.pt"
    if path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        model = DigitClassifier(**blob["config"])
        model.load_state_dict(blob["state_dict"])
        model.eval().requires_grad_(False)
    else:
        model = train_classifier(x_train, y_train, seed=seed, **train_kwargs)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"config": model.config, "state_dict": model.state_dict()}, tmp)
        tmp.replace(path)
    with torch.no_grad():
        acc = (model(x_test).argmax(-1) == y_test).float().mean().item()
    return model, acc


KINDS = ("prob", "logprob", "margin")


class ClassifierReward:
    """Prompt alignment from a classifier's logits z for an image generated for prompt c.

    - ``"prob"``: p(c | x) = softmax(z / temperature)[c], in [0, 1]. With temperature 1 and a confident
      classifier it saturates: almost every decent digit scores 0.99+. A temperature > 1 keeps it graded.
    - ``"logprob"``: log p(c | x), ≤ 0, unbounded below: it weighs the failures most.
    - ``"margin"``: z_c − max_{j≠c} z_j, unbounded both ways (a scale like a CLIP score's): it keeps rewarding
      ever more prototypical images, which also makes it the easiest to over-optimise.
    """

    def __init__(self, classifier: nn.Module, kind: str = "prob", temperature: float = 1.0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.classifier, self.kind, self.temperature = classifier, kind, float(temperature)
        self.__name__ = f"classifier_{kind}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        _check_batch(images, labels)
        dev = next(self.classifier.parameters()).device
        logits = self.classifier(images.to(dev).clamp(-1, 1)).float()
        idx = labels.to(dev).long().view(-1, 1)
        if self.kind == "margin":
            others = logits.scatter(1, idx, float("-inf"))
            return (logits.gather(1, idx).squeeze(1) - others.max(1).values).cpu()
        logp = torch.log_softmax(logits / self.temperature, -1).gather(1, idx).squeeze(1)
        return (logp if self.kind == "logprob" else logp.exp()).cpu()


def ink_reward(images: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Mean brightness in [0, 1] (pixels mapped from [-1, 1]); ignores the prompt entirely."""
    _check_batch(images, labels)
    return ((images.clamp(-1, 1) + 1) / 2).flatten(1).mean(1).cpu()


def smoothness_reward(images: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Minus the mean absolute difference between neighbouring pixels (anisotropic total variation)."""
    _check_batch(images, labels)
    x = images.clamp(-1, 1)
    tv = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1) + (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    return (-tv).cpu()
