"""Flow matching and Flow-GRPO's SDE sampler (minigrpo/diffusion/flow.py): marginals on an exact velocity
field, the step's Gaussian against a float64 reference, autograd and diffusers' Euler step, errors, a GRPO run."""

import math

import pytest
import torch
from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler

from minigrpo.diffusion.flow import (FlowProcess, flow_interpolate, flow_matching_loss, make_flow_scheduler,
                                     pretrained_flow_base, train_flow)
from minigrpo.diffusion.grpo import DiffusionGRPOConfig, DiffusionGRPOTrainer, grpo_step_loss, make_process

from tiny_diffusion import tiny_unet


def tiny_unet_11(seed=0, size=8):
    return tiny_unet(seed, size, num_class_embeds=11)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------ marginals on Gaussian data

MU = torch.tensor([0.5, -1.0, 0.25], dtype=torch.float64)
_A = torch.tensor([[0.6, 0.0, 0.0], [0.3, 0.4, 0.0], [-0.2, 0.1, 0.3]], dtype=torch.float64)
SIGMA = _A @ _A.T  # a full covariance: the test sees the cross terms too


class GaussianVelocity(torch.nn.Module):
    """The exact velocity E[ε − x₀ | x_t = x] for data N(μ, Σ), x_t = (1 − t)x₀ + tε.

    x_t ~ N((1 − t)μ, C_t), C_t = (1 − t)²Σ + t²I; Cov(ε − x₀, x_t) = tI − (1 − t)Σ, so
    v(x, t) = (tI − (1 − t)Σ) C_t⁻¹ (x − (1 − t)μ) − μ. Images are ``[B, 1, 1, 3]``.
    """

    def __init__(self, num_train_timesteps=1000):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.T = num_train_timesteps

    def forward(self, x, timestep):
        t = timestep.to(torch.float64) / self.T
        t = (t[:1] if (t == t[0]).all() else t).view(-1, 1, 1)  # [B or 1, 1, 1]: one inverse per timestep
        eye = torch.eye(3, dtype=torch.float64)
        C = (1 - t) ** 2 * SIGMA + t**2 * eye
        gain = (t * eye - (1 - t) * SIGMA) @ torch.linalg.inv(C)  # [B, 3, 3]
        y = x.reshape(-1, 3, 1) - (1 - t) * MU.view(1, 3, 1)
        return ((gain @ y).squeeze(-1) - MU).view(x.shape)


def gaussian_samples(noise_level, seed, n=20_000, steps=100, shift=1.0, cls=FlowProcess):
    """``[n, 3]`` float64 samples of the flow sampler on the exact Gaussian velocity field."""
    proc = cls(make_flow_scheduler(shift=shift), steps, noise_level, model_fn=lambda m, x, t, y: m(x, t),
                       allow_deterministic=True)
    g = torch.Generator().manual_seed(seed)
    x_T = torch.randn(n, 1, 1, 3, generator=g, dtype=torch.float64)
    chain = proc.sample(GaussianVelocity(), torch.zeros(n, dtype=torch.long), shape=(1, 1, 3), generator=g, x_T=x_T)
    return chain.images.reshape(n, 3)


def moment_errors(x, mean, cov):
    """Largest absolute error of the sample mean and of the sample covariance against ``mean`` and ``cov``."""
    return (x.mean(0) - mean).abs().max().item(), (torch.cov(x.T) - cov).abs().max().item()


#: Bounds on the largest |mean error| and |covariance error| (Σ's entries are 0.01-0.36). Measured over seeds
#: 0-4, n = 20,000, 100 steps, a = 0.7 and 1.0, shift 1 and 3: against the data, the ODE's mean <= 0.007 and
#: covariance <= 0.022 (Euler's bias: 0.046 with 40 steps), the SDE's <= 0.008 and <= 0.010; SDE against ODE
#: <= 0.012 and <= 0.019 (the 1/sqrt(n) standard error of a mean is 0.004). Asserted: 0.03 and 0.045.
#: A planted bug (the noise added without its drift) moves the covariance by 1.1 (test below).
MEAN_BOUND, COV_BOUND = 0.03, 0.045


