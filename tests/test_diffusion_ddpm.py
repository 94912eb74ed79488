"""Lesson 08's package: digits data, the diffusers UNet/scheduler factory, q_sample, the DDPM loss, sampling."""

import json
import math

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from minigrpo.diffusion.data import DIGIT_PROMPTS, load_digits_images, train_test_split
from minigrpo.diffusion.ddpm import ddpm_loss, pretrained_base, q_sample, sample, train_ddpm
from minigrpo.diffusion.models import load_base_model, make_scheduler, make_unet, null_class, save_base_model


@pytest.fixture(scope="module")
def digits():
    return load_digits_images(16)


@pytest.fixture(scope="module")
def sched():
    return make_scheduler()


def tiny_unet(seed=0):
    return make_unet(block_out_channels=(8, 16), norm_num_groups=4, seed=seed)


def test_digits_shapes_range_and_labels(digits):
    x, y = digits
    assert x.shape == (1797, 1, 16, 16) and x.dtype == torch.float32
    assert y.shape == (1797,) and y.dtype == torch.int64
    assert x.min() == -1.0 and x.max() == 1.0
    assert set(y.tolist()) == set(range(10)) and len(DIGIT_PROMPTS) == 10
    from sklearn.datasets import load_digits
    raw = torch.as_tensor(load_digits().images, dtype=torch.float32)
    x8, _ = load_digits_images(8)
    torch.testing.assert_close(x8[:, 0], raw / 8.0 - 1.0)  # 0..16 → [-1, 1], no resampling
    # bilinear upsampling by 2 keeps each 2x2 block's mean close to the original pixel
    torch.testing.assert_close(torch.nn.functional.avg_pool2d(x, 2)[:, 0].mean(), x8.mean(), atol=1e-2, rtol=0)


def _image_keys(images: torch.Tensor) -> list[bytes]:
    """Each image as its exact bytes: two keys are equal exactly when the images are pixel for pixel equal."""
    return [img.contiguous().numpy().tobytes() for img in images]


