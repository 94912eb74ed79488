"""A Stable-Diffusion-shaped policy for GRPO: text encoder, latent UNet, VAE, scheduler — and guidance
inside the policy's mean.

Lessons 08–09 denoise 16×16 digits with a class index as the prompt. A text-to-image model (Stable
Diffusion 1.x, Rombach et al. 2022, arXiv:2112.10752) changes four things and keeps the sampler:

- **latents**: the UNet denoises ``[4, H/8, W/8]`` latents of an ``AutoencoderKL``; the chain, its
  Gaussian steps and their log-probs live in latent space, and the VAE decodes only the final latent
  (``latents / scaling_factor``) into the image the reward sees;
- **text**: a ``CLIPTextModel`` turns each prompt into ``[L, D]`` token embeddings that the UNet
  attends to (``encoder_hidden_states``); they are computed once per rollout, frozen;
- **classifier-free guidance** (Ho & Salimans 2022, arXiv:2207.12598): the sampler's noise prediction
  is ``ε̂ = ε(x, ∅) + w·(ε(x, c) − ε(x, ∅))`` with the empty prompt's embedding ∅. That guided ε̂ is
  what goes into the scheduler's mean, so the policy π_θ(x_{t−1} | x_t, c) whose log-probs and ratios
  GRPO uses *is the guided sampler* (DDPO does the same): :class:`GuidedDenoiser` is the ``model_fn`` of
  :class:`~minigrpo.diffusion.sampler.ReverseProcess`, the rest of the sampler is unchanged;
- **LoRA**: the UNet is trained through ``peft`` adapters on its attention projections; the reference
  policy of the KL term is the same UNet with the adapters off (``with unet.disable_adapter():``).

``TextToImagePolicy.from_pretrained`` loads a diffusers pipeline folder (subfolders ``text_encoder``,
``tokenizer``, ``unet``, ``vae``, ``scheduler``); :func:`tiny_components` builds random, tiny ones from
configs (as diffusers' own tests do) so that everything runs on a CPU in seconds, with no download.
"""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from minigrpo.diffusion.sampler import ReverseProcess

#: the attention projections of diffusers' UNet blocks (self- and cross-attention): LoRA's usual targets
UNET_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


@dataclass
class PromptEmbeds:
    """The text encoder's output for the distinct prompts of a rollout (computed once, no gradient)."""

    prompts: list[str]  #: the P distinct prompts
    cond: torch.Tensor  #: [P, L, D] token embeddings of each prompt
    uncond: torch.Tensor | None  #: [1, L, D] the empty prompt's embeddings (None: no guidance possible)


