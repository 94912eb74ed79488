"""Grading tests for exercise 09 (GRPO for diffusion).

By default they grade solutions/09_grpo_diffusion.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex09.py --grade-source exercises
Beyond the fixed cases of tests/grading/test_items.py: agreement with torch.distributions and with the
package on random batches, with a real sampler's recorded chain, and what the clip implies for gradients.
"""

import pytest
import torch
from diffusers import DDPMScheduler, UNet2DModel

from minigrpo.diffusion.sampler import ReverseProcess, ddim_scheduler
from minigrpo.losses import clipped_surrogate_loss

EXERCISE = "09"


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("seed", range(3))
def test_step_logprob_matches_torch_distributions(learner_fn, seed, reduction):
    fn = learner_fn(EXERCISE, "gaussian_step_logprob")
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(5, 2, 4, 4, generator=g, dtype=torch.float64)
    std = torch.rand(5, generator=g, dtype=torch.float64) + 0.01
    x = mean + 0.7 * torch.randn(5, 2, 4, 4, generator=g, dtype=torch.float64)
    per_pixel = torch.distributions.Normal(mean, std.view(5, 1, 1, 1)).log_prob(x).flatten(1)
    expected = per_pixel.mean(1) if reduction == "mean" else per_pixel.sum(1)
    torch.testing.assert_close(fn(x, mean, std, reduction=reduction), expected, rtol=1e-10, atol=1e-10)


def test_step_logprob_reproduces_a_recorded_chain(learner_fn):
    """The sampler recorded log π(x_{k+1} | x_k) while denoising; the learner's function, given the same Gaussian,
    must give the same numbers (the ratio of the unchanged policy is then exactly 1)."""
    fn = learner_fn(EXERCISE, "gaussian_step_logprob")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, num_class_embeds=10, block_out_channels=(8, 16),
                       layers_per_block=1, norm_num_groups=4, down_block_types=("DownBlock2D",) * 2,
                       up_block_types=("UpBlock2D",) * 2).eval()
    proc = ReverseProcess(ddim_scheduler(DDPMScheduler(num_train_timesteps=100)), 5)
    labels = torch.tensor([0, 3, 3, 9])
    chain = proc.sample(unet, labels, generator=torch.Generator().manual_seed(0), reduction="sum")
    with torch.no_grad():
        for k in range(chain.num_steps - 1):  # the last step is deterministic (σ = 0)
            mean, std, _ = proc.predict(unet, chain.xs[k], chain.timesteps[k], labels)
            got = fn(chain.xs[k + 1], mean, std.flatten(), reduction="sum")
            torch.testing.assert_close(got, chain.logprobs[:, k], rtol=1e-5, atol=1e-4)


def test_mean_is_sum_over_pixels(learner_fn):
    fn = learner_fn(EXERCISE, "gaussian_step_logprob")
    g = torch.Generator().manual_seed(5)
    mean = torch.randn(3, 1, 6, 6, generator=g, dtype=torch.float64)
    x = mean + torch.randn(3, 1, 6, 6, generator=g, dtype=torch.float64)
    std = torch.tensor([0.2, 0.4, 0.9], dtype=torch.float64)
    torch.testing.assert_close(fn(x, mean, std, reduction="sum"), 36 * fn(x, mean, std, reduction="mean"))


@pytest.mark.parametrize("seed", range(3))
def test_loss_matches_the_package(learner_fn, seed):
    fn = learner_fn(EXERCISE, "diffusion_grpo_loss")
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 7, generator=g, dtype=torch.float64) - 0.1
    logp = (old + 0.4 * torch.randn(6, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    kl = torch.rand(6, 7, generator=g, dtype=torch.float64)
    loss = fn(logp, old, adv, kl, epsilon=0.1, beta=0.05)
    (grad,) = torch.autograd.grad(loss, logp)
    ref_logp = logp.detach().clone().requires_grad_(True)
    expected, _ = clipped_surrogate_loss(ref_logp, old, adv, clip_eps=0.1)
    expected = expected + 0.05 * kl.mean()
    (ref_grad,) = torch.autograd.grad(expected, ref_logp)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)


def test_clipped_steps_get_no_gradient(learner_fn):
    """A > 0 and ρ > 1 + ε, or A < 0 and ρ < 1 − ε: the clip is active, that step's gradient is exactly 0."""
    fn = learner_fn(EXERCISE, "diffusion_grpo_loss")
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.5, 1.05, 0.5], [0.5, 0.95, 1.5]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss = fn(logp, old, adv, torch.zeros(2, 3, dtype=torch.float64), epsilon=0.2)
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0, 0] == 0 and grad[1, 0] == 0
    assert grad[0, 1] != 0 and grad[0, 2] != 0 and grad[1, 1] != 0 and grad[1, 2] != 0