def _shared_images(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many images of ``a`` also appear (pixel for pixel) in ``b``."""
    seen = set(_image_keys(b))
    return sum(key in seen for key in _image_keys(a))


def test_split_is_fixed_disjoint_and_stratified(digits):
    x, y = digits
    a = train_test_split(x, y, test_fraction=0.2, seed=0)
    b = train_test_split(x, y, test_fraction=0.2, seed=0)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    assert not torch.equal(train_test_split(x, y, test_fraction=0.2, seed=1)[2], a[2])  # the seed matters
    xtr, ytr, xte, yte = a
    # The 1797 digits are distinct images, so "no test image in the training set" is a statement about images.
    keys = _image_keys(x)
    assert len(set(keys)) == 1797
    assert _shared_images(xte, xtr) == 0, "a test image is also in the training set"
    # the check sees a single leaked image
    assert _shared_images(xte, torch.cat([xtr, xte[17:18]])) == 1
    # Together the two parts are the data set, each image once, each with its own label.
    label_of = dict(zip(keys, y.tolist()))
    assert sorted(_image_keys(xtr) + _image_keys(xte)) == sorted(keys)
    assert [label_of[k] for k in _image_keys(xtr)] == ytr.tolist()
    assert [label_of[k] for k in _image_keys(xte)] == yte.tolist()
    # Stratified: each class puts round(0.2 · count) of its images in the test set, so its test fraction is
    # 0.2 within the rounding, 0.5 / count (count 174..183 here: within 0.0029), and each class's share of the
    # test set is its share of the data set within (0.5 + 0.1 · 0.4) / 359 < 0.6 / 359: its own rounding, plus
    # the total's (359 test images, not 0.2 · 1797 = 359.4).
    counts, test_counts = torch.bincount(y, minlength=10), torch.bincount(yte, minlength=10)
    assert torch.equal(test_counts, (counts * 0.2).round().long())
    assert ((test_counts / counts - 0.2).abs() <= 0.5 / counts).all()
    n_test = xte.shape[0]
    assert n_test == 359 and xtr.shape[0] == 1797 - 359
    assert ((test_counts / n_test - counts / 1797).abs() <= 0.6 / n_test).all()
    with pytest.raises(ValueError, match="test_fraction"):
        train_test_split(x, y, test_fraction=1.0)
    with pytest.raises(ValueError, match="size"):
        load_digits_images(4)


def test_q_sample_equals_diffusers_add_noise_and_hand_values(sched):
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(6, 1, 16, 16, generator=g), torch.randn(6, 1, 16, 16, generator=g)
    t = torch.tensor([0, 1, 10, 50, 98, 99])
    torch.testing.assert_close(q_sample(x0, t, noise, sched.alphas_cumprod), sched.add_noise(x0, noise, t))
    # by hand from the betas: alpha_bar_t = prod_{s<=t} (1 - beta_s)
    betas = sched.betas.double()
    abar = torch.cumprod(1 - betas, 0)
    out = q_sample(x0.double(), t, noise.double(), sched.alphas_cumprod.double())
    for i, ti in enumerate(t.tolist()):
        expected = abar[ti].sqrt() * x0[i].double() + (1 - abar[ti]).sqrt() * noise[i].double()
        torch.testing.assert_close(out[i], expected, atol=2e-6, rtol=0)  # diffusers' cumprod is float32
    assert abar[-1] < 1e-5 and abar[0] > 0.999  # the cosine schedule ends in (almost) pure noise


def iterated_noising_z_scores(sched, seed: int, n: int = 40_000):
    """Iterate x_t = sqrt(1-beta_t) x_{t-1} + sqrt(beta_t) z_t for n chains from three x0 (float64, ``seed``);
    at t = 0, 5, 30, 70 the deviations of the sample mean and variance from the closed form, in standard
    errors (sqrt(var/n) and var·sqrt(2/n)): ``{t: (mean z-scores [3], variance z-scores [3])}``."""
    betas, abar = sched.betas.double(), sched.alphas_cumprod.double()
    g = torch.Generator().manual_seed(seed)
    x0 = torch.tensor([-1.0, 0.3, 1.0], dtype=torch.float64)
    x = x0.expand(n, 3).clone()
    out = {}
    for t in range(71):
        x = (1 - betas[t]).sqrt() * x + betas[t].sqrt() * torch.randn(n, 3, generator=g, dtype=torch.float64)
        if t in (0, 5, 30, 70):
            mean, var = abar[t].sqrt() * x0, 1 - abar[t]
            out[t] = ((x.mean(0) - mean) / (var / n).sqrt(), (x.var(0) - var) / (var * (2 / n) ** 0.5))
    return out


#: Bound on the sample mean's and variance's deviation from the closed form, in standard errors.
NOISING_Z_BOUND = 7.0


def test_closed_form_matches_iterated_noising_in_float64(sched):
    """x_t = sqrt(1-beta_t) x_{t-1} + sqrt(beta_t) z_t, iterated, has the closed form's mean and variance.

    Measured (benchmarks/margins_models.py, generator seeds 0–9 × torch threads 1, 2, the same on both): the
    largest |z| of the 24 checks per seed 1.5–3.4 standard errors (max 3.41, seed 7); asserted < 7 (a 10%
    error in a variance is 14 standard errors).
    """
    for t, (z_mean, z_var) in iterated_noising_z_scores(sched, 1).items():
        assert z_mean.abs().max() < NOISING_Z_BOUND and z_var.abs().max() < NOISING_Z_BOUND, (t, z_mean, z_var)
    betas, abar = sched.betas.double(), sched.alphas_cumprod.double()
    for t in (0, 5, 30, 70):
        # and exactly: composing the one-step Gaussians gives coefficient sqrt(abar_t), variance 1 - abar_t
        coef = torch.prod((1 - betas[: t + 1]).sqrt())
        var_exact = sum(betas[s] * torch.prod(1 - betas[s + 1: t + 1]) for s in range(t + 1))
        torch.testing.assert_close(coef, abar[t].sqrt())
        torch.testing.assert_close(var_exact, 1 - abar[t])


def ddpm_training_run(digits, sched, seed: int, steps: int = 40):
    """A tiny UNet's ε-prediction loss on 16 digits before training, and the losses of ``steps`` training steps."""
    x, y = digits
    unet = tiny_unet(seed)
    with torch.no_grad():
        loss = ddpm_loss(unet, x[:16], y[:16], sched, generator=torch.Generator().manual_seed(seed)).item()
    losses = train_ddpm(unet, sched, x, y, steps=steps, batch_size=16, lr=3e-3, seed=seed, progress=False)
    return loss, losses, unet


#: An untrained net's loss must exceed this; training must cut the mean loss of the last 10 steps
#: below (1 − MIN_LOSS_DROP) times that of the first 10.
MIN_UNTRAINED_LOSS, MIN_LOSS_DROP = 0.45, 0.3


def test_loss_is_finite_and_training_lowers_it(digits, sched):
    """An untrained net predicts ε badly; 40 training steps cut the loss.

    Measured (benchmarks/margins_models.py, seeds 0–4 × torch threads 1, 2, the same on both: train_ddpm pins one
    thread): untrained loss 0.99–1.12 (min 0.988), asserted > 0.45; the mean loss of the last 10 steps is
    65–71% below that of the first 10 (min 0.653), asserted drop > 0.3.
    """
    loss, losses, unet = ddpm_training_run(digits, sched, 0)
    assert math.isfinite(loss) and loss > MIN_UNTRAINED_LOSS
    assert len(losses) == 40 and all(map(math.isfinite, losses))
    drop = 1 - (sum(losses[-10:]) / 10) / (sum(losses[:10]) / 10)
    assert drop > MIN_LOSS_DROP, losses
    assert not unet.training


def test_save_load_roundtrip_gives_identical_outputs(tmp_path, sched):
    unet = tiny_unet().eval()
    save_base_model(unet, sched, tmp_path / "base")
    unet2, sched2 = load_base_model(tmp_path / "base")
    x, t, y = torch.randn(4, 1, 16, 16), torch.tensor([0, 10, 50, 99]), torch.tensor([0, 3, 9, 10])
    with torch.no_grad():
        assert torch.equal(unet(x, t, class_labels=y).sample, unet2(x, t, class_labels=y).sample)
    public = lambda c: {k: v for k, v in c.items() if not k.startswith("_")}
    assert isinstance(sched2, DDPMScheduler) and public(sched2.config) == public(sched.config)
    assert torch.equal(sched2.alphas_cumprod, sched.alphas_cumprod)
    ddim = DDIMScheduler.from_config(sched2.config)
    assert torch.equal(ddim.alphas_cumprod, sched.alphas_cumprod)
    with pytest.raises(ValueError, match="unet"):
        load_base_model(tmp_path / "missing")


def test_sample_shapes_determinism_and_scheduler_untouched(sched):
    unet = tiny_unet().eval()
    labels = torch.tensor([0, 1, 2, 9])
    a = sample(unet, sched, labels, num_inference_steps=5, generator=torch.Generator().manual_seed(0))
    b = sample(unet, sched, labels, num_inference_steps=5, generator=torch.Generator().manual_seed(0))
    assert a.shape == (4, 1, 16, 16) and torch.equal(a, b) and torch.isfinite(a).all()
    assert len(sched.timesteps) == sched.config.num_train_timesteps  # sample() worked on a copy
    ddim = DDIMScheduler.from_config(sched.config)
    c = sample(unet, ddim, labels, num_inference_steps=5, eta=1.0, guidance_scale=2.0,
               generator=torch.Generator().manual_seed(0))
    assert c.shape == a.shape and torch.isfinite(c).all()


def test_bad_inputs_raise_clear_errors(digits, sched):
    x, y = digits
    unet = tiny_unet()
    assert null_class(unet) == 10
    with pytest.raises(ValueError, match=r"\[B, 1, 16, 16\]"):
        ddpm_loss(unet, torch.randn(2, 1, 8, 8), torch.tensor([0, 1]), sched)
    with pytest.raises(ValueError, match="labels must be in"):
        ddpm_loss(unet, x[:2], torch.tensor([0, 11]), sched)
    with pytest.raises(ValueError, match="labels must be in"):
        train_ddpm(unet, sched, x[:2], torch.tensor([0, 10]), steps=1, progress=False)  # null class is not data
    with pytest.raises(ValueError, match="integer"):
        sample(unet, sched, torch.tensor([0.0, 1.0]), num_inference_steps=2)
    with pytest.raises(ValueError, match="one entry per image"):
        ddpm_loss(unet, x[:3], y[:2], sched)
    with pytest.raises(ValueError, match="same shape"):
        q_sample(x[:2], torch.tensor([0, 1]), x[:3], sched.alphas_cumprod)
    with pytest.raises(ValueError, match="t must be in"):
        q_sample(x[:2], torch.tensor([0, 100]), x[:2], sched.alphas_cumprod)
    with pytest.raises(ValueError, match="divisible"):
        make_unet(image_size=10)
    with pytest.raises(ValueError, match="unknown base-model settings"):
        pretrained_base(stepz=3)


def test_pretrained_base_trains_once_then_loads_from_cache(tmp_path):
    kw = dict(cache_dir=tmp_path, seed=0, steps=3, batch_size=8, block_out_channels=[8, 16], norm_num_groups=4,
              progress=False)
    unet, sched = pretrained_base(**kw)
    (folder,) = list(tmp_path.iterdir())
    log = json.loads((folder / "train.json").read_text())
    assert len(log["losses"]) == 3 and log["config"]["steps"] == 3 and log["seconds"] > 0
    unet2, _ = pretrained_base(**kw)
    for p, q in zip(unet.state_dict().values(), unet2.state_dict().values()):
        assert torch.equal(p, q)
    pretrained_base(**{**kw, "seed": 1})
    assert len(list(tmp_path.iterdir())) == 2  # another seed, another folder