@pytest.mark.parametrize("shift,noise_level", [(1.0, 0.7), (3.0, 1.0)])
def test_sde_and_ode_have_the_data_marginals(shift, noise_level):
    ode = gaussian_samples(0.0, 0, shift=shift)
    sde = gaussian_samples(noise_level, 1, shift=shift)
    for x in (ode, sde):
        dm, dc = moment_errors(x, MU, SIGMA)
        assert dm < MEAN_BOUND and dc < COV_BOUND, (dm, dc)
    dm, dc = moment_errors(sde, ode.mean(0), torch.cov(ode.T))
    assert dm < MEAN_BOUND and dc < COV_BOUND, (dm, dc)


class EulerPlusNoise(FlowProcess):
    """A planted bug: the ODE's Euler step with the SDE's noise added, without the drift that removes it."""

    def mean_std(self, model_output, x_t, t):
        _, std, x0 = super().mean_std(model_output, x_t, t)
        s, s_next = (a.to(x_t.dtype).view(-1, 1, 1, 1) for a in self.sigma_next(torch.as_tensor(t).expand(len(x_t))))
        return x_t - (s - s_next) * model_output, std, x0


def test_a_wrong_drift_breaks_the_marginals():
    """The check has teeth: Euler + noise (the noise-removal term dropped) inflates the covariance (measured,
    seeds 0-4, n = 5,000: covariance error 1.11-1.15)."""
    _, dc = moment_errors(gaussian_samples(0.7, 0, n=5000, cls=EulerPlusNoise), MU, SIGMA)
    assert dc > 10 * COV_BOUND


# ------------------------------------------------------------------ the step against references


