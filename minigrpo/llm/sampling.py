"""Sampling G completions per prompt with a KV cache, and scoring sequences in bounded memory.

Layout of a batch (left padding, so every completion starts at the same column ``P``):

    [pad pad <bos> 4 7 + 3 8 =][8 5 <eos> pad]      prompt: columns 0..P-1, completion: P..P+C-1

A prompt is a string or a conversation (a list of ``{"role", "content"}`` messages, as in TRL's
conversational datasets). A string is encoded as is, after the tokenizer's BOS *if it has one* (Qwen's has
none), or, with ``use_chat_template``, as one user message; a conversation always goes through
``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` (which writes any BOS itself).

A completion ends at an *end-of-turn* token: any id of the model's ``generation_config.eos_token_id``
(an int or a list: Qwen2.5-Instruct lists ``<|im_end|>`` and ``<|endoftext|>``) or the tokenizer's EOS
(:func:`end_of_turn_ids`). ``completion_mask`` keeps completion tokens up to and including the first one
and drops everything after it. It is built by *position* (how many end-of-turn tokens came before this
column), never by comparing tokens with the pad id: with GPT-2-style tokenizers pad == eos, and a mask
built as ``ids != pad_id`` would drop the EOS the model must learn to emit.

Seeded sampling: pass a ``torch.Generator`` on the model's device (the trainers make theirs there) and the
draws are reproducible on that device; a CPU generator with a GPU model also works (each step's
probabilities are copied to the CPU to draw: slower, reproducible too).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from minigrpo.losses import selective_log_softmax
from minigrpo.utils import torch_threads

#: The name of the KV cache, as a forward keyword and as an output field. transformers renamed it from
#: ``past_key_values`` to ``cache`` (5.24 still takes the old name, with a FutureWarning that it goes in 5.40);
#: older releases (>= 4.56, our floor) know only ``past_key_values``.
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

#: A prompt: plain text, or a conversation ``[{"role": "user", "content": "..."}, ...]``.
Prompt = str | list[dict]


def end_of_turn_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion: the model's ``generation_config.eos_token_id`` (int or list, in its
    order), then the tokenizer's ``eos_token_id`` if not listed. The first is what SFT teaches to emit."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("no end-of-turn token: neither model.generation_config.eos_token_id nor the "
                         "tokenizer's eos_token_id is set")
    return ids


def _messages(prompt: Prompt, index: int, use_chat_template: bool, system_prompt: str | None) -> list[dict] | None:
    """The conversation to render for ``prompt``, or None when it is plain text used as is."""
    if isinstance(prompt, str):
        if not use_chat_template:
            if system_prompt is not None:
                raise ValueError("system_prompt needs the chat template: set use_chat_template=True "
                                 "(or give conversations as prompts)")
            return None
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "role" in m and "content" in m
                                                   for m in prompt):
        messages = list(prompt)
    else:
        raise TypeError(f"prompt {index} must be a string or a list of {{'role': ..., 'content': ...}} messages, "
                        f"got {type(prompt).__name__}")
    if system_prompt is not None and not (messages and messages[0]["role"] == "system"):
        messages = [{"role": "system", "content": system_prompt}] + messages
    return messages


def prompt_token_ids(tokenizer, prompt: Prompt, use_chat_template: bool = False, system_prompt: str | None = None,
                     index: int = 0) -> list[int]:
    """The token ids of one prompt (see the module docstring for strings, conversations and BOS)."""
    messages = _messages(prompt, index, use_chat_template, system_prompt)
    if messages is None:
        bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
        return bos + tokenizer.encode(prompt, add_special_tokens=False)
    if getattr(tokenizer, "chat_template", None) is None:
        why = "use_chat_template=True" if isinstance(prompt, str) else f"prompt {index} is a conversation, which"
        raise ValueError(f"{why} needs a chat template, and this tokenizer ({type(tokenizer).__name__}) has none: "
                         f"set tokenizer.chat_template, or give plain-text prompts with use_chat_template=False")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)  # the template wrote any special tokens itself


def encode_prompts(tokenizer, prompts: Sequence[Prompt], device: str | torch.device = "cpu",
                   use_chat_template: bool = False, system_prompt: str | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts' ids (:func:`prompt_token_ids`), left-padded: ``(input_ids [B, P], attention_mask [B, P])``."""
    rows = [prompt_token_ids(tokenizer, p, use_chat_template, system_prompt, i) for i, p in enumerate(prompts)]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def check_context_length(model, prompt_tokens: int, new_tokens: int) -> None:
    """A clear error when a prompt of ``prompt_tokens`` plus ``new_tokens`` does not fit the model's positions."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is not None and prompt_tokens + new_tokens > limit:
        raise ValueError(f"the longest prompt ({prompt_tokens} tokens) + the completion length (max_completion_length "
                         f"/ max_new_tokens = {new_tokens}) = {prompt_tokens + new_tokens} tokens exceeds the model's "
                         f"max_position_embeddings ({limit}): shorten the prompts or the completions")


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_mask(completion_ids: torch.Tensor, eos_id: int | Sequence[int]) -> torch.Tensor:
    """1 up to and including the first end-of-turn token (``eos_id``: one id or several) of each row, 0 after it
    (built by position)."""
    ends = torch.as_tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), device=completion_ids.device)
    is_eos = torch.isin(completion_ids, ends).long()
    eos_before = is_eos.cumsum(-1) - is_eos  # EOS tokens strictly before each column
    return (eos_before == 0).long()


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution's logits: divide by the temperature, then keep the top-k / nucleus.

    Whatever transforms the sampler uses, scoring must use the same ones, or the log-probs of the
    "same" policy disagree (lesson 07).
    """
    if temperature <= 0:
        raise ValueError(f"sampling needs temperature > 0 (a greedy policy has no useful log-probs); got {temperature}")
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop_sorted = cum - torch.softmax(sorted_logits, -1) >= top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@dataclass
class Generation:
    """G completions per prompt, rows grouped by prompt (prompt 0's G rows first)."""

    prompt_ids: torch.Tensor  #: [B, P] left-padded
    prompt_mask: torch.Tensor  #: [B, P]
    completion_ids: torch.Tensor  #: [B, C] (pad after the end-of-turn token)
    completion_mask: torch.Tensor  #: [B, C] 1 up to and including the first end-of-turn token
    sampler_logprobs: torch.Tensor  #: [B, C] log-prob of each sampled token under the sampler's distribution
    finished: torch.Tensor  #: [B] bool: the completion emitted an end-of-turn token within max_new_tokens
    stop_ids: tuple[int, ...] = ()  #: the end-of-turn ids the sampler stopped at (see end_of_turn_ids)

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, torch.ones_like(self.completion_ids)], dim=1)

    def texts(self, tokenizer) -> list[str]:
        """Completions as text: what was generated after the prompt, cut at the first end-of-turn token, with
        special tokens stripped."""
        stops = set(self.stop_ids) | {tokenizer.eos_token_id}
        out = []
        for ids, m in zip(self.completion_ids.tolist(), self.completion_mask.tolist()):
            kept = [t for t, keep in zip(ids, m) if keep and t not in stops]
            out.append(tokenizer.decode(kept, skip_special_tokens=True))
        return out


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from ``probs [B, V]``, on the generator's device (a CPU generator draws on the CPU)."""
    if generator is not None and generator.device.type != probs.device.type:
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


