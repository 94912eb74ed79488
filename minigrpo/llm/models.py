"""Tiny decoder-only `transformers` models built from a config, and loading real ones by name/path.

The factory builds the same architectures practitioners fine-tune — a Llama/Qwen2-style model
(RMSNorm, rotary positions, SwiGLU, grouped-query attention) and GPT-2 — only small enough to train
in minutes on a CPU. ``load_causal_lm`` loads any causal LM with ``AutoModelForCausalLM``: a folder saved with
``save_pretrained``, SmolLM2-135M-Instruct by its short name ``"smollm2"`` once ``minigrpo models fetch smollm2``
has cached it (``minigrpo.llm.hub``), or e.g. ``"Qwen/Qwen2.5-0.5B-Instruct"`` on a machine with a GPU and a hub.

Where no hub is reachable, :func:`build_qwen_like` writes a folder shaped like a Qwen2.5-Instruct
checkpoint (a Qwen2 config, a byte-level BPE tokenizer without BOS, pad ≠ EOS, a chat template, two
end-of-turn ids in ``generation_config``), and :func:`qwen2_5_0_5b_config` is Qwen2.5-0.5B's architecture
for random-weight benchmarks. :func:`prepare_policy` readies a model for training (LoRA, gradient
checkpointing, bf16 for the frozen weights).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

from minigrpo.utils import get_device

ARCHITECTURES = ("llama", "qwen2", "gpt2")


def tiny_config(tokenizer: PreTrainedTokenizerBase, arch: str = "llama", hidden_size: int = 128,
                num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2, max_positions: int = 64):
    """A small config for ``arch`` sized to ``tokenizer``'s vocabulary (GQA: num_kv_heads < num_heads)."""
    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    if arch in ("llama", "qwen2"):
        cls = LlamaConfig if arch == "llama" else Qwen2Config
        return cls(hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_hidden_layers=num_layers,
                   num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                   max_position_embeddings=max_positions, tie_word_embeddings=True, **ids)
    if arch == "gpt2":
        # GPT-2 has no grouped-query attention: every head has its own keys and values.
        return GPT2Config(n_embd=hidden_size, n_layer=num_layers, n_head=num_heads, n_positions=max_positions,
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids)
    raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")