def reference_step(x, v, s, s_next, a, s_cap):
    """Float64 mean and std of Flow-GRPO's step, written out from the module docstring's formula."""
    x, v = x.double(), v.double()
    g = a * math.sqrt(s / (1 - min(s, s_cap)))
    dt = s - s_next
    mean = x + (-dt) * (v + g**2 / (2 * s) * (x + (1 - s) * v))
    return mean, g * math.sqrt(dt)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_step_logprob_equals_a_float64_reference(shift):
    model = tiny_unet_11().eval()
    proc = FlowProcess(make_flow_scheduler(shift=shift), 6, 0.7)
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([1, 4, 9])
    sig = proc.sigmas.double().tolist()
    for k, t in enumerate(proc.timesteps):
        x = torch.randn(3, 1, 8, 8, generator=g)
        x_prev = torch.randn(3, 1, 8, 8, generator=g)
        with torch.no_grad():
            v = model(x, t.expand(3), class_labels=labels).sample
            lp = proc.step_logprob(model, x, x_prev, t, labels, "sum")
            lp_mean = proc.step_logprob(model, x, x_prev, t, labels, "mean")
        mean, std = reference_step(x, v, sig[k], sig[k + 1], 0.7, sig[1])
        ref = torch.distributions.Normal(mean, std).log_prob(x_prev.double()).flatten(1)
        torch.testing.assert_close(lp.double(), ref.sum(1), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(lp_mean.double(), ref.mean(1), rtol=1e-5, atol=1e-6)
        assert math.isclose(proc.std(t).item(), std, rel_tol=1e-5)


def test_step_logprob_gradient_matches_autograd_and_finite_differences():
    proc = FlowProcess(make_flow_scheduler(), 5, 0.8)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1, 3, 3, generator=g, dtype=torch.float64)
    x_prev = torch.randn(2, 1, 3, 3, generator=g, dtype=torch.float64)
    t = proc.timesteps[[1, 3]]  # a different timestep per row

    def logp(v):
        mean, std, _ = proc.mean_std(v, x, t)
        return torch.distributions.Normal(mean, std).log_prob(x_prev).flatten(1).sum(1)

    v = torch.randn(2, 1, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(logp, (v,))
    # closed form: d log p / d v = (x' − μ)/std² · dμ/dv,  dμ/dv = −Δ(1 + g²(1 − s)/(2s))
    logp(v).sum().backward()
    s, s_next = proc.sigma_next(t)
    s, s_next = s.double().view(-1, 1, 1, 1), s_next.double().view(-1, 1, 1, 1)
    mean, std, _ = proc.mean_std(v.detach(), x, t)
    g2 = proc._sigma_t(s) ** 2
    torch.testing.assert_close(v.grad, (x_prev - mean) / std**2 * (-(s - s_next) * (1 + g2 * (1 - s) / (2 * s))))


def test_recorded_logprobs_recompute_exactly():
    model = tiny_unet_11().eval()
    proc = FlowProcess(make_flow_scheduler(shift=3.0), 5, 0.7)
    labels = torch.tensor([0, 0, 3, 3, 7, 7])
    chain = proc.sample(model, labels, generator=torch.Generator().manual_seed(0), reduction="sum")
    assert chain.xs.shape == (6, 6, 1, 8, 8) and chain.logprobs.shape == (6, 5) and chain.stochastic.all()
    with torch.no_grad():
        for k in range(chain.num_steps):  # the sampler's path (one timestep for the batch): bit-identical
            lp = proc.step_logprob(model, chain.xs[k], chain.xs[k + 1], chain.timesteps[k], labels, "sum")
            assert torch.equal(torch.exp(lp - chain.logprobs[:, k]), torch.ones(6))
        b, k = torch.arange(6).repeat_interleave(5), torch.arange(5).repeat(6)  # mixed timesteps per row
        lp = proc.step_logprob(model, chain.xs[k, b], chain.xs[k + 1, b], chain.timesteps[k], labels[b], "mean")
        assert (lp - chain.logprobs[b, k] / 64).abs().max() < 1e-5


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_ode_step_matches_diffusers_euler_step(shift):
    sched = make_flow_scheduler(shift=shift)
    proc = FlowProcess(sched, 7, 0.0, allow_deterministic=True)
    ref = FlowMatchEulerDiscreteScheduler.from_config(sched.config)
    ref.set_timesteps(7)
    torch.testing.assert_close(proc.sigmas, ref.sigmas)
    g = torch.Generator().manual_seed(0)
    for t in ref.timesteps:
        x, v = torch.randn(2, 1, 4, 4, generator=g), torch.randn(2, 1, 4, 4, generator=g)
        mean, std, x0 = proc.mean_std(v, x, t)
        torch.testing.assert_close(mean, ref.step(v, t, x).prev_sample, rtol=1e-6, atol=1e-6)
        assert (std == 0).all()
        torch.testing.assert_close(x0, x - t / 1000 * v)
    # the SDE's mean tends to the ODE's as the noise level goes to 0
    sde = FlowProcess(sched, 7, 1e-4)
    torch.testing.assert_close(sde.mean_std(v, x, t)[0], mean, rtol=0, atol=1e-6)


def test_interpolation_and_loss_follow_diffusers_conventions():
    sched = make_flow_scheduler()
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(4, 1, 8, 8, generator=g), torch.randn(4, 1, 8, 8, generator=g)
    ref = FlowMatchEulerDiscreteScheduler.from_config(sched.config)
    ref.set_timesteps(10)
    t = ref.timesteps[3]
    torch.testing.assert_close(flow_interpolate(x0, noise, (t / 1000).expand(4)),
                               ref.scale_noise(x0, t.view(1), noise))
    # the loss draws t, then ε, from the generator: rebuild them and compute the regression by hand
    model, labels = tiny_unet_11(), torch.tensor([0, 1, 2, 3])
    loss = flow_matching_loss(model, x0, labels, sched, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    t, eps = torch.rand(4, generator=g), torch.randn(x0.shape, generator=g)
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    v = model(x_t, t * 1000, class_labels=labels).sample
    torch.testing.assert_close(loss, ((v - (eps - x0)) ** 2).mean())


# ------------------------------------------------------------------ errors


def test_bad_inputs_get_clear_errors():
    sched = make_flow_scheduler()
    with pytest.raises(ValueError, match="deterministic"):
        FlowProcess(sched, 10, 0.0)
    ode = FlowProcess(sched, 4, 0.0, allow_deterministic=True)
    model, x = tiny_unet_11(), torch.zeros(2, 1, 8, 8)
    with pytest.raises(ValueError, match="no log-prob"):
        ode.step_logprob(model, x, x, ode.timesteps[0], torch.tensor([0, 1]))
    flow_unet, labels = tiny_unet_11(), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="eta"):  # the trainer refuses a deterministic sampler too
        DiffusionGRPOTrainer(flow_unet, sched, lambda im, y: im.mean((1, 2, 3)), DiffusionGRPOConfig(eta=0.0))
    for shift in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="shift"):
            make_flow_scheduler(shift=shift)
        with pytest.raises(ValueError, match="shift"):
            FlowProcess(FlowMatchEulerDiscreteScheduler(shift=shift), 4)
    with pytest.raises(ValueError, match="use_dynamic_shifting"):
        FlowProcess(FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), 4)
    with pytest.raises(ValueError, match="FlowMatchEulerDiscreteScheduler"):
        FlowProcess(DDPMScheduler(), 4)
    for bad in (float("nan"), -0.1):
        with pytest.raises(ValueError, match="noise_level"):
            FlowProcess(sched, 4, bad)
    with pytest.raises(ValueError, match="num_inference_steps"):
        FlowProcess(sched, 1, 0.7)
    proc = FlowProcess(sched, 4, 0.7)
    t = proc.timesteps[0]
    with pytest.raises(ValueError, match="same shape"):
        proc.step_logprob(model, x, torch.zeros(2, 1, 4, 4), t, labels)
    with pytest.raises(ValueError, match="one timestep per row"):
        proc.step_logprob(model, x, x, proc.timesteps[:3], labels)
    with pytest.raises(ValueError, match="among this sampler's timesteps"):
        proc.step_logprob(model, x, x, torch.tensor(500.0), labels)
    with pytest.raises(ValueError, match="velocity and x_t"):
        proc.mean_std(torch.zeros(2, 1, 4, 4), x, t)
    with pytest.raises(ValueError, match="x_T"):
        proc.sample(model, labels, x_T=torch.zeros(3, 1, 8, 8))
    with pytest.raises(ValueError, match="x0 must be"):
        flow_matching_loss(model, torch.zeros(2, 1, 4, 4), labels, sched)
    with pytest.raises(ValueError, match="time_sampling"):
        flow_matching_loss(model, x, labels, sched, time_sampling="cosine")
    with pytest.raises(ValueError, match="unknown flow base-model settings"):
        pretrained_flow_base(stepz=3)


