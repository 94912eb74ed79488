"""DDPM: forward noising in closed form, the ε-prediction loss, training, ancestral sampling, the base model.

Notation (Ho et al., 2020): β_t is the variance schedule, α_t = 1 − β_t, ᾱ_t = α_1 ⋯ α_t
(``scheduler.alphas_cumprod[t]``). The forward process adds Gaussian noise step by step; its
t-step marginal has the closed form  x_t = √ᾱ_t · x_0 + √(1 − ᾱ_t) · ε,  ε ~ N(0, I).
The network learns to predict ε from (x_t, t, class); sampling runs the learned reverse chain with
the diffusers scheduler's ``step``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import diffusers
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, SchedulerMixin, UNet2DModel
from diffusers.optimization import get_cosine_schedule_with_warmup
from tqdm.auto import tqdm

from ..infra.checks import check_value
from ..utils import torch_threads
from .data import NUM_CLASSES, load_digits_images
from .models import load_base_model, make_scheduler, make_unet, null_class, save_base_model


def _check_images(x: torch.Tensor, name: str, unet: UNet2DModel | None = None) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 4:
        raise ValueError(f"{name} must be a float tensor [B, C, H, W], got "
                         f"{type(x).__name__}{tuple(x.shape) if isinstance(x, torch.Tensor) else ''}")
    if unet is not None:
        c, s = unet.config.in_channels, unet.config.sample_size
        if tuple(x.shape[1:]) != (c, s, s):
            raise ValueError(f"{name} must be [B, {c}, {s}, {s}] for this UNet, got {tuple(x.shape)}")


def check_labels(labels: torch.Tensor, unet: UNet2DModel, batch: int | None = None, allow_null: bool = True) -> torch.Tensor:
    """``labels`` as an int64 tensor ``[B]`` of valid class indices (the null class if ``allow_null``)."""
    labels = torch.as_tensor(labels)
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dim() != 1:
        raise ValueError(f"labels must be a 1-D integer tensor, got dtype {labels.dtype} shape {tuple(labels.shape)}")
    top = null_class(unet) + (1 if allow_null else 0)
    if labels.numel() and (labels.min() < 0 or labels.max() >= top):
        raise ValueError(f"labels must be in [0, {top - 1}], got values from {int(labels.min())} to {int(labels.max())}")
    if batch is not None and labels.shape[0] != batch:
        raise ValueError(f"labels must have one entry per image ({batch}), got {labels.shape[0]}")
    return labels.long()


def q_sample(x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, alphas_cumprod: torch.Tensor) -> torch.Tensor:
    """Sample x_t ~ q(x_t | x_0) in one shot: √ᾱ_t · x0 + √(1 − ᾱ_t) · noise.

    ``x0`` and ``noise``: ``[B, ...]``; ``t``: integer ``[B]`` (one timestep per sample, 0-based as
    in diffusers, so ``t = 0`` already adds β_1's noise); ``alphas_cumprod``: ``[T]``. Computed in
    the dtype of ``x0``; equals ``DDPMScheduler.add_noise``.
    """
    if x0.shape != noise.shape:
        raise ValueError(f"x0 and noise must have the same shape, got {tuple(x0.shape)} and {tuple(noise.shape)}")
    t = torch.as_tensor(t)
    if t.dtype.is_floating_point or t.dim() != 1 or t.shape[0] != x0.shape[0]:
        raise ValueError(f"t must be an integer tensor [B] with B = {x0.shape[0]}, got dtype {t.dtype} shape {tuple(t.shape)}")
    if t.numel() and (t.min() < 0 or t.max() >= alphas_cumprod.shape[0]):
        raise ValueError(f"t must be in [0, {alphas_cumprod.shape[0] - 1}], got {int(t.min())}..{int(t.max())}")
    abar = alphas_cumprod.to(device=x0.device, dtype=x0.dtype)[t.to(x0.device)]
    abar = abar.view(-1, *([1] * (x0.dim() - 1)))
    return abar.sqrt() * x0 + (1.0 - abar).sqrt() * noise


def ddpm_loss(unet: UNet2DModel, x0: torch.Tensor, labels: torch.Tensor, scheduler: DDPMScheduler,
              generator: torch.Generator | None = None, p_uncond: float = 0.0) -> torch.Tensor:
    """The simple ε-prediction loss ‖ε − ε_θ(x_t, t, y)‖², averaged over pixels and the batch.

    t is drawn uniformly from the scheduler's training steps for each image; with probability
    ``p_uncond`` a label is replaced by the null class (training for classifier-free guidance).
    """
    _check_images(x0, "x0", unet)
    labels = check_labels(labels, unet, batch=x0.shape[0])
    if not 0.0 <= p_uncond <= 1.0:
        raise ValueError(f"p_uncond must be in [0, 1], got {p_uncond}")
    b, dev = x0.shape[0], x0.device
    t = torch.randint(0, scheduler.config.num_train_timesteps, (b,), generator=generator).to(dev)
    noise = torch.randn(x0.shape, generator=generator, dtype=x0.dtype).to(dev)
    if p_uncond > 0:
        drop = torch.rand(b, generator=generator).to(dev) < p_uncond
        labels = torch.where(drop, torch.full_like(labels, null_class(unet)), labels.to(dev))
    x_t = q_sample(x0, t, noise, scheduler.alphas_cumprod)
    eps = unet(x_t, t, class_labels=labels.to(dev)).sample
    return F.mse_loss(eps, noise)


def train_ddpm(unet: UNet2DModel, scheduler: DDPMScheduler, images: torch.Tensor, labels: torch.Tensor,
               steps: int, batch_size: int = 64, lr: float = 2e-3, seed: int = 0, p_uncond: float = 0.1,
               warmup_steps: int | None = None, threads: int | None = 1, progress: bool = True) -> list[float]:
    """Train ``unet`` in place with AdamW and a warmup + cosine learning rate; returns the loss per step.

    Mini-batches are drawn with replacement from ``(images, labels)`` by a generator seeded with
    ``seed``, so a run is reproducible. ``threads``: torch threads during training (1 is fastest
    for this tiny UNet on a small, shared CPU; ``None`` leaves the setting alone).
    """
    def loss_fn(x0, y, g):
        return ddpm_loss(unet, x0, y, scheduler, generator=g, p_uncond=p_uncond)

    return train_denoiser(unet, images, labels, loss_fn, steps, batch_size=batch_size, lr=lr, seed=seed,
                          warmup_steps=warmup_steps, threads=threads, progress=progress, desc="DDPM")


def train_denoiser(unet: UNet2DModel, images: torch.Tensor, labels: torch.Tensor,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor], steps: int,
                   batch_size: int = 64, lr: float = 2e-3, seed: int = 0, warmup_steps: int | None = None,
                   threads: int | None = 1, progress: bool = True, desc: str = "train") -> list[float]:
    """The training loop shared by :func:`train_ddpm` and flow matching's ``train_flow``: ``loss_fn(x0, labels,
    generator)`` on mini-batches drawn with replacement by a generator seeded with ``seed`` (which ``loss_fn``
    also draws its noise from), AdamW with warmup + cosine learning rate and gradient-norm clipping at 1.
    Returns the loss per step; ``unet`` is trained in place and left in eval mode."""
    _check_images(images, "images", unet)
    labels = check_labels(labels, unet, batch=images.shape[0], allow_null=False)
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    dev = next(unet.parameters()).device
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(unet.parameters(), lr=lr, weight_decay=0.0, foreach=True)
    warmup = min(100, steps // 10) if warmup_steps is None else warmup_steps
    lr_sched = get_cosine_schedule_with_warmup(opt, warmup, steps)
    unet.train()
    losses = []
    with torch_threads(threads or torch.get_num_threads()):
        bar = tqdm(range(steps), desc=desc, disable=not progress, leave=False)
        for _ in bar:
            idx = torch.randint(0, images.shape[0], (batch_size,), generator=g)
            loss = loss_fn(images[idx].to(dev), labels[idx], g)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
            opt.step()
            lr_sched.step()
            losses.append(loss.item())
            if len(losses) % 50 == 0:
                bar.set_postfix(loss=f"{sum(losses[-50:]) / 50:.4f}")
    unet.eval()
    return losses


@torch.no_grad()
def sample(unet: UNet2DModel, scheduler: SchedulerMixin, labels: torch.Tensor, num_inference_steps: int | None = None,
           generator: torch.Generator | None = None, guidance_scale: float = 1.0, eta: float | None = None,
           threads: int | None = 1, progress: bool = False) -> torch.Tensor:
    """Images ``[B, C, S, S]`` for ``labels`` ``[B]`` by the scheduler's reverse loop (ancestral sampling).

    Starts from x_T ~ N(0, I) and calls ``scheduler.step`` at each of ``num_inference_steps``
    timesteps (default: all training steps). ``scheduler`` may be a DDPMScheduler or a DDIMScheduler
    (then ``eta`` is passed to its ``step``); it is copied, so its ``set_timesteps`` state is left
    untouched. ``guidance_scale`` ≠ 1 applies classifier-free guidance against the null class:
    ε = ε_null + w (ε_y − ε_null). Output is not clamped (the scheduler clips x̂0 to [-1, 1]).
    ``threads`` as in :func:`train_ddpm`.
    """
    with torch_threads(threads or torch.get_num_threads()):
        return _sample(unet, scheduler, check_labels(labels, unet), num_inference_steps, generator,
                       guidance_scale, eta, progress)


def _sample(unet, scheduler, labels, num_inference_steps, generator, guidance_scale, eta, progress):
    sched = type(scheduler).from_config(scheduler.config)
    sched.set_timesteps(num_inference_steps or scheduler.config.num_train_timesteps)
    dev = next(unet.parameters()).device
    c, s = unet.config.in_channels, unet.config.sample_size
    x = torch.randn((labels.shape[0], c, s, s), generator=generator).to(dev)
    labels = labels.to(dev)
    step_kwargs = {} if eta is None else {"eta": eta}
    for t in tqdm(sched.timesteps, desc="sampling", disable=not progress, leave=False):
        t_batch = torch.full((labels.shape[0],), int(t), dtype=torch.long, device=dev)
        if guidance_scale == 1.0:
            eps = unet(x, t_batch, class_labels=labels).sample
        else:
            both = unet(torch.cat([x, x]), torch.cat([t_batch, t_batch]),
                        class_labels=torch.cat([labels, torch.full_like(labels, null_class(unet))])).sample
            eps_y, eps_null = both.chunk(2)
            eps = eps_null + guidance_scale * (eps_y - eps_null)
        x = sched.step(eps, t, x, generator=generator, **step_kwargs).prev_sample
    return x


#: The base model of lessons 08–09: what ``pretrained_base`` trains (``steps`` is overridden in smoke tests).
#: It is stopped early on purpose: after 150 steps a digit classifier recognises about four samples in five
#: (0.81 with 100 DDPM steps, 0.79 with 20 DDIM steps, η = 1), after 300 steps 0.92 (DDIM, same evaluation;
#: lesson 08, section 7), which leaves room for GRPO in lesson 09 to improve prompt alignment.
BASE_CONFIG = dict(
    image_size=16, block_out_channels=[16, 32, 32], layers_per_block=1, norm_num_groups=8,
    num_train_timesteps=100, beta_schedule="squaredcos_cap_v2",
    steps=150, batch_size=64, lr=2e-3, p_uncond=0.1,
)
#: The type of each BASE_CONFIG entry: the overrides of ``pretrained_base`` are checked against it.
BASE_CONFIG_TYPES = dict(
    image_size=int, block_out_channels=list[int], layers_per_block=int, norm_num_groups=int,
    num_train_timesteps=int, beta_schedule=str, steps=int, batch_size=int, lr=float, p_uncond=float,
)


def _base_config(seed: int, overrides: dict) -> dict:
    """:data:`BASE_CONFIG` with ``overrides`` and ``seed``, each override checked (a known name, the type of
    :data:`BASE_CONFIG_TYPES`, a sensible value) with an error naming ``BASE_CONFIG.<name>``."""
    unknown = set(overrides) - set(BASE_CONFIG)
    if unknown:
        raise ValueError(f"unknown base-model settings {sorted(unknown)}; valid: {sorted(BASE_CONFIG)}")
    config = dict(BASE_CONFIG)
    for key, value in overrides.items():
        where = f"BASE_CONFIG.{key}"
        value = check_value(value, BASE_CONFIG_TYPES[key], where)
        if key == "lr" and not 0 < value < float("inf"):
            raise ValueError(f"{where} must be finite and > 0, got {value!r}")
        if key == "p_uncond" and not 0 <= value <= 1:
            raise ValueError(f"{where} must be in [0, 1], got {value!r}")
        counts = value if isinstance(value, list) else [value] if BASE_CONFIG_TYPES[key] is int else []
        if any(v < 1 for v in counts):
            raise ValueError(f"{where} must be >= 1{' in every entry' if isinstance(value, list) else ''}, got {value!r}")
        config[key] = value
    config["seed"] = check_value(seed, int, "pretrained_base's seed")
    return config


def default_cache_dir() -> Path:
    """``$MINIGRPO_CACHE/diffusion`` if set, else ``~/.cache/minigrpo/diffusion``."""
    root = os.environ.get("MINIGRPO_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "minigrpo") / "diffusion"


def base_config_hash(config: dict) -> str:
    """A short hash of a base-model config (plus the diffusers and torch versions) naming its cache folder."""
    key = json.dumps({**config, "diffusers": diffusers.__version__, "torch": torch.__version__.split("+")[0]},
                     sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _base_folder(cache_dir: str | Path | None, config: dict) -> Path:
    """``<cache_dir>/<hash of config>``, ``cache_dir`` defaulting to :func:`default_cache_dir`."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / base_config_hash(config)