def make_tiny_model(tokenizer: PreTrainedTokenizerBase, arch: str = "llama", seed: int | None = None,
                    **kwargs) -> PreTrainedModel:
    """A randomly initialised tiny causal LM (see :func:`tiny_config` for ``kwargs``)."""
    if seed is not None:
        torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(tokenizer, arch, **kwargs))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def load_causal_lm(name_or_path: str | Path, device: str | torch.device | None = None,
                   dtype: torch.dtype | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer onto ``device`` (default: ``minigrpo.utils.get_device()``: CUDA, then
    MPS, then CPU). ``name_or_path`` is one of:

    - a folder saved with ``save_pretrained`` (a checkpoint of ours, or any hub-format folder);
    - the short name of a model ``minigrpo models fetch`` caches (``"smollm2"`` or ``"SmolLM2-135M-Instruct"``):
      its cached folder (not fetched yet: a ``ValueError`` naming the command that fetches it);
    - a hub name (``"Qwen/Qwen2.5-0.5B-Instruct"``): downloaded by ``from_pretrained`` as usual, except that a model
      minigrpo has cached (``"HuggingFaceTB/SmolLM2-135M-Instruct"``) loads from the cache, which is said once.

    The weights come in the checkpoint's own dtype unless ``dtype`` says otherwise (transformers' ``dtype="auto"``):
    bfloat16 for SmolLM2's cached folder and most hub checkpoints, float32 for a folder saved in float32. The
    trainers keep float32 copies of the weights they train, whatever this dtype.

    A tokenizer without a pad token gets its EOS as pad (GPT-2 style); the course's masks are built by position,
    so pad == eos is safe. Padding is on the left (prompts end where completions start). No BOS is assumed
    (Qwen's tokenizer has none).
    """
    from minigrpo.llm.hub import resolve_model

    source = resolve_model(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs).to(device or get_device())
    return model, tokenizer


# --------------------------------------------------------------------------- hub-shaped models, made here

def qwen2_5_0_5b_config(**overrides) -> Qwen2Config:
    """Qwen2.5-0.5B(-Instruct)'s architecture (random weights when built from it; nothing is downloaded):
    hidden 896, 24 layers, 14 query / 2 key-value heads (GQA), SwiGLU 4864, vocabulary 151,936, tied
    embeddings, RoPE θ = 10⁶, RMSNorm ε = 10⁻⁶, 32,768 positions, bias on q/k/v — 494M parameters (≈ 0.49B,
    the model card's figure). Ids as the instruct checkpoint's: ``<|endoftext|>`` 151643, ``<|im_end|>`` 151645."""
    fields = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                  max_window_layers=21, attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645)
    fields.update(overrides)
    return Qwen2Config(**fields)


def build_qwen_like(folder: str | Path, corpus: list[str] | None = None, vocab_size: int = 512,
                    config: Qwen2Config | None = None, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                    num_kv_heads: int = 2, max_positions: int = 256, seed: int = 0) -> Path:
    """Write a checkpoint folder shaped like ``Qwen/Qwen2.5-0.5B-Instruct``, small, with random weights; load it
    with ``load_causal_lm(folder)`` or ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(folder)``.

    - tokenizer: :func:`~minigrpo.llm.tokenizer.build_bpe_tokenizer` trained on ``corpus`` (default:
      :func:`~minigrpo.llm.tokenizer.sample_corpus`): byte-level BPE, no BOS, EOS ``<|im_end|>``,
      pad ``<|endoftext|>``, a ChatML chat template;
    - model: a ``Qwen2Config`` (default: hidden ``hidden_size``, ``num_layers`` layers, GQA ``num_heads`` /
      ``num_kv_heads``, SwiGLU 4×, tied embeddings, RoPE θ 10⁶), or ``config`` (e.g.
      :func:`qwen2_5_0_5b_config`; its vocabulary must hold the tokenizer's), whose ``bos_token_id`` is
      ``<|endoftext|>`` as in Qwen's own config although the tokenizer has no BOS;
    - ``generation_config.eos_token_id = [<|im_end|>, <|endoftext|>]`` (two end-of-turn ids, as Qwen's).
    """
    from minigrpo.llm.tokenizer import build_bpe_tokenizer, sample_corpus

    folder = Path(folder)
    tok = build_bpe_tokenizer(corpus if corpus is not None else sample_corpus(seed=seed), vocab_size)
    end_text, end_turn = tok.pad_token_id, tok.eos_token_id
    ids = dict(bos_token_id=end_text, eos_token_id=end_turn, pad_token_id=end_text)
    if config is None:
        config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                             num_hidden_layers=num_layers, num_attention_heads=num_heads,
                             num_key_value_heads=num_kv_heads, max_position_embeddings=max_positions,
                             rope_theta=1e6, tie_word_embeddings=True, **ids)
    elif config.vocab_size < len(tok):
        raise ValueError(f"config.vocab_size ({config.vocab_size}) must hold the tokenizer's {len(tok)} tokens")
    else:
        config = Qwen2Config(**{**config.to_dict(), **ids})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(bos_token_id=end_text, eos_token_id=[end_turn, end_text],
                                               pad_token_id=end_text)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def prepare_policy(model: PreTrainedModel, peft_config=None, gradient_checkpointing: bool = False,
                   bf16: bool = False):
    """Ready ``model`` for training, as TRL's trainers do, and return it (wrapped, with ``peft_config``):

    - ``peft_config`` (e.g. ``peft.LoraConfig``): wrap with ``peft.get_peft_model``: only the adapters train,
      and the reference policy is the same model with its adapters switched off (no second copy);
    - ``gradient_checkpointing``: HF's ``gradient_checkpointing_enable`` (non-reentrant: it also works when the
      inputs need no gradient, as with LoRA); activations are recomputed in backward, trading compute for memory;
    - ``bf16``: the *frozen* weights (LoRA's base model) are stored in bfloat16, halving their memory; trainable
      weights stay float32 (the master copy that AdamW updates; the forward runs under bf16 autocast).
    """
    from minigrpo.llm.lora import apply_peft

    if peft_config is not None:
        model = apply_peft(model, peft_config)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if bf16:
        for p in model.parameters():
            if not p.requires_grad and p.is_floating_point():
                p.data = p.data.to(torch.bfloat16)
    return model


def enable_gradient_checkpointing(model) -> None:
    """HF's gradient (activation) checkpointing, non-reentrant: each decoder layer's activations are recomputed
    in backward instead of stored. (transformers 5.2x renamed ``gradient_checkpointing_enable`` to
    ``activation_checkpointing_enable``; either is used, whichever the installed version has.)"""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