#: torch intra-op threads for sampling on the CPU (None: leave torch's setting). One token of a batch of a few
#: dozen rows is too little work to share: on 2 cores, a 13M-parameter model sampling 16 rows × 64 tokens took
#: 1.23 s with one thread and 1.26 s with two, and beside two other torch processes 5.2 s with one and 41.7 s with
#: two (every op ends at an OpenMP barrier that waits for a descheduled thread; see docs/benchmarks.md). The
#: thread count also changes rounding in the matmuls (log-probs by ~1e-6), so a fixed count also keeps a seed's
#: samples the same whatever ``torch.set_num_threads`` says.
CPU_SAMPLING_THREADS: int | None = 1


class _GrowingLayer(DynamicLayer):
    """A layer of the KV cache that writes each token's keys and values into a buffer sized for the whole
    generation, and hands attention a view of the filled part. ``DynamicLayer`` concatenates instead, which copies
    the whole cache at every token (O(T²) copying; 18% of sampling time on the CPU for 64 tokens)."""

    def __init__(self, layer: DynamicLayer, repeats: int, capacity: int):
        super().__init__()
        self.device, self.is_initialized = layer.keys.device, True
        B, H, T, D = layer.keys.shape  # the prefilled prompts: [B, kv heads, T, head dim]
        self._keys = layer.keys.new_empty(B * repeats, H, capacity, layer.keys.shape[-1])
        self._values = layer.values.new_empty(B * repeats, H, capacity, layer.values.shape[-1])
        self._keys[:, :, :T] = layer.keys.repeat_interleave(repeats, 0)  # each prompt's cache to its G rows
        self._values[:, :, :T] = layer.values.repeat_interleave(repeats, 0)
        self.keys, self.values = self._keys[:, :, :T], self._values[:, :, :T]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        T, n = self.keys.shape[-2], key_states.shape[-2]
        self._keys[:, :, T:T + n] = key_states
        self._values[:, :, T:T + n] = value_states
        self.keys, self.values = self._keys[:, :, :T + n], self._values[:, :, :T + n]
        return self.keys, self.values


