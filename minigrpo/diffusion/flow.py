"""Flow matching (rectified flow) and Flow-GRPO's stochastic sampler, in diffusers' conventions.

**Conventions** (those of diffusers' ``FlowMatchEulerDiscreteScheduler``, as in SD3 and FLUX). A noise
level ``t`` (the scheduler calls it σ) runs from 1 (pure noise) to 0 (data); the forward path is the
straight line

    x_t = (1 − t)·x₀ + t·ε,   ε ~ N(0, I),

and the network predicts the **velocity** ``v = dx_t/dt = ε − x₀`` from ``(x_t, t, class)``. The network
sees the timestep ``t · num_train_timesteps`` (a float; diffusers' ``scheduler.timesteps``). At inference
``set_timesteps(K)`` gives K noise levels spaced from 1 to 1/num_train_timesteps, each mapped through
``shift``: ``t ↦ shift·t / (1 + (shift − 1)·t)`` (shift > 1 spends more steps at high noise), then 0.

**Training** (:func:`flow_matching_loss`): draw t and ε, regress the network on ``ε − x₀`` at ``x_t``. The
minimiser is the conditional mean ``v(x, t) = E[ε − x₀ | x_t = x]``, whose ODE ``dx/dt = v`` carries
N(0, I) at t = 1 to the data at t = 0 through the same marginals ``p_t`` as the straight-line path.

**The ODE sampler** is Euler's method on that ODE, ``x_{t'} = x_t + (t' − t)·v`` (what
``FlowMatchEulerDiscreteScheduler.step`` does): deterministic, so a step has no density and no log-prob.

**The SDE sampler with the same marginals** (Flow-GRPO, Liu et al. 2025, arXiv:2505.05470).
Derivation. (1) The score of ``p_t`` in terms of v: given ``x_t = x``, ``x = (1−t)·E[x₀|x] + t·E[ε|x]`` and
``v = E[ε|x] − E[x₀|x]``; eliminating ``E[x₀|x]`` gives ``E[ε|x] = x + (1 − t)·v``, and Tweedie's formula
for ``x_t = (1−t)x₀ + tε`` gives ``∇log p_t(x) = −E[ε|x]/t = −(x + (1−t)·v)/t``. (2) ``p_t`` solves the
continuity equation ``∂_t p = −∇·(p·v)``. For any g(t) ≥ 0 the SDE run with t *decreasing*,

    dx = [v − ½ g² ∇log p_t] dt + g dW    (dt < 0),

has the same marginals: in the increasing time s = 1 − t it reads ``dx = −[v − ½g²∇log p] ds + g dW``, whose
Fokker–Planck equation is ``∂_s p = ∇·(p v) − ½g² ∇·(p ∇log p) + ½g² Δp = ∇·(p v)`` (the two g² terms
cancel because ``p∇log p = ∇p``), i.e. ``∂_t p = −∇·(p v)``, the ODE's. (3) Substituting the score,

    dx = [v + g²/(2t)·(x + (1 − t)·v)] dt + g dW,

Flow-GRPO's SDE with g = σ_t = a·sqrt(t / (1 − t)), a = the noise level. (4) Euler–Maruyama from t to
t' < t (Δ = t − t' > 0) makes each step a Gaussian, the policy of Flow-GRPO:

    x_{t'} ~ N(μ, σ_t² Δ · I),   μ = x_t − Δ·[v + σ_t²/(2t)·ε̂],   ε̂ = x_t + (1 − t)·v.

So the step is the ODE's Euler step plus a pull of the predicted noise ε̂ out of x (rate σ_t²/(2t)), with
fresh noise of variance σ_t²Δ put back in: the same marginals in the limit of small steps, and a = 0 is
the ODE. σ_t is infinite at t = 1: as Flow-GRPO does, its denominator uses the second noise level of the
chain there, ``1 − t₁`` (so the first step's contraction ``Δ a²/(2(1 − t₁))`` stays about a²/2).

:class:`FlowProcess` exposes :class:`~minigrpo.diffusion.sampler.ReverseProcess`'s interface (``sample`` →
``Chain``, ``step_logprob``, ``mean_std``, ``predict``), so ``grpo_step_loss`` and ``DiffusionGRPOTrainer``
train a flow model unchanged: ``make_process`` builds a FlowProcess when the scheduler is a
``FlowMatchEulerDiscreteScheduler``, with ``DiffusionGRPOConfig.eta`` as the noise level a.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import FlowMatchEulerDiscreteScheduler, UNet2DModel

from ..infra.checks import check_value
from .ddpm import (_check_images, base_config_hash, cache_trained_model, check_labels, default_cache_dir,
                   digits_and_unet, train_denoiser)
from .models import null_class
from .sampler import Chain, ModelFn, _check_reduction, gaussian_logprob, unet_output

#: Flow-GRPO's default noise level a (its SD3 recipe).
DEFAULT_NOISE_LEVEL = 0.7
TIME_SAMPLINGS = ("uniform", "logit_normal")


def make_flow_scheduler(num_train_timesteps: int = 1000, shift: float = 1.0) -> FlowMatchEulerDiscreteScheduler:
    """A ``FlowMatchEulerDiscreteScheduler`` (static ``shift``, deterministic Euler steps), checked."""
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train_timesteps, shift=shift)
    check_flow_scheduler(sched)
    return sched


def check_flow_scheduler(scheduler) -> None:
    """A clear error for a scheduler whose sigmas this module cannot use."""
    name = type(scheduler).__name__
    if not name.startswith("FlowMatchEulerDiscrete"):
        raise ValueError(f"scheduler must be a diffusers FlowMatchEulerDiscreteScheduler, got {name}")
    cfg = scheduler.config
    shift = cfg.shift
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not math.isfinite(shift) or shift <= 0:
        raise ValueError(f"shift must be a finite number > 0 (1 = no shift), got {shift!r}")
    if not isinstance(cfg.num_train_timesteps, int) or cfg.num_train_timesteps < 1:
        raise ValueError(f"num_train_timesteps must be a positive int, got {cfg.num_train_timesteps!r}")
    for flag in ("use_dynamic_shifting", "invert_sigmas", "stochastic_sampling"):
        if getattr(cfg, flag, False):
            raise ValueError(f"{flag}=True is not supported: use a static shift and the deterministic Euler step")


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The regression target v = ε − x₀ (d x_t / dt along the straight path)."""
    return noise - x0


