"""Rewards for generated digits: ``reward(images [B, C, H, W] in [-1, 1], labels [B]) -> [B]``.

- :class:`ClassifierReward` — **prompt alignment**: how sure a small CNN, trained here on the real
  digits, is that the image shows the prompt's digit. It plays the role a CLIP score or a preference
  model plays for a text-to-image model: a learned judge of "does the image match the prompt".
  ``kind="prob"`` is p(prompt | image) ∈ [0, 1] (saturates near 1), ``kind="logprob"`` its log
  (unbounded below, keeps pushing on the worst samples).
- :func:`digits_judge` — an **independent judge** to report next to the optimised reward: another
  architecture (:class:`DigitMLP`, no convolutions) trained on the other half of the training digits
  (``digits_classifier(half=0)`` is the reward, ``half=1`` the judge), so a blind spot the policy finds in the
  reward's CNN is unlikely to be shared.
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

from minigrpo.infra.checks import check_finite


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


class DigitMLP(nn.Module):
    """A judge of another architecture: pixels → two ReLU layers → logits (~40k parameters, no convolutions)."""

    def __init__(self, image_size: int = 16, channels: int = 1, num_classes: int = 10, width: int = 128):
        super().__init__()
        self.config = {"image_size": image_size, "channels": channels, "num_classes": num_classes, "width": width}
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size**2, width), nn.ReLU(),
                                 nn.Linear(width, width // 2), nn.ReLU(), nn.Linear(width // 2, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


#: The classifier architectures: ``arch`` name → (class, default width).
ARCHS = {"cnn": (DigitClassifier, 16), "mlp": (DigitMLP, 128)}


def train_classifier(images: torch.Tensor, labels: torch.Tensor, epochs: int = 15, batch_size: int = 64,
                     lr: float = 3e-3, noise_std: float = 0.1, seed: int = 0, width: int | None = None,
                     arch: str = "cnn") -> nn.Module:
    """Train a classifier (``arch``: ``"cnn"``, :class:`DigitClassifier`, or ``"mlp"``, :class:`DigitMLP`) on
    ``images`` ``[N, C, H, W]`` in [-1, 1] with labels ``[N]``; ``width`` defaults to the architecture's.

    A little Gaussian noise on the inputs (``noise_std``) makes it less brittle on generated images,
    which are never quite like the training digits.
    """
    _check_batch(images, labels)
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {tuple(ARCHS)}, got {arch!r}")
    cls, default_width = ARCHS[arch]
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = cls(images.shape[-1], images.shape[1], int(labels.max()) + 1, width or default_width)
    model.config["arch"] = arch
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


def training_half(images: torch.Tensor, labels: torch.Tensor, half: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The training digits a classifier learns from: all of the training split (``half=None``), or one of its two
    disjoint, class-stratified halves (``half=0`` or ``1``). The held-out 20 % split is never in either."""
    from minigrpo.diffusion.data import train_test_split

    if half not in (None, 0, 1):
        raise ValueError(f"half must be None (the whole training split), 0 or 1, got {half!r}")
    x_train, y_train, _, _ = train_test_split(images, labels, test_fraction=0.2, seed=0)
    if half is None:
        return x_train, y_train
    x0, y0, x1, y1 = train_test_split(x_train, y_train, test_fraction=0.5, seed=1)
    return (x0, y0) if half == 0 else (x1, y1)


def digits_classifier(image_size: int = 16, seed: int = 0, cache_dir: str | Path | None = None,
                      half: int | None = None, **train_kwargs) -> tuple[nn.Module, float]:
    """A digit classifier trained on the training split of the digits (or one half of it) and cached on disk.

    Returns ``(classifier, accuracy on the held-out split)`` (the fixed 20 % split of
    :func:`minigrpo.diffusion.data.train_test_split`, shared by every classifier here). ``half`` picks the
    training digits (:func:`training_half`); ``train_kwargs`` go to :func:`train_classifier` (``arch="mlp"``
    for the other architecture). The cache file's name hashes every setting, so changing one retrains (a few
    seconds). Default folder: the base model's cache folder.
    """
    from minigrpo.diffusion.data import load_digits_images, train_test_split
    from minigrpo.diffusion.ddpm import default_cache_dir

    images, labels = load_digits_images(image_size)
    x_fit, y_fit = training_half(images, labels, half)
    _, _, x_test, y_test = train_test_split(images, labels, test_fraction=0.2, seed=0)
    settings = {"image_size": image_size, "seed": seed, **({} if half is None else {"half": half}), **train_kwargs}
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(cache_dir or default_cache_dir()) / f"digit_classifier_{key}.pt"
    if path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        config = dict(blob["config"])
        model = ARCHS[config.pop("arch", "cnn")][0](**config)
        model.config["arch"] = blob["config"].get("arch", "cnn")
        model.load_state_dict(blob["state_dict"])
        model.eval().requires_grad_(False)
    else:
        model = train_classifier(x_fit, y_fit, seed=seed, **train_kwargs)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"config": model.config, "state_dict": model.state_dict()}, tmp)
        tmp.replace(path)
    with torch.no_grad():
        acc = (model(x_test).argmax(-1) == y_test).float().mean().item()
    return model, acc


def digits_judge(image_size: int = 16, seed: int = 0, cache_dir: str | Path | None = None) -> tuple[nn.Module, float]:
    """The independent judge: a :class:`DigitMLP` trained on half 1 of the training digits (the reward of lesson
    09 is the CNN of half 0), more epochs since an MLP learns slower; ``(judge, held-out accuracy)``."""
    return digits_classifier(image_size, seed, cache_dir, half=1, arch="mlp", epochs=40)


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