def _repeat_cache(cache, repeats: int, capacity: int) -> None:
    """Copy each prompt's KV cache to its ``repeats`` rows, in place; plain layers become :class:`_GrowingLayer`
    with room for ``capacity`` positions (other kinds, e.g. sliding-window layers, are repeated as they are)."""
    for i, layer in enumerate(getattr(cache, "layers", [])):
        if type(layer) is DynamicLayer and getattr(layer, "keys", None) is not None and layer.keys.dim() == 4:
            cache.layers[i] = _GrowingLayer(layer, repeats, capacity)
        else:
            layer.batch_repeat_interleave(repeats)
    if not hasattr(cache, "layers"):
        cache.batch_repeat_interleave(repeats)


@torch.no_grad()
def generate(model, tokenizer, prompts: Sequence[Prompt], num_generations: int = 1, max_new_tokens: int = 8,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None, use_chat_template: bool = False,
             system_prompt: str | None = None, stop_ids: Sequence[int] | None = None) -> Generation:
    """Sample ``num_generations`` completions for each prompt, token by token with a KV cache.

    Stops a row at any of ``stop_ids`` (default: :func:`end_of_turn_ids`); prompts and the chat-template
    options as in :func:`encode_prompts`. Runs on the model's device (and dtype, or the caller's autocast); on the
    CPU with :data:`CPU_SAMPLING_THREADS` torch threads."""
    device = next(model.parameters()).device
    threads = CPU_SAMPLING_THREADS if device.type == "cpu" else None
    with torch_threads(threads) if threads else nullcontext():
        return _generate(model, tokenizer, prompts, num_generations, max_new_tokens, temperature, top_k, top_p,
                         greedy, generator, use_chat_template, system_prompt, stop_ids, device)