def digits_and_unet(config: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor, UNet2DModel]:
    """The training digits at ``config["image_size"]`` and a fresh class-conditional UNet of the config's shape, seeded
    with ``seed``: what the DDPM and the flow-matching base models both start from."""
    images, labels = load_digits_images(config["image_size"])
    unet = make_unet(config["image_size"], NUM_CLASSES, tuple(config["block_out_channels"]), config["layers_per_block"],
                     config["norm_num_groups"], seed=seed)
    return images, labels, unet


def pretrained_base(cache_dir: str | Path | None = None, seed: int = 0, progress: bool = True,
                    **overrides) -> tuple[UNet2DModel, DDPMScheduler]:
    """The trained base model ``(unet, scheduler)``: loaded from the cache, or trained and cached.

    ``overrides`` change entries of :data:`BASE_CONFIG` (e.g. ``steps=50`` for a smoke run); each
    config and seed has its own folder ``<cache_dir>/<hash>`` holding ``unet/``, ``scheduler/`` and
    ``train.json`` (the config, the losses and the training seconds). The folder is written to a
    temporary name and renamed, so an interrupted run never leaves a half-written model.
    """
    config = _base_config(seed, overrides)
    folder = _base_folder(cache_dir, config)
    if (folder / "train.json").is_file():
        return load_base_model(folder)
    images, labels, unet = digits_and_unet(config, seed)
    scheduler = make_scheduler(config["num_train_timesteps"], config["beta_schedule"])
    start = time.perf_counter()
    losses = train_ddpm(unet, scheduler, images, labels, steps=config["steps"], batch_size=config["batch_size"],
                        lr=config["lr"], seed=seed, p_uncond=config["p_uncond"], progress=progress)
    seconds = time.perf_counter() - start
    cache_trained_model(folder, unet, scheduler, {"config": config, "seconds": seconds, "losses": losses})
    return unet, scheduler


def cache_trained_model(folder: Path, unet: UNet2DModel, scheduler: SchedulerMixin, log: dict) -> None:
    """Put a freshly trained ``(unet, scheduler)`` and its ``train.json`` (``log``) in the cache ``folder``
    (``unet/``, ``scheduler/``, ``train.json``): written to a temporary folder beside it and renamed, so an
    interrupted run never leaves half a model; if another process cached the same config first, theirs is kept."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a cache is not
    save_base_model(unet, scheduler, tmp)
    (tmp / "train.json").write_text(json.dumps(log))
    try:
        tmp.rename(folder)
    except OSError:  # another process cached the same config first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def base_training_log(cache_dir: str | Path | None = None, seed: int = 0, **overrides) -> dict | None:
    """The ``train.json`` of a cached base model (config, losses, seconds), or None if not cached."""
    path = _base_folder(cache_dir, _base_config(seed, overrides)) / "train.json"
    return json.loads(path.read_text()) if path.is_file() else None