def flow_interpolate(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = (1 − t)·x₀ + t·ε for ``t`` ``[B]`` in [0, 1] (``FlowMatchEulerDiscreteScheduler.scale_noise``)."""
    t = t.to(x0.dtype).view(-1, *([1] * (x0.ndim - 1)))
    return (1 - t) * x0 + t * noise


def sample_flow_times(n: int, generator: torch.Generator | None = None, kind: str = "uniform") -> torch.Tensor:
    """Training noise levels ``[n]`` in (0, 1): uniform, or logit-normal (SD3's default, m = 0, s = 1)."""
    if kind not in TIME_SAMPLINGS:
        raise ValueError(f"time_sampling must be one of {TIME_SAMPLINGS}, got {kind!r}")
    if kind == "uniform":
        return torch.rand(n, generator=generator)
    return torch.sigmoid(torch.randn(n, generator=generator))


def flow_matching_loss(unet: UNet2DModel, x0: torch.Tensor, labels: torch.Tensor, scheduler,
                       generator: torch.Generator | None = None, p_uncond: float = 0.0,
                       time_sampling: str = "uniform") -> torch.Tensor:
    """‖v_θ(x_t, t, y) − (ε − x₀)‖², averaged over pixels and batch (rectified flow / conditional flow matching).

    The UNet is called with the timestep ``t · num_train_timesteps`` as the scheduler's sampler will call
    it; with probability ``p_uncond`` a label becomes the null class (for classifier-free guidance).
    """
    check_flow_scheduler(scheduler)
    _check_images(x0, "x0", unet)
    labels = check_labels(labels, unet, batch=x0.shape[0])
    if not 0.0 <= p_uncond <= 1.0:
        raise ValueError(f"p_uncond must be in [0, 1], got {p_uncond}")
    b, dev = x0.shape[0], x0.device
    t = sample_flow_times(b, generator, time_sampling).to(dev)
    noise = torch.randn(x0.shape, generator=generator, dtype=x0.dtype).to(dev)
    labels = labels.to(dev)
    if p_uncond > 0:
        drop = torch.rand(b, generator=generator).to(dev) < p_uncond
        labels = torch.where(drop, torch.full_like(labels, null_class(unet)), labels)
    v = unet(flow_interpolate(x0, noise, t), t * scheduler.config.num_train_timesteps, class_labels=labels).sample
    return F.mse_loss(v, velocity_target(x0, noise))


def train_flow(unet: UNet2DModel, scheduler, images: torch.Tensor, labels: torch.Tensor, steps: int,
               batch_size: int = 64, lr: float = 2e-3, seed: int = 0, p_uncond: float = 0.1,
               time_sampling: str = "uniform", threads: int | None = 1, progress: bool = True) -> list[float]:
    """Train ``unet`` in place to predict the velocity (AdamW, warmup + cosine lr); returns the loss per step.

    The loop of :func:`minigrpo.diffusion.ddpm.train_denoiser` (the one DDPM trains with) on
    :func:`flow_matching_loss`.
    """
    def loss_fn(x0, y, g):
        return flow_matching_loss(unet, x0, y, scheduler, generator=g, p_uncond=p_uncond,
                                  time_sampling=time_sampling)

    return train_denoiser(unet, images, labels, loss_fn, steps, batch_size=batch_size, lr=lr, seed=seed,
                          threads=threads, progress=progress, desc="flow matching")


class FlowProcess:
    """A flow-matching sampler as a policy: Euler (ODE, noise level 0) or Flow-GRPO's SDE (noise level a > 0).

    The same interface as :class:`~minigrpo.diffusion.sampler.ReverseProcess`; ``t`` is a float timestep of
    ``timesteps`` (``σ · num_train_timesteps``), one per row allowed. See the module docstring for the step.

    Args:
        scheduler: a ``FlowMatchEulerDiscreteScheduler`` (copied; its ``shift`` is honoured).
        num_inference_steps: K, the chain's length (≥ 2 for the SDE: σ_t at t = 1 needs the second level).
        noise_level: a in σ_t = a·sqrt(t/(1 − t)); 0 is the deterministic ODE (sampling only).
        model_fn: how to call the network; it must return the velocity (default: a class-conditional UNet).
        allow_deterministic: accept noise_level 0 (to sample; its steps have no log-prob).
    """

    def __init__(self, scheduler, num_inference_steps: int, noise_level: float = DEFAULT_NOISE_LEVEL,
                 model_fn: ModelFn = unet_output, allow_deterministic: bool = False):
        check_flow_scheduler(scheduler)
        if isinstance(num_inference_steps, bool) or not isinstance(num_inference_steps, int) or num_inference_steps < 1:
            raise ValueError(f"num_inference_steps must be a positive int, got {num_inference_steps!r}")
        a = float(noise_level)
        if not math.isfinite(a) or a < 0:
            raise ValueError(f"noise_level must be a finite number >= 0, got {noise_level!r}")
        if a == 0 and not allow_deterministic:
            raise ValueError("noise_level=0 is the deterministic ODE sampler: x_{t'} is a function of x_t, so a step "
                             "has no probability density and no log-prob for a policy ratio. Use noise_level > 0 "
                             "(Flow-GRPO: 0.7) to train; pass allow_deterministic=True only to sample.")
        if a > 0 and num_inference_steps < 2:
            raise ValueError("num_inference_steps must be >= 2 for the SDE sampler (noise_level > 0): its σ_t at t = 1 "
                             "uses the chain's second noise level")
        self.scheduler = copy.deepcopy(scheduler)
        self.scheduler.set_timesteps(num_inference_steps)
        self.config = self.scheduler.config
        self.kind, self.num_inference_steps, self.noise_level, self.model_fn = "flow", num_inference_steps, a, model_fn
        self.sigmas = self.scheduler.sigmas.to(torch.float32).clone()  # [K + 1], from ~1 down to 0
        self.timesteps = self.scheduler.timesteps.to(torch.float32).clone()  # [K], what the network sees
        if not (self.sigmas[:-1] > 0).all() or not (self.sigmas[:-1] <= 1).all() or not (self.sigmas.diff() < 0).all():
            raise ValueError(f"the scheduler's sigmas must decrease within (0, 1] before the final 0, got "
                             f"{self.sigmas.tolist()}")

    def _index(self, t, batch: int, device) -> torch.Tensor:
        """The step index ``[B]`` of each row's timestep ``t`` (a scalar or ``[B]`` of ``timesteps``)."""
        t = torch.as_tensor(t, device=device)
        if t.ndim == 0:  # the sampler's path: one timestep for the whole batch
            return self._index(t.reshape(1), 1, device).expand(batch)
        if t.shape != (batch,):
            raise ValueError(f"t must be a scalar or one timestep per row [{batch}], got shape {tuple(t.shape)}")
        gap = (t.to(torch.float64)[:, None] - self.timesteps.to(device, torch.float64)[None]).abs()
        dist, idx = gap.min(1)
        if (dist > 1e-4 * self.config.num_train_timesteps).any():
            raise ValueError(f"t must be among this sampler's timesteps {self.timesteps.tolist()}, got {t.tolist()}")
        return idx

    def sigma_next(self, t) -> tuple[torch.Tensor, torch.Tensor]:
        """The noise levels ``(t/T, t'/T)`` each row steps from and to (``T = num_train_timesteps``)."""
        t = torch.as_tensor(t)
        k = self._index(t.reshape(-1), t.numel(), t.device)
        sig = self.sigmas.to(t.device)
        return sig[k].view(t.shape), sig[k + 1].view(t.shape)

    def std(self, t) -> torch.Tensor:
        """σ_t·sqrt(Δ), the standard deviation of the step from each timestep ``t`` (0 for the ODE)."""
        s, s_next = self.sigma_next(t)
        return self._std(s, s_next)

    def _std(self, s: torch.Tensor, s_next: torch.Tensor) -> torch.Tensor:
        return self._sigma_t(s) * (s - s_next).sqrt()

    def _sigma_t(self, s: torch.Tensor) -> torch.Tensor:
        """g(t) = a·sqrt(t/(1 − t)), with 1 − t₁ in the denominator at t = 1 (Flow-GRPO's choice)."""
        if self.noise_level == 0:
            return torch.zeros_like(s)
        cap = self.sigmas[1].to(s.device, s.dtype)
        return self.noise_level * (s / (1 - torch.minimum(s, cap))).sqrt()

    def mean_std(self, model_output: torch.Tensor, x_t: torch.Tensor, t) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean ``[B, C, H, W]``, std ``[B, 1, 1, 1]`` and predicted x₀ of the step from ``x_t`` at ``t``."""
        if model_output.shape != x_t.shape:
            raise ValueError(f"the velocity and x_t must have the same shape, got {tuple(model_output.shape)} "
                             f"and {tuple(x_t.shape)}")
        B = x_t.shape[0]
        k = self._index(t, B, x_t.device)
        shape = (B,) + (1,) * (x_t.ndim - 1)
        sig = self.sigmas.to(x_t.device, x_t.dtype)
        s, s_next = sig[k].view(shape), sig[k + 1].view(shape)
        v, dt = model_output, s - s_next  # dt > 0: the chain goes from t down to t'
        x0 = x_t - s * v
        g = self._sigma_t(s)
        eps_hat = x_t + (1 - s) * v  # E[ε | x_t]
        mean = x_t - dt * (v + g**2 / (2 * s) * eps_hat)
        return mean, g * dt.sqrt(), x0

    def predict(self, model, x_t: torch.Tensor, t, labels: torch.Tensor):
        """Mean, std and x₀ of the policy's step, calling the network once."""
        t_rows = self.timesteps.to(x_t.device)[self._index(t, x_t.shape[0], x_t.device)]  # [B], the network's input
        return self.mean_std(self.model_fn(model, x_t, t_rows, labels), x_t, t)

    @torch.no_grad()
    def sample(self, model, labels: torch.Tensor, shape: tuple[int, ...] | None = None,
               generator: torch.Generator | None = None, reduction: str = "mean",
               x_T: torch.Tensor | None = None) -> Chain:
        """Run the chain from noise for every label, recording each step and its log-prob (as ReverseProcess).

        ``Chain.timesteps`` holds the float timesteps; an ODE chain (noise level 0) records log-prob 0.
        """
        _check_reduction(reduction)
        labels = torch.as_tensor(labels)
        if labels.ndim != 1 or labels.numel() == 0:
            raise ValueError(f"labels must be a non-empty 1-D tensor [B], got shape {tuple(labels.shape)}")
        device = next(model.parameters()).device
        labels, B = labels.to(device), labels.numel()
        if shape is None:
            c = model.config
            size = c.sample_size if isinstance(c.sample_size, (tuple, list)) else (c.sample_size, c.sample_size)
            shape = (c.in_channels, *size)
        x = x_T if x_T is not None else torch.randn((B, *shape), generator=generator).to(device)
        if x.shape != (B, *shape):
            raise ValueError(f"x_T must be [B, *shape] = {(B, *shape)}, got {tuple(x.shape)}")
        xs, logps, stds = [x], [], []
        for t in self.timesteps:
            mean, std, _ = self.predict(model, x, t.to(device), labels)
            x = mean + std * torch.randn(x.shape, generator=generator, dtype=x.dtype).to(device)
            s = float(std.flatten()[0])
            logps.append(gaussian_logprob(x, mean, std, reduction) if s > 0 else torch.zeros(B, device=device))
            stds.append(s)
            xs.append(x)
        return Chain(xs=torch.stack(xs), timesteps=self.timesteps.clone(), logprobs=torch.stack(logps, 1),
                     stds=torch.tensor(stds), labels=labels, reduction=reduction)

    def step_logprob(self, model, x_t: torch.Tensor, x_prev: torch.Tensor, t, labels: torch.Tensor,
                     reduction: str = "mean", return_mean: bool = False):
        """``log π_θ(x_prev | x_t, t, label)`` per row, with gradients; ``t`` may differ per row."""
        if x_prev.shape != x_t.shape:
            raise ValueError(f"x_t and x_prev must have the same shape, got {tuple(x_t.shape)} and {tuple(x_prev.shape)}")
        if self.noise_level == 0:
            raise ValueError("the ODE sampler (noise_level=0) is deterministic: its steps have no log-prob; "
                             "train with noise_level > 0")
        mean, std, _ = self.predict(model, x_t, t, labels)
        logp = gaussian_logprob(x_prev, mean, std, reduction)
        return (logp, mean, std) if return_mean else logp


# ---------------------------------------------------------------------------------------------- the base model

#: The flow-matching base model of the digits (the DDPM base's UNet and training budget, see ``ddpm.BASE_CONFIG``).
FLOW_BASE_CONFIG = dict(
    image_size=16, block_out_channels=[16, 32, 32], layers_per_block=1, norm_num_groups=8,
    num_train_timesteps=1000, shift=1.0, time_sampling="uniform",
    steps=150, batch_size=64, lr=2e-3, p_uncond=0.1,
)
FLOW_BASE_CONFIG_TYPES = dict(
    image_size=int, block_out_channels=list[int], layers_per_block=int, norm_num_groups=int,
    num_train_timesteps=int, shift=float, time_sampling=str, steps=int, batch_size=int, lr=float, p_uncond=float,
)


def _flow_config(seed: int, overrides: dict) -> dict:
    unknown = set(overrides) - set(FLOW_BASE_CONFIG)
    if unknown:
        raise ValueError(f"unknown flow base-model settings {sorted(unknown)}; valid: {sorted(FLOW_BASE_CONFIG)}")
    config = dict(FLOW_BASE_CONFIG)
    for key, value in overrides.items():
        config[key] = check_value(value, FLOW_BASE_CONFIG_TYPES[key], f"FLOW_BASE_CONFIG.{key}")
    config["seed"] = check_value(seed, int, "pretrained_flow_base's seed")
    return config


def load_flow_model(folder: str | Path) -> tuple[UNet2DModel, FlowMatchEulerDiscreteScheduler]:
    """``(unet, scheduler)`` from ``folder/unet`` and ``folder/scheduler`` (the UNet in eval mode)."""
    folder = Path(folder)
    if not (folder / "unet").is_dir() or not (folder / "scheduler").is_dir():
        raise ValueError(f"{folder} must contain the subfolders 'unet' and 'scheduler'")
    unet = UNet2DModel.from_pretrained(folder / "unet").eval()
    return unet, FlowMatchEulerDiscreteScheduler.from_pretrained(folder / "scheduler")


def pretrained_flow_base(cache_dir: str | Path | None = None, seed: int = 0, progress: bool = True,
                         **overrides) -> tuple[UNet2DModel, FlowMatchEulerDiscreteScheduler]:
    """The flow-matching digits model ``(unet, scheduler)``: loaded from the cache, or trained and cached.

    Like :func:`minigrpo.diffusion.ddpm.pretrained_base`: ``overrides`` change :data:`FLOW_BASE_CONFIG`
    entries (``steps=20`` for a smoke run), each config and seed has its folder ``<cache_dir>/flow-<hash>``.
    """
    config = _flow_config(seed, overrides)
    check_flow_scheduler(make_flow_scheduler(config["num_train_timesteps"], config["shift"]))
    folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / f"flow-{base_config_hash(config)}"
    if (folder / "train.json").is_file():
        return load_flow_model(folder)
    images, labels, unet = digits_and_unet(config, seed)
    scheduler = make_flow_scheduler(config["num_train_timesteps"], config["shift"])
    start = time.perf_counter()
    losses = train_flow(unet, scheduler, images, labels, config["steps"], config["batch_size"], config["lr"], seed,
                        config["p_uncond"], config["time_sampling"], progress=progress)
    seconds = time.perf_counter() - start
    cache_trained_model(folder, unet, scheduler, {"config": config, "seconds": seconds, "losses": losses})
    return unet, scheduler
