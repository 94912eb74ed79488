"""A stochastic DDPM/DDIM sampler that records every step of the denoising chain and its log-prob.

GRPO (and DDPO, Black et al. 2023, arXiv:2305.13301) treat the reverse diffusion as a policy: at step
k the state is ``(prompt, t_k, x_{t_k})`` and the action is the next, less noisy image
``x_{t_{k+1}}``, drawn from a Gaussian

    π_θ(x_prev | x_t, t, c) = N(μ_θ(x_t, t, c), σ_t² I).

The mean comes from the network's noise prediction through the scheduler's update rule, the standard
deviation only from the noise schedule (and η). This module implements that Gaussian — vectorised
over a **different timestep per row**, which training needs: a batch of steps subsampled from many
chains mixes noise levels — and checks it against diffusers' own ``DDPMScheduler.step`` and
``DDIMScheduler.step`` (tests/test_diffusion_grpo.py):

- ``"ddpm"``: DDPM's posterior mean (Ho et al. 2020, eq. 7) from the predicted x₀, with
  ``variance_type`` ``"fixed_small"`` (the posterior variance β̃_t) or ``"fixed_large"`` (β_t),
  prev timestep = the next entry of ``scheduler.timesteps``.
- ``"ddim"``: DDIM's update (Song et al. 2021, eq. 12) with σ_t = η·sqrt(β̃_t), prev timestep =
  ``t − num_train_timesteps // num_inference_steps``. η = 1 has DDPM's variance in fewer steps.

Both clip the predicted x₀ to ±``clip_sample_range`` when the scheduler's ``clip_sample`` is set,
exactly as diffusers does. η = 0 (deterministic DDIM) has no density: it is refused for training.

A step whose σ is 0 is deterministic: it is recorded but is not an action; ``Chain.stochastic``
marks it False and the trainer skips it. With diffusers' default ("leading") spacing the last step
starts at t = 0 and goes to ᾱ = 1 (DDPM, and DDIM with ``set_alpha_to_one=True``): it adds no noise,
it only maps the almost-clean x at t = 0 to the predicted x₀. Every other step is stochastic.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

REDUCTIONS = ("mean", "sum")


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _reduce_pixels(per_pixel: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mean or sum over every non-batch dimension."""
    dims = tuple(range(1, per_pixel.ndim))
    return per_pixel.mean(dims) if reduction == "mean" else per_pixel.sum(dims)