def _generate(model, tokenizer, prompts, num_generations, max_new_tokens, temperature, top_k, top_p, greedy,
              generator, use_chat_template, system_prompt, stop_ids, device) -> Generation:
    stop = list(stop_ids) if stop_ids is not None else end_of_turn_ids(model, tokenizer)
    ids, mask = encode_prompts(tokenizer, prompts, device, use_chat_template, system_prompt)
    check_context_length(model, int(mask.sum(1).max()), max_new_tokens)
    # Prefill each prompt once, then copy its KV cache to its G rows (G× less prefill work).
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=True,
                logits_to_keep=1)
    past, logits = getattr(out, CACHE), out.logits[:, -1].repeat_interleave(num_generations, 0)
    _repeat_cache(past, num_generations, ids.shape[1] + max_new_tokens)
    ids, mask = ids.repeat_interleave(num_generations, 0), mask.repeat_interleave(num_generations, 0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    stop_t = torch.tensor(stop, device=device)
    next_pos = position_ids_from_mask(mask)[:, -1] + 1
    full_mask = torch.cat([mask, torch.ones_like(mask[:, :1]).expand(-1, max_new_tokens)], 1)  # [B, P + C]
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    tokens, logps = [], []
    for t in range(max_new_tokens):
        logp_all = torch.log_softmax(process_logits(logits.float(), temperature, top_k, top_p), -1)  # [B, V]
        tok = logp_all.argmax(-1) if greedy else _draw(logp_all.exp(), generator)
        tok = torch.where(finished, torch.full_like(tok, pad), tok)
        tokens.append(tok)
        logps.append(logp_all.gather(-1, tok[:, None]).squeeze(-1))
        finished = finished | torch.isin(tok, stop_t)
        if finished.all():
            break
        out = model(input_ids=tok[:, None], attention_mask=full_mask[:, :mask.shape[1] + t + 1],
                    position_ids=next_pos[:, None], use_cache=True, **{CACHE: past})
        past, logits = getattr(out, CACHE), out.logits[:, -1]
        next_pos = next_pos + 1
    completion = torch.stack(tokens, 1)
    cmask = completion_mask(completion, stop)
    logps = torch.stack(logps, 1).masked_fill(cmask == 0, 0.0)  # not −inf · 0 = NaN (a top-k-dropped pad)
    return Generation(ids, mask, completion, cmask, logps, finished, tuple(stop))


def _logit_blocks(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                  shared_prefix: bool = True) -> list[torch.Tensor]:
    """The logits that predict ``completion_ids``, as blocks of columns (``[B, C, V]`` once concatenated).

    Only the completion's positions get logits (``logits_to_keep``): a prompt's logits are never made. The G
    completions of a group share their prompt, so the prompt is run once per *distinct* prompt and its KV cache
    is copied to the rows that share it; the completions then attend to that cache (two blocks: the first
    column, from the prompt pass, and the rest). This is the same computation as one forward pass over
    ``[prompt, completion]`` (equal to ~1e-6), gradients included, with G× less work on the prompt. Rows are
    deduplicated by content, so any subset or order of rows works. ``shared_prefix=False`` (or few repeated
    prompts, or gradient checkpointing in training, which turns the KV cache off) runs one plain forward pass.
    """
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.shape[0] != completion_ids.shape[0]:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)}, prompt_mask {tuple(prompt_mask.shape)} and "
                         f"completion_ids {tuple(completion_ids.shape)} must agree on [B, P] and B")
    B, P = prompt_ids.shape
    C = completion_ids.shape[1]
    uniq, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask.long()], 1), dim=0, return_inverse=True)
    checkpointing = model.training and _checkpointing(model)
    if not shared_prefix or checkpointing or 2 * uniq.shape[0] > B:  # one forward pass
        ids = torch.cat([prompt_ids, completion_ids[:, :-1]], 1)  # the last token predicts nothing we score
        mask = torch.cat([prompt_mask, torch.ones_like(completion_ids[:, :-1])], 1)
        return [model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False,
                      logits_to_keep=C).logits]
    u_ids, u_mask = uniq[:, :P], uniq[:, P:]
    out = model(input_ids=u_ids, attention_mask=u_mask, position_ids=position_ids_from_mask(u_mask), use_cache=True,
                logits_to_keep=1)
    first = out.logits[inverse]  # [B, 1, V]: predicts the first completion token
    if C == 1:
        return [first]
    past = getattr(out, CACHE)
    past.batch_select_indices(inverse)
    mask = torch.cat([prompt_mask, torch.ones_like(completion_ids[:, :-1])], 1)
    pos = position_ids_from_mask(prompt_mask)[:, -1:] + torch.arange(1, C, device=prompt_ids.device)
    rest = model(input_ids=completion_ids[:, :-1], attention_mask=mask, position_ids=pos, use_cache=True,
                 **{CACHE: past}).logits
    return [first, rest]


def _checkpointing(model) -> bool:
    """Whether HF gradient (activation) checkpointing is on (the property was renamed in transformers 5)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        try:
            return bool(getattr(model, name))
        except AttributeError:
            continue
    return False


def completion_logits(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                      shared_prefix: bool = True) -> torch.Tensor:
    """Logits ``[B, C, V]`` where ``out[:, j]`` predicts ``completion_ids[:, j]`` (from position ``P − 1 + j``),
    computed as :func:`_logit_blocks` says. Scoring should use :func:`score_completions` (bounded memory)."""
    return torch.cat(_logit_blocks(model, prompt_ids, prompt_mask, completion_ids, shared_prefix), 1)


def score_completions(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                      temperature: float = 1.0, shared_prefix: bool = True, with_entropy: bool = False):
    """Log-probs ``[B, C]`` of the completion tokens under ``model`` at ``temperature`` (and, with
    ``with_entropy``, the entropy of each position's distribution, without gradient).

    Each block of logits (:func:`_logit_blocks`) goes through ``losses.selective_log_softmax``, chunk by chunk:
    no ``[B, C, V]`` float32 tensor, and no concatenated copy of the logits."""
    blocks = _logit_blocks(model, prompt_ids, prompt_mask, completion_ids, shared_prefix)
    targets = torch.split(completion_ids, [b.shape[1] for b in blocks], 1)
    parts = [selective_log_softmax(b, t, temperature, with_entropy=True) if with_entropy
             else (selective_log_softmax(b, t, temperature), None) for b, t in zip(blocks, targets)]
    logp = torch.cat([lp for lp, _ in parts], 1)
    return (logp, torch.cat([h for _, h in parts], 1)) if with_entropy else logp


def sequence_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                      temperature: float = 1.0, shared_prefix: bool = True) -> torch.Tensor:
    """Log-probs of the completion tokens under ``model``: ``[B, C]``.

    Column j of the result scores ``completion_ids[:, j]``, predicted from position ``P − 1 + j``.
    """
    return score_completions(model, prompt_ids, prompt_mask, completion_ids, temperature, shared_prefix)