class GuidedDenoiser:
    """The ``model_fn`` of :class:`ReverseProcess` for a text-conditional UNet with classifier-free guidance.

    ``labels`` are row indices into ``embeds.cond`` (one distinct prompt each), so the sampler's recorded
    chains stay the digits' ones (a 1-D tensor of "labels" per chain). The UNet runs in its own dtype
    (bf16 on a GPU); the latents, means and log-probs stay in the latents' dtype (float32).

    Returns ``ε(x, ∅) + w·(ε(x, c) − ε(x, ∅))`` — one UNet call on the batch doubled (unconditional rows
    first, as diffusers' pipelines do); with ``w = 1`` only the conditional half is computed.
    """

    def __init__(self, embeds: PromptEmbeds, guidance_scale: float):
        w = float(guidance_scale)
        if not w >= 0:
            raise ValueError(f"guidance_scale must be >= 0, got {guidance_scale}")
        if w != 1 and embeds.uncond is None:
            raise ValueError(f"guidance_scale={w} needs the unconditional (empty-prompt) embedding, but "
                             f"PromptEmbeds.uncond is None: encode the prompts with with_uncond=True, or use "
                             f"guidance_scale=1 (no guidance)")
        self.embeds, self.guidance_scale = embeds, w

    def __call__(self, unet, x_t: torch.Tensor, t: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        cond = self.embeds.cond[labels.to(self.embeds.cond.device)]  # [B, L, D]
        x = x_t.to(cond.dtype)
        if self.guidance_scale == 1:
            return unet(x, t, encoder_hidden_states=cond).sample.to(x_t.dtype)
        uncond = self.embeds.uncond.expand_as(cond)
        eps = unet(torch.cat([x, x]), torch.cat([t, t]), encoder_hidden_states=torch.cat([uncond, cond])).sample
        eps_uncond, eps_cond = eps.to(x_t.dtype).chunk(2)
        return eps_uncond + self.guidance_scale * (eps_cond - eps_uncond)


def with_prompts(process: ReverseProcess, embeds: PromptEmbeds, guidance_scale: float) -> ReverseProcess:
    """A shallow copy of ``process`` whose network call is the guided UNet on ``embeds`` (the schedule is shared)."""
    p = copy.copy(process)
    p.model_fn = GuidedDenoiser(embeds, guidance_scale)
    return p


def check_lora_targets(unet: torch.nn.Module, peft_config) -> None:
    """A ValueError naming ``LoraConfig.target_modules`` when one of its names matches no module of ``unet``
    (peft matches a name or a dotted suffix of one); a regex string or ``"all-linear"`` is left to peft."""
    targets = getattr(peft_config, "target_modules", None)
    if targets is None or isinstance(targets, str):
        return
    names = [n for n, _ in unet.named_modules()]
    for key in targets:
        if not any(n == key or n.endswith("." + key) for n in names):
            raise ValueError(f"LoraConfig.target_modules names {key!r}, which matches no module of the UNet "
                             f"(its attention projections are {', '.join(UNET_LORA_TARGETS)})")


def _base(unet: torch.nn.Module) -> torch.nn.Module:
    """The UNet under its adapters (a peft model), or the UNet itself."""
    return unet.get_base_model() if hasattr(unet, "get_base_model") else unet


class TextToImagePolicy:
    """The parts of a latent text-to-image diffusion model, and what a GRPO rollout needs of them.

    Args:
        text_encoder: a ``transformers.CLIPTextModel`` (frozen here).
        tokenizer: its ``CLIPTokenizer``.
        unet: a ``diffusers.UNet2DConditionModel`` (or one wrapped by peft with LoRA adapters).
        vae: a ``diffusers.AutoencoderKL`` (frozen here); latents are scaled by its ``scaling_factor``.
        scheduler: a ``DDIMScheduler`` or ``DDPMScheduler`` (its noise schedule defines the chain).
    """

    COMPONENTS = ("text_encoder", "tokenizer", "unet", "vae", "scheduler")

    def __init__(self, text_encoder, tokenizer, unet, vae, scheduler):
        self.text_encoder = text_encoder.eval().requires_grad_(False)
        self.vae = vae.eval().requires_grad_(False)
        self.tokenizer, self.unet, self.scheduler = tokenizer, unet, scheduler

    # ------------------------------------------------------------------ loading and saving
    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, dtype: torch.dtype | None = None) -> TextToImagePolicy:
        """Load a diffusers pipeline folder (or hub id) with subfolders ``text_encoder``, ``tokenizer``, ``unet``,
        ``vae``, ``scheduler``. The scheduler is a ``DDPMScheduler`` if it was saved as one, else a
        ``DDIMScheduler`` on the saved noise schedule (Stable Diffusion ships a PNDM config)."""
        from diffusers import AutoencoderKL, DDIMScheduler, DDPMScheduler, UNet2DConditionModel
        from transformers import CLIPTextModel, CLIPTokenizer

        path = str(name_or_path)
        kw = {} if dtype is None else {"torch_dtype": dtype}
        sched_cfg = DDIMScheduler.load_config(path, subfolder="scheduler")
        sched_cls = DDPMScheduler if sched_cfg.get("_class_name") == "DDPMScheduler" else DDIMScheduler
        with _quiet():
            text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder",
                                                         **({} if dtype is None else {"dtype": dtype}))
        return cls(text_encoder=text_encoder,
                   tokenizer=CLIPTokenizer.from_pretrained(path, subfolder="tokenizer"),
                   unet=UNet2DConditionModel.from_pretrained(path, subfolder="unet", **kw),
                   vae=AutoencoderKL.from_pretrained(path, subfolder="vae", **kw),
                   scheduler=sched_cls.from_config(sched_cfg))

    def save_pretrained(self, folder: str | Path) -> Path:
        """Save the components as a diffusers pipeline folder (the UNet without adapters: save those with
        ``unet.save_pretrained``); ``model_index.json`` names the classes as ``StableDiffusionPipeline`` does."""
        import diffusers

        folder = Path(folder)
        for name in self.COMPONENTS:
            part = _base(self.unet) if name == "unet" else getattr(self, name)
            part.save_pretrained(folder / name)
        index = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": diffusers.__version__,
                 "text_encoder": ["transformers", type(self.text_encoder).__name__],
                 "tokenizer": ["transformers", "CLIPTokenizer"],
                 "unet": ["diffusers", type(_base(self.unet)).__name__],
                 "vae": ["diffusers", type(self.vae).__name__],
                 "scheduler": ["diffusers", type(self.scheduler).__name__],
                 "safety_checker": [None, None], "feature_extractor": [None, None], "requires_safety_checker": False}
        (folder / "model_index.json").write_text(json.dumps(index, indent=2))
        return folder

    # ------------------------------------------------------------------ adapters
    def add_lora(self, peft_config) -> torch.nn.Module:
        """Wrap the UNet with LoRA adapters (``peft.get_peft_model``): base weights frozen, adapters trainable."""
        from peft import PeftConfig, get_peft_model

        if not isinstance(peft_config, PeftConfig):
            raise TypeError(f"peft_config must be a peft config such as peft.LoraConfig, got "
                            f"{type(peft_config).__name__}")
        if hasattr(self.unet, "disable_adapter"):
            raise ValueError("the UNet already has adapters: train them (peft_config=None) or start from the base")
        check_lora_targets(self.unet, peft_config)
        self.unet = get_peft_model(self.unet, peft_config)
        return self.unet

    def load_adapter(self, folder: str | Path, is_trainable: bool = False) -> torch.nn.Module:
        """Put saved adapters (``unet.save_pretrained(folder)``) on the base UNet: ``PeftModel.from_pretrained``."""
        from peft import PeftModel

        self.unet = PeftModel.from_pretrained(_base(self.unet), str(folder), is_trainable=is_trainable)
        return self.unet

    # ------------------------------------------------------------------ what a rollout needs
    @property
    def device(self) -> torch.device:
        return next(_base(self.unet).parameters()).device

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """``(C, h, w)`` of one latent, from the UNet's config."""
        c = _base(self.unet).config
        size = c.sample_size if isinstance(c.sample_size, (tuple, list)) else (c.sample_size, c.sample_size)
        return (c.in_channels, *size)

    def to(self, device) -> TextToImagePolicy:
        for name in ("text_encoder", "unet", "vae"):
            getattr(self, name).to(device)
        return self

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], with_uncond: bool = True) -> PromptEmbeds:
        """Token embeddings ``[P, L, D]`` of each prompt (padded to the tokenizer's ``model_max_length``) and,
        with ``with_uncond``, of the empty prompt ``""`` (classifier-free guidance's unconditional input)."""
        if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise TypeError(f"prompts must be a non-empty list of str, got {prompts!r}")
        texts = list(prompts) + ([""] if with_uncond else [])
        tok = self.tokenizer(texts, padding="max_length", max_length=self.tokenizer.model_max_length,
                             truncation=True, return_tensors="pt")
        hidden = self.text_encoder(tok.input_ids.to(self.text_encoder.device))[0]
        hidden = hidden.to(_base(self.unet).dtype)
        P = len(prompts)
        return PromptEmbeds(list(prompts), hidden[:P], hidden[P:] if with_uncond else None)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` in [0, 1] from latents ``[B, C, h, w]`` (the VAE's decoder, in float32 out)."""
        sf = self.vae.config.scaling_factor
        images = self.vae.decode((latents / sf).to(self.vae.dtype)).sample
        return (images.float() / 2 + 0.5).clamp(0, 1)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Latents (a sample of the VAE's posterior, times ``scaling_factor``) of images in [0, 1]."""
        dist = self.vae.encode((images * 2 - 1).to(self.vae.dtype)).latent_dist
        return dist.sample(generator) * self.vae.config.scaling_factor


# ---------------------------------------------------------------------------------- tiny components
#: words the tiny tokenizer knows as whole tokens (others fall back to characters)
TINY_WORDS = ("a", "an", "the", "photo", "painting", "of", "red", "green", "blue", "yellow", "white", "black",
              "orange", "purple", "cyan", "magenta", "gray", "square", "circle", "cat", "dog", "apple", "sky",
              "flower", "car", "house", "sunset", "bright", "dark", "on", "in", "with")


def _byte_alphabet() -> list[str]:
    """256 printable characters standing for the 256 bytes (the byte-level BPE convention of GPT-2 and CLIP):
    printable Latin-1 bytes stand for themselves, the others are shifted past 255."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), 256))
    out, shift = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + shift))
            shift += 1
    return out


def _bpe(pieces: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Byte-pair encoding of one word: merge the lowest-ranked adjacent pair until none is in ``ranks``."""
    while len(pieces) > 1:
        pairs = [(ranks.get((a, b), len(ranks)), i) for i, (a, b) in enumerate(zip(pieces, pieces[1:]))]
        rank, i = min(pairs)
        if rank == len(ranks):
            break
        pieces = pieces[:i] + [pieces[i] + pieces[i + 1]] + pieces[i + 2:]
    return pieces


def write_tiny_clip_tokenizer(folder: str | Path, words=TINY_WORDS, model_max_length: int = 16) -> Path:
    """Write ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` of a tiny byte-level BPE in CLIP's format:
    the 256 byte characters, each also with the end-of-word mark ``</w>``, merges that make each of ``words``
    one token, then ``<|startoftext|>`` and ``<|endoftext|>`` (also the padding token, as in CLIP)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    alphabet = _byte_alphabet()
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({c + "</w>": 256 + i for i, c in enumerate(alphabet)})
    merges: dict[tuple[str, str], int] = {}  # pair -> rank (lower merges first)
    for word in words:
        # segment the word with the merges so far (BPE: lowest-ranked pair first), then join what is left
        # left to right; the new merges rank after every earlier one, so earlier words stay whole
        pieces = _bpe(list(word[:-1]) + [word[-1] + "</w>"], merges)
        while len(pieces) > 1:
            merges.setdefault((pieces[0], pieces[1]), len(merges))
            vocab.setdefault(pieces[0] + pieces[1], len(vocab))
            pieces = [pieces[0] + pieces[1]] + pieces[2:]
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    lines = [f"{a} {b}" for (a, b), _ in sorted(merges.items(), key=lambda kv: kv[1])]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": model_max_length,
                                                              "tokenizer_class": "CLIPTokenizer"}))
    return folder