# ------------------------------------------------------------------ training


def test_two_grpo_steps_on_a_tiny_flow_model_are_finite():
    model, sched = tiny_unet_11(), make_flow_scheduler(shift=3.0)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = DiffusionGRPOConfig(max_steps=2, prompts_per_step=2, num_generations=3, num_inference_steps=4, eta=0.7,
                              num_minibatches=2, timestep_fraction=0.5, beta=0.01)
    trainer = DiffusionGRPOTrainer(model, sched, lambda im, y: im.mean((1, 2, 3)), cfg)
    assert isinstance(trainer.process, FlowProcess) and isinstance(make_process(sched, cfg), FlowProcess)
    history = trainer.train(progress=False).history
    assert len(history["reward"]) == 2
    for key in ("reward", "loss", "grad_norm", "kl", "approx_kl"):
        assert all(math.isfinite(v) for v in history[key]), key
    assert any(not torch.equal(p, q) for p, q in zip(before, model.parameters()))
    # the loss on the recorded steps, straight from grpo_step_loss: ratio exactly 1 before any update
    ro = trainer.rollout()
    loss, stats, _ = grpo_step_loss(trainer.process, model, ro.chain, torch.arange(6), ro.steps, ro.advantages, cfg)
    assert math.isfinite(loss.item()) and stats["clip_ratio/region_mean"] == 0
    assert stats["log_ratio_abs_max"] < 1e-5  # measured 0 to 6e-8: float32 rounding of a batch of mixed rows


def test_train_flow_and_cached_base(tmp_path):
    losses = train_flow(tiny_unet_11(), make_flow_scheduler(), torch.rand(16, 1, 8, 8) * 2 - 1,
                        torch.arange(16) % 10, steps=3, batch_size=4, progress=False)
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    unet, sched = pretrained_flow_base(tmp_path, steps=2, block_out_channels=[8, 16], norm_num_groups=4,
                                       progress=False)
    assert isinstance(sched, FlowMatchEulerDiscreteScheduler) and (tmp_path / next(tmp_path.iterdir()).name).is_dir()
    again, _ = pretrained_flow_base(tmp_path, steps=2, block_out_channels=[8, 16], norm_num_groups=4)
    assert all(torch.equal(p, q) for p, q in zip(unet.parameters(), again.parameters()))
