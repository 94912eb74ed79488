"""The Stable-Diffusion-shaped GRPO path on tiny random components (minigrpo.diffusion.text_to_image*).

Oracles: diffusers' own ``DDIMScheduler.step`` (with the guided noise prediction computed by hand, two
separate UNet calls) for the per-step Gaussian; the recorded log-probs for ratio = 1; peft's
``save_pretrained`` / ``PeftModel.from_pretrained`` for the adapters; ``CLIPModel``'s own logits for the
CLIP score. Everything is built from configs in a temporary folder: nothing is downloaded.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from peft import LoraConfig  # noqa: E402

from minigrpo.diffusion.sampler import ReverseProcess  # noqa: E402
from minigrpo.diffusion.text_to_image import (UNET_LORA_TARGETS, GuidedDenoiser, PromptEmbeds,  # noqa: E402
                                              TextToImagePolicy, tiny_components, with_prompts)
from minigrpo.diffusion.text_to_image_grpo import TextToImageGRPOConfig, TextToImageGRPOTrainer  # noqa: E402
from minigrpo.diffusion.text_to_image_rewards import (CLIPScoreReward, ColourReward, colour_of,  # noqa: E402
                                                      smoothness_reward)

PROMPTS = ["a red square", "a blue sky", "a green apple"]


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-sd")
    tiny_components(folder, seed=0)
    return folder


def _policy(folder) -> TextToImagePolicy:
    return TextToImagePolicy.from_pretrained(folder)


def _lora():
    return LoraConfig(r=4, lora_alpha=4, target_modules=list(UNET_LORA_TARGETS), init_lora_weights=True)


def _trainer(folder, **overrides) -> TextToImageGRPOTrainer:
    cfg = dict(max_steps=2, prompts_per_step=2, num_generations=2, num_inference_steps=4, guidance_scale=4.0,
               learning_rate=1e-2, epsilon=0.2)
    cfg.update(overrides)
    return TextToImageGRPOTrainer(_policy(folder), ColourReward(), PROMPTS, TextToImageGRPOConfig(**cfg),
                                  peft_config=_lora())


def test_from_pretrained_reloads_the_saved_pipeline(tmp_path):
    built = tiny_components(tmp_path, seed=1, save=False)
    built.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_index.json", "scheduler", "text_encoder",
                                                          "tokenizer", "unet", "vae"]
    loaded = _policy(tmp_path)
    for name in ("text_encoder", "unet", "vae"):
        a, b = getattr(built, name).state_dict(), getattr(loaded, name).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert type(loaded.scheduler).__name__ == "DDIMScheduler"
    public = lambda cfg: {k: v for k, v in cfg.items() if not k.startswith("_")}  # noqa: E731
    assert public(loaded.scheduler.config) == public(built.scheduler.config)
    assert loaded.latent_shape == (4, 8, 8)
    e1, e2 = built.encode_prompts(PROMPTS), loaded.encode_prompts(PROMPTS)
    assert torch.equal(e1.cond, e2.cond) and torch.equal(e1.uncond, e2.uncond) and e1.cond.shape == (3, 16, 32)
    # the tokenizer knows the words as whole tokens: <|startoftext|> a red square <|endoftext|> (padding)
    ids = loaded.tokenizer("a red square").input_ids
    assert loaded.tokenizer.convert_ids_to_tokens(ids) == ["<|startoftext|>", "a</w>", "red</w>", "square</w>",
                                                           "<|endoftext|>"]


def test_guided_step_logprob_is_the_density_of_ddim_scheduler_step(pipeline_folder):
    # diffusers' DDIMScheduler.step on the guided ε (two separate UNet calls by hand) gives x_prev = μ + σ·z;
    # our per-step log-prob of that x_prev must be the Gaussian density of σ·z, and our mean diffusers' μ.
    policy = _policy(pipeline_folder)
    eta, w, K = 1.0, 5.0, 5
    embeds = policy.encode_prompts(PROMPTS[:2])
    process = with_prompts(ReverseProcess(policy.scheduler, K, eta), embeds, w)
    g = torch.Generator().manual_seed(0)
    x_t = torch.randn(2, *policy.latent_shape, generator=g)
    z = torch.randn(x_t.shape, generator=g)
    labels = torch.tensor([0, 1])
    sched = copy.deepcopy(policy.scheduler)
    sched.set_timesteps(K)
    for t in sched.timesteps[[0, 2, K - 1]]:
        with torch.no_grad():
            eps_c = policy.unet(x_t, t, encoder_hidden_states=embeds.cond).sample
            eps_u = policy.unet(x_t, t, encoder_hidden_states=embeds.uncond.expand_as(embeds.cond)).sample
            eps = eps_u + w * (eps_c - eps_u)
            x_prev = sched.step(eps, t, x_t, eta=eta, variance_noise=z).prev_sample
            logp, mean, std = process.step_logprob(policy.unet, x_t, x_prev, t, labels, "sum", return_mean=True)
        prev_t = int(t) - sched.config.num_train_timesteps // K
        sigma = eta * float(sched._get_variance(int(t), prev_t)) ** 0.5
        assert std.flatten().tolist() == pytest.approx([sigma] * 2, rel=1e-5)
        torch.testing.assert_close(mean, x_prev - sigma * z, rtol=1e-4, atol=1e-5)
        z64 = z.double()
        expected = (-(z64**2) / 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)).flatten(1).sum(1)
        torch.testing.assert_close(logp.double(), expected, rtol=1e-4, atol=1e-3)


def test_guidance_one_is_the_conditional_model_and_other_scales_need_the_empty_prompt(pipeline_folder):
    policy = _policy(pipeline_folder)
    embeds = policy.encode_prompts(PROMPTS[:2])
    x, t, labels = torch.randn(2, *policy.latent_shape), torch.tensor([901, 501]), torch.tensor([1, 0])
    with torch.no_grad():
        ours = GuidedDenoiser(embeds, 1.0)(policy.unet, x, t, labels)
        ref = policy.unet(x, t, encoder_hidden_states=embeds.cond[labels]).sample
    torch.testing.assert_close(ours, ref)
    no_uncond = PromptEmbeds(embeds.prompts, embeds.cond, None)
    with pytest.raises(ValueError, match="guidance_scale=7.5 needs the unconditional"):
        GuidedDenoiser(no_uncond, 7.5)
    GuidedDenoiser(no_uncond, 1.0)  # no guidance: no empty prompt needed


def test_recorded_logprobs_recompute_to_ratio_one(pipeline_folder):
    trainer = _trainer(pipeline_folder, num_inference_steps=3)
    ro = trainer.rollout()
    chain = ro.chain
    assert chain.xs.shape == (4, 4, 4, 8, 8) and ro.images.shape == (4, 3, 16, 16)
    with torch.no_grad():
        for k in range(chain.num_steps):  # the sampler's own path (one timestep per batch): bit-identical
            lp = ro.process.step_logprob(trainer.unet, chain.xs[k], chain.xs[k + 1], chain.timesteps[k],
                                         chain.labels, "mean")
            assert torch.equal(lp, chain.logprobs[:, k])
        # the trainer's path: rows of mixed timesteps in one batch
        loss, stats = trainer.compute_loss(ro, torch.arange(ro.steps.numel()))
    assert stats["log_ratio_abs_max"] < 1e-5 and stats["clip_ratio/region_mean"] == 0  # measured: ~1e-7


def test_one_grpo_step_changes_only_the_lora_parameters(pipeline_folder):
    trainer = _trainer(pipeline_folder, beta=0.1, train_batch_size=3)
    before = {name: {k: v.clone() for k, v in getattr(trainer.policy, name).state_dict().items()}
              for name in ("unet", "text_encoder", "vae")}
    m = trainer.step()
    changed = [k for k, v in trainer.unet.state_dict().items() if not torch.equal(v, before["unet"][k])]
    lora = [k for k in before["unet"] if "lora_" in k]
    assert changed and set(changed) <= set(lora) and len(changed) >= len(lora) // 2
    for name in ("text_encoder", "vae"):
        assert all(torch.equal(v, before[name][k]) for k, v in getattr(trainer.policy, name).state_dict().items())
    # one minibatch: the adapters start at B = 0, so the policy is its reference (measured: 6e-13, rows batched
    # differently for π_ref and for the loss)
    assert 0 <= m["kl"] < 1e-9
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0


def test_adapters_save_and_load_give_identical_logprobs_and_off_is_the_base(pipeline_folder, tmp_path):
    trainer = _trainer(pipeline_folder)
    trainer.step()
    ro = trainer.rollout()
    rows = torch.arange(ro.steps.numel())
    b, k = trainer._rows(ro.steps, rows)
    args = (ro.chain.xs[k, b], ro.chain.xs[k + 1, b], ro.chain.timesteps[k], ro.chain.labels[b], "sum")
    trainer.save_adapter(tmp_path / "adapter")
    fresh = _policy(pipeline_folder)
    with torch.no_grad():
        base = ro.process.step_logprob(fresh.unet, *args)
        fresh.load_adapter(tmp_path / "adapter")
        assert torch.equal(ro.process.step_logprob(fresh.unet, *args), ro.process.step_logprob(trainer.unet, *args))
        with trainer.unet.disable_adapter():  # the reference policy: the same UNet, adapters off
            off = ro.process.step_logprob(trainer.unet, *args)
        on = ro.process.step_logprob(trainer.unet, *args)
    torch.testing.assert_close(off, base, rtol=0, atol=1e-4)
    assert (on - off).abs().max() > 1e-3  # one step at lr 1e-2 moved the policy (measured: ~0.1 nats)


def test_errors_are_one_sentence_naming_the_field(pipeline_folder):
    with pytest.raises(ValueError, match=r"TextToImageGRPOConfig\.eta must be > 0"):
        TextToImageGRPOConfig(eta=0.0)
    with pytest.raises(ValueError, match=r"TextToImageGRPOConfig\.guidance_scale"):
        TextToImageGRPOConfig(guidance_scale=0.5)
    policy = _policy(pipeline_folder)
    with pytest.raises(ValueError, match=r"LoraConfig\.target_modules names 'to_x'"):
        policy.add_lora(LoraConfig(target_modules=["to_q", "to_x"]))
    trainer = TextToImageGRPOTrainer(policy, [ColourReward(), lambda images, prompts: images.mean((1, 2, 3))[:-1]],
                                     PROMPTS, TextToImageGRPOConfig(prompts_per_step=1, num_generations=2),
                                     peft_config=_lora())
    images = torch.rand(2, 3, 16, 16)
    with pytest.raises(ValueError, match=r"reward function '<lambda>'.*shape \[2\]"):
        trainer.score(images, PROMPTS[:1] * 2)
    trainer.reward_funcs[1] = lambda images, prompts: torch.tensor([0.5, float("nan")])
    with pytest.raises(ValueError, match="NaN"):
        trainer.score(images, PROMPTS[:1] * 2)
    with pytest.raises(ValueError, match="names no colour"):
        ColourReward()(images, ["a cat", "a dog"])
    with pytest.raises(ValueError, match="prompts_per_step"):
        TextToImageGRPOTrainer(_policy(pipeline_folder), ColourReward(), PROMPTS[:1],
                               TextToImageGRPOConfig(prompts_per_step=2))


def test_colour_reward_by_hand():
    images = torch.zeros(2, 3, 4, 4)
    images[0, 0] = 1.0  # a pure red image
    r = ColourReward()(images, ["a red square", "a white square"])
    assert r.tolist() == pytest.approx([1.0, 0.0])
    assert colour_of("A Blue sky") == (0.0, 0.0, 1.0)
    # total variation by hand: a flat image 0; vertical stripes 0,1,0,1 (4 wide): |dx| = 1 everywhere, |dy| = 0
    stripes = torch.zeros(1, 3, 4, 4)
    stripes[..., 1::2] = 1.0
    assert smoothness_reward(torch.cat([torch.full((1, 3, 4, 4), 0.3), stripes]), ["a", "b"]).tolist() == [0.0, -1.0]


def test_clip_score_is_clipmodels_cosine_similarity():
    from transformers import CLIPConfig, CLIPModel

    from minigrpo.diffusion.text_to_image import write_tiny_clip_tokenizer

    torch.manual_seed(0)
    text = dict(vocab_size=1000, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=16, projection_dim=16)
    vision = dict(image_size=16, patch_size=4, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                  num_attention_heads=4, projection_dim=16)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).eval()
    import tempfile

    from transformers import CLIPTokenizer
    with tempfile.TemporaryDirectory() as d:
        tok = CLIPTokenizer.from_pretrained(write_tiny_clip_tokenizer(d))
    reward = CLIPScoreReward(model, tok)
    images = torch.rand(3, 3, 24, 24)
    r = reward(images, PROMPTS)
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                    pixel_values=reward.pixel_values(images))
    torch.testing.assert_close(r, out.logits_per_image.diagonal() / model.logit_scale.exp(), rtol=1e-5, atol=1e-6)
    assert r.shape == (3,) and (r.abs() <= 1).all()


def test_tiny_end_to_end_run_has_finite_rewards(pipeline_folder):
    trainer = _trainer(pipeline_folder, timestep_fraction=0.5, num_minibatches=2, sample_batch_size=2)
    result = trainer.train(progress=False)
    h = result.history
    assert h["step"] == [1, 2] and len(h["reward"]) == 2
    assert all(math.isfinite(v) for key in ("reward", "loss", "grad_norm") for v in h[key])
    assert all(0 <= v <= 1 for v in h["rewards/colour_reward/mean"])


def test_a_flow_matching_scheduler_trains_with_flow_grpos_sde(pipeline_folder):
    # the same trainer on a FlowMatchEulerDiscreteScheduler (SD3/FLUX's): the UNet is read as a velocity model,
    # the chain is Flow-GRPO's SDE with noise level a = eta, and the guided velocity enters its mean
    from minigrpo.diffusion.flow import FlowProcess, make_flow_scheduler

    policy = _policy(pipeline_folder)
    policy.scheduler = make_flow_scheduler(shift=3.0)
    cfg = TextToImageGRPOConfig(max_steps=1, prompts_per_step=1, num_generations=2, num_inference_steps=3, eta=0.7,
                                epsilon=0.2)
    trainer = TextToImageGRPOTrainer(policy, ColourReward(), PROMPTS, cfg, peft_config=_lora())
    assert isinstance(trainer.process, FlowProcess)
    m = trainer.step()
    assert m["log_ratio_abs_max"] < 1e-5 and math.isfinite(m["loss"])  # one minibatch: ratio 1
    with pytest.raises(ValueError, match=r"TextToImageGRPOConfig\.eta must be > 0"):  # a = 0 is the ODE
        TextToImageGRPOConfig(eta=0.0, sampler="ddpm")


def test_guided_sampler_at_eta_zero_is_stable_diffusion_pipelines(pipeline_folder):
    # the saved folder is a StableDiffusionPipeline; with η = 0 (deterministic DDIM, sampling only) and the same
    # starting latents, our guided chain ends where diffusers' pipeline does (measured: 1.7e-5 on latents of size ~20)
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(pipeline_folder, safety_checker=None, feature_extractor=None,
                                                   requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    policy = _policy(pipeline_folder)
    x_T = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = pipe(PROMPTS[:2], latents=x_T.clone(), num_inference_steps=4, guidance_scale=7.5, eta=0.0,
                   output_type="latent", height=16, width=16).images
        process = ReverseProcess(policy.scheduler, 4, 0.0, allow_deterministic=True)
        chain = with_prompts(process, policy.encode_prompts(PROMPTS[:2]), 7.5).sample(
            policy.unet, torch.tensor([0, 1]), shape=policy.latent_shape, x_T=x_T.clone())
    torch.testing.assert_close(chain.images, ref, rtol=1e-5, atol=1e-4)