#: how the sampler calls the network: ``model_fn(model, x_t, t, labels) -> predicted noise (or x₀/v)``
ModelFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def unet_output(model: torch.nn.Module, x_t: torch.Tensor, t: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The default ``model_fn``: a class-conditional ``diffusers.UNet2DModel`` (``num_class_embeds`` set)."""
    return model(x_t, t, class_labels=labels).sample


def ddim_scheduler(scheduler, set_alpha_to_one: bool = True):
    """A ``DDIMScheduler`` with the same noise schedule (betas, clipping, prediction type) as ``scheduler``.

    ``set_alpha_to_one=True`` (diffusers' default) ends the chain at ᾱ = 1, a clean image; with
    ``False`` the last step ends at ᾱ_0 < 1 (Stable Diffusion's setting).
    """
    from diffusers import DDIMScheduler

    return DDIMScheduler.from_config(scheduler.config, set_alpha_to_one=set_alpha_to_one)


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """log N(x; mean, std²·I) per row, reduced over every non-batch dimension.

    ``std`` is the standard deviation (not the variance), broadcastable to ``x`` (e.g. ``[B, 1, 1, 1]``).
    Per element: ``−(x − μ)²/(2σ²) − log σ − ½ log 2π``. ``reduction="sum"`` is the true log-density of
    the image; ``"mean"`` divides it by the number of pixels D (DDPO's choice): log-ratios become
    about D times smaller, so the same clip range ε clips far less often (lesson 09 measures it).
    """
    _check_reduction(reduction)
    if x.shape != mean.shape:
        raise ValueError(f"x and mean must have the same shape, got {tuple(x.shape)} and {tuple(mean.shape)}")
    if (std <= 0).any():
        raise ValueError("the standard deviation must be > 0: a deterministic step (σ = 0) has no density")
    per_pixel = -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return _reduce_pixels(per_pixel, reduction)


@dataclass
class Chain:
    """A batch of recorded denoising chains. K steps, B chains, images ``[C, H, W]``.

    ``xs[k]`` is the state before step k and ``xs[k + 1]`` the action taken (``xs[0]`` is pure noise,
    ``xs[K]`` the final image). ``timesteps[k]`` is the t of step k (the same for every chain when
    sampled; per-row timesteps appear only when steps are subsampled for training).
    """

    xs: torch.Tensor  #: [K + 1, B, C, H, W] the states x_T, ..., x_0
    timesteps: torch.Tensor  #: [K] the timestep t of each step (long)
    logprobs: torch.Tensor  #: [B, K] log π(x_{k+1} | x_k) under the sampling policy (0 at deterministic steps)
    stds: torch.Tensor  #: [K] σ of each step
    labels: torch.Tensor  #: [B] class labels (the prompts)
    reduction: str  #: "mean" or "sum": how logprobs were reduced over pixels

    @property
    def images(self) -> torch.Tensor:
        """The final samples ``[B, C, H, W]``."""
        return self.xs[-1]

    @property
    def stochastic(self) -> torch.Tensor:
        """``[K]`` bool: which steps are actions (σ > 0) and can be trained on."""
        return self.stds > 0

    @property
    def num_steps(self) -> int:
        return self.timesteps.numel()


class ReverseProcess:
    """The reverse step of a DDPM or DDIM scheduler as an explicit Gaussian, one timestep per row.

    Args:
        scheduler: a ``diffusers`` ``DDPMScheduler`` or ``DDIMScheduler`` (copied, never modified).
        num_inference_steps: the length K of the chain.
        eta: DDIM's η (ignored for DDPM). Must be > 0 for a stochastic policy; see ``allow_deterministic``.
        model_fn: how to call the network (default: a class-conditional ``UNet2DModel``).
        allow_deterministic: accept η = 0 (for plain sampling only: the steps have no log-prob).
    """

    def __init__(self, scheduler, num_inference_steps: int, eta: float = 1.0, model_fn: ModelFn = unet_output,
                 allow_deterministic: bool = False):
        name = type(scheduler).__name__
        if name.startswith("DDIM"):
            self.kind = "ddim"
        elif name.startswith("DDPM"):
            self.kind = "ddpm"
        else:
            raise ValueError(f"scheduler must be a diffusers DDPMScheduler or DDIMScheduler, got {name}")
        if not isinstance(num_inference_steps, int) or num_inference_steps < 1:
            raise ValueError(f"num_inference_steps must be a positive int, got {num_inference_steps!r}")
        eta = float(eta)
        if not math.isfinite(eta) or eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        if self.kind == "ddim" and eta == 0 and not allow_deterministic:
            raise ValueError("eta=0 makes DDIM deterministic: x_{t-1} is a function of x_t, so a step has no "
                             "probability density and no log-prob to put in a policy-gradient ratio. Use eta > 0 "
                             "(eta=1 gives DDPM's variance) for GRPO; pass allow_deterministic=True only to sample.")
        cfg = scheduler.config
        if getattr(cfg, "thresholding", False):
            raise ValueError("dynamic thresholding is not supported; use clip_sample instead")
        if cfg.prediction_type not in ("epsilon", "sample", "v_prediction"):
            raise ValueError(f"unsupported prediction_type {cfg.prediction_type!r}")
        if self.kind == "ddpm" and cfg.variance_type not in ("fixed_small", "fixed_small_log", "fixed_large"):
            raise ValueError(f"variance_type {cfg.variance_type!r} is not supported (a learned variance would make "
                             f"σ depend on θ); use fixed_small or fixed_large")
        self.scheduler = copy.deepcopy(scheduler)
        self.scheduler.set_timesteps(num_inference_steps)
        self.num_inference_steps = num_inference_steps
        self.eta = eta if self.kind == "ddim" else 1.0
        self.model_fn = model_fn
        self.timesteps = self.scheduler.timesteps.to(torch.long).clone()
        self.config = cfg
        T = cfg.num_train_timesteps
        # ᾱ indexed by t + 1, with index 0 holding ᾱ at t = −1 (the "previous" of the last step)
        ac = self.scheduler.alphas_cumprod.to(torch.float32)
        if self.kind == "ddim":
            final = self.scheduler.final_alpha_cumprod.to(torch.float32).reshape(1)
        else:
            final = torch.ones(1)
        self._alphas = torch.cat([final, ac])
        # previous timestep of every t in the chain (a lookup table over 0..T-1; -1 = "before t=0")
        if self.kind == "ddim":
            prev = (torch.arange(T) - T // num_inference_steps).clamp(min=-1)
        else:
            prev = torch.full((T,), -1, dtype=torch.long)
            prev[self.timesteps[:-1]] = self.timesteps[1:]
        self._prev = prev

    # ------------------------------------------------------------------ coefficients
    def _t(self, t, batch: int, device) -> torch.Tensor:
        t = torch.as_tensor(t, device=device)
        if t.ndim == 0:
            t = t.expand(batch)
        if t.shape != (batch,):
            raise ValueError(f"t must be a scalar or one timestep per row [{batch}], got shape {tuple(t.shape)}")
        t = t.to(torch.long)
        if (t < 0).any() or (t >= self.config.num_train_timesteps).any():
            raise ValueError(f"timesteps must be in [0, {self.config.num_train_timesteps}), got {t.tolist()}")
        return t

    def prev_timestep(self, t: torch.Tensor) -> torch.Tensor:
        """The timestep each row steps to (−1 after the last step)."""
        return self._prev.to(t.device)[t]

    def std(self, t: torch.Tensor) -> torch.Tensor:
        """σ of the step from ``t`` (a tensor of timesteps), same shape as ``t``."""
        a = self._alphas.to(t.device)
        a_t, a_prev = a[t + 1], a[self.prev_timestep(t) + 1]
        beta_t = 1 - a_t / a_prev
        posterior = (1 - a_prev) / (1 - a_t) * beta_t  # β̃_t
        if self.kind == "ddim":
            return self.eta * posterior.sqrt()
        if self.config.variance_type == "fixed_large":
            return torch.where(t > 0, beta_t, torch.zeros_like(beta_t)).sqrt()
        # diffusers clamps the variance at 1e-20 but adds no noise at t = 0: mirror both
        std = posterior.clamp(min=1e-20).sqrt()
        return torch.where(t > 0, std, torch.zeros_like(std))

    def mean_std(self, model_output: torch.Tensor, x_t: torch.Tensor, t) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean ``[B, C, H, W]``, std ``[B, 1, 1, 1]`` and predicted (clipped) x₀ of the step from ``x_t`` at ``t``."""
        B = x_t.shape[0]
        t = self._t(t, B, x_t.device)
        shape = (B,) + (1,) * (x_t.ndim - 1)
        a = self._alphas.to(device=x_t.device)
        a_t = a[t + 1].to(x_t.dtype).view(shape)
        a_prev = a[self.prev_timestep(t) + 1].to(x_t.dtype).view(shape)
        b_t = 1 - a_t
        pt = self.config.prediction_type
        if pt == "epsilon":
            x0, eps = (x_t - b_t**0.5 * model_output) / a_t**0.5, model_output
        elif pt == "sample":
            x0 = model_output
            eps = (x_t - a_t**0.5 * x0) / b_t**0.5
        else:  # v_prediction
            x0 = a_t**0.5 * x_t - b_t**0.5 * model_output
            eps = a_t**0.5 * model_output + b_t**0.5 * x_t
        if self.config.clip_sample:
            r = self.config.clip_sample_range
            x0 = x0.clamp(-r, r)
        std = self.std(t).to(x_t.dtype).view(shape)
        if self.kind == "ddpm":
            alpha_t = a_t / a_prev
            beta_step = 1 - alpha_t
            mean = (a_prev**0.5 * beta_step / b_t) * x0 + (alpha_t**0.5 * (1 - a_prev) / b_t) * x_t
        else:
            mean = a_prev**0.5 * x0 + (1 - a_prev - std**2).clamp(min=0) ** 0.5 * eps
        return mean, std, x0

    def predict(self, model, x_t: torch.Tensor, t, labels: torch.Tensor):
        """Mean, std and x₀ of the policy's step, calling the network once."""
        t = self._t(t, x_t.shape[0], x_t.device)
        return self.mean_std(self.model_fn(model, x_t, t, labels), x_t, t)

    # ------------------------------------------------------------------ sampling and scoring
    @torch.no_grad()
    def sample(self, model, labels: torch.Tensor, shape: tuple[int, ...] | None = None,
               generator: torch.Generator | None = None, reduction: str = "mean",
               x_T: torch.Tensor | None = None) -> Chain:
        """Run the chain from noise for every label and record each step with its log-prob.

        Args:
            model: the network (called through ``model_fn``); put it in eval mode yourself if it has dropout.
            labels: ``[B]`` class labels (the prompts).
            shape: ``(C, H, W)`` of one image (default: from the model's config).
            generator: a CPU ``torch.Generator`` for the initial noise and every step's noise.
            reduction: ``"mean"`` or ``"sum"`` over pixels for the recorded log-probs.
            x_T: the starting noise ``[B, C, H, W]`` (default: drawn from ``generator``).
        """
        _check_reduction(reduction)
        labels = torch.as_tensor(labels)
        if labels.ndim != 1 or labels.numel() == 0:
            raise ValueError(f"labels must be a non-empty 1-D tensor [B], got shape {tuple(labels.shape)}")
        device = next(model.parameters()).device
        labels = labels.to(device)
        B = labels.numel()
        if shape is None:
            c = model.config
            size = c.sample_size if isinstance(c.sample_size, (tuple, list)) else (c.sample_size, c.sample_size)
            shape = (c.in_channels, *size)
        x = x_T if x_T is not None else torch.randn((B, *shape), generator=generator).to(device)
        xs, logps, stds = [x], [], []
        for t in self.timesteps:
            mean, std, _ = self.predict(model, x, t.to(device), labels)
            noise = torch.randn(x.shape, generator=generator).to(device)
            x_prev = mean + std * noise
            s = float(std.flatten()[0])
            logps.append(gaussian_logprob(x_prev, mean, std, reduction) if s > 0 else torch.zeros(B, device=device))
            stds.append(s)
            xs.append(x_prev)
            x = x_prev
        return Chain(xs=torch.stack(xs), timesteps=self.timesteps.clone(), logprobs=torch.stack(logps, 1),
                     stds=torch.tensor(stds), labels=labels, reduction=reduction)

    def step_logprob(self, model, x_t: torch.Tensor, x_prev: torch.Tensor, t, labels: torch.Tensor,
                     reduction: str = "mean", return_mean: bool = False):
        """Recompute ``log π_θ(x_prev | x_t, t, label)`` per row, with gradients; ``t`` may differ per row.

        ``reduction``: ``"sum"`` over the D pixels is the exact log-density of the step; ``"mean"``
        (DDPO's choice) divides it by D. A log-ratio log π_θ − log π_old is then D times smaller, so a
        clip range ε means a much looser trust region: DDPO pairs the mean with a tiny ε (1e-4). With
        the sum, ε = 0.2 already clips a large share of the steps once the weights move (lesson 09
        measures both: roughly, "sum with ε" behaves like "mean with ε / D").
        With ``return_mean=True`` also returns the Gaussian's mean and std (for an analytic KL).
        """
        t = self._t(t, x_t.shape[0], x_t.device)
        if x_prev.shape != x_t.shape:
            raise ValueError(f"x_t and x_prev must have the same shape, got {tuple(x_t.shape)} and {tuple(x_prev.shape)}")
        mean, std, _ = self.predict(model, x_t, t, labels)
        if (std.flatten() <= 0).any():
            raise ValueError("a step with σ = 0 (deterministic) has no log-prob: train only on Chain.stochastic steps")
        logp = gaussian_logprob(x_prev, mean, std, reduction)
        return (logp, mean, std) if return_mean else logp


def step_logprob(model, x_t: torch.Tensor, x_prev: torch.Tensor, t, labels: torch.Tensor,
                 process: ReverseProcess, reduction: str = "mean") -> torch.Tensor:
    """Functional form of :meth:`ReverseProcess.step_logprob` (the per-step log-prob of a recorded step)."""
    return process.step_logprob(model, x_t, x_prev, t, labels, reduction)


def gaussian_kl_same_std(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor,
                         reduction: str = "mean") -> torch.Tensor:
    """KL(N(μ, σ²I) ‖ N(μ_ref, σ²I)) per row: ``‖μ − μ_ref‖² / (2σ²)`` summed (or averaged) over pixels.

    Both policies share σ (it comes from the schedule, not the network), so the log-σ terms cancel
    and the KL is exact — no sampling estimator (k1/k2/k3) is needed.
    """
    _check_reduction(reduction)
    return _reduce_pixels((mean - ref_mean) ** 2 / (2 * std**2), reduction)
