"""Tiny decoder-only `transformers` models built from a config, and loading real ones by name/path.

The factory builds the same architectures practitioners fine-tune — a Llama/Qwen2-style model
(RMSNorm, rotary positions, SwiGLU, grouped-query attention) and GPT-2 — only small enough to train
in minutes on a CPU. ``load_causal_lm`` loads any causal LM with ``AutoModelForCausalLM``, e.g.
``"Qwen/Qwen2.5-0.5B-Instruct"`` on a machine with a GPU and a hub, or a folder saved with
``save_pretrained``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

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


def load_causal_lm(name_or_path: str | Path, device: str | torch.device = "cpu",
                   dtype: torch.dtype | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from the hub (by name) or from a local folder.

    A tokenizer without a pad token gets its EOS as pad (GPT-2 style); the course's masks are
    built by position, so pad == eos is safe.
    """
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs).to(device)
    return model, tokenizer