def tiny_components(folder: str | Path, seed: int = 0, latent_size: int = 8, hidden_size: int = 32,
                    vocab_size: int = 1000, save: bool = True) -> TextToImagePolicy:
    """Random tiny components (the sizes of diffusers' own pipeline tests), saved as a pipeline folder.

    UNet ``block_out_channels=(32, 64)``, cross-attention width 32; VAE with two blocks (``(32, 64)``, so
    images are twice the latent size: 8×8×4 latents → 16×16×3 images); CLIP text model of width
    ``hidden_size``, 2 layers, ``vocab_size`` token ids; the tokenizer from :func:`write_tiny_clip_tokenizer`;
    Stable Diffusion's noise schedule in a ``DDIMScheduler``. Returns ``TextToImagePolicy.from_pretrained(folder)``,
    so the loading path is the one a real pipeline takes (``save=False``: the components as built, only the
    tokenizer's files written). The weights are random: the images are noise.
    """
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    folder = Path(folder)
    tokenizer = CLIPTokenizer.from_pretrained(write_tiny_clip_tokenizer(folder / "tokenizer"))
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=latent_size, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=hidden_size, attention_head_dim=8, norm_num_groups=32)
    vae = AutoencoderKL(block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        layers_per_block=1, sample_size=2 * latent_size, norm_num_groups=32)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=tokenizer.model_max_length, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    # Stable Diffusion 1.x's schedule (scaled_linear 0.00085 → 0.012, ᾱ_final = ᾱ_0, steps_offset 1)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    policy = TextToImagePolicy(text_encoder, tokenizer, unet, vae, scheduler)
    if not save:
        return policy
    with _quiet():
        policy.save_pretrained(folder)
        return TextToImagePolicy.from_pretrained(folder)


@contextmanager
def _quiet():
    """transformers' progress bars off for a block (saving and loading tiny models prints nothing useful)."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()


__all__ = ["GuidedDenoiser", "PromptEmbeds", "TINY_WORDS", "TextToImagePolicy", "UNET_LORA_TARGETS",
           "check_lora_targets", "tiny_components", "with_prompts", "write_tiny_clip_tokenizer"]
