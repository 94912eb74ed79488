"""Sampling G completions per prompt with a KV cache, and scoring sequences in one forward pass.

Layout of a batch (left padding, so every completion starts at the same column ``P``):

    [pad pad <bos> 4 7 + 3 8 =][8 5 <eos> pad]      prompt: columns 0..P-1, completion: P..P+C-1

``completion_mask`` keeps completion tokens up to and including the first EOS and drops everything
after it. It is built by *position* (how many EOS came before this column), never by comparing
tokens with the pad id: with GPT-2-style tokenizers pad == eos, and a mask built as
``ids != pad_id`` would drop the EOS the model must learn to emit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minigrpo.losses import aligned_logprobs


def encode_prompts(tokenizer, prompts: list[str], device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``<bos> + prompt`` for each prompt, left-padded: ``(input_ids [B, P], attention_mask [B, P])``."""
    rows = [[tokenizer.bos_token_id] + tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it (built by position)."""
    is_eos = (completion_ids == eos_id).long()
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
    completion_ids: torch.Tensor  #: [B, C] (pad after the EOS)
    completion_mask: torch.Tensor  #: [B, C] 1 up to and including the first EOS
    sampler_logprobs: torch.Tensor  #: [B, C] log-prob of each sampled token under the sampler's distribution
    finished: torch.Tensor  #: [B] bool: the completion emitted EOS within max_new_tokens

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, torch.ones_like(self.completion_ids)], dim=1)

    def texts(self, tokenizer) -> list[str]:
        """Completions as text, cut at the first EOS."""
        out = []
        for ids, m in zip(self.completion_ids.tolist(), self.completion_mask.tolist()):
            kept = [t for t, keep in zip(ids, m) if keep and t != tokenizer.eos_token_id]
            out.append(tokenizer.decode(kept, skip_special_tokens=True))
        return out


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], num_generations: int = 1, max_new_tokens: int = 8,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None) -> Generation:
    """Sample ``num_generations`` completions for each prompt, token by token with a KV cache."""
    device = next(model.parameters()).device
    ids, mask = encode_prompts(tokenizer, prompts, device)
    # Prefill each prompt once, then copy its KV cache to its G rows (G× less prefill work).
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1].repeat_interleave(num_generations, 0)
    past.batch_repeat_interleave(num_generations)
    ids, mask = ids.repeat_interleave(num_generations, 0), mask.repeat_interleave(num_generations, 0)
    B = ids.shape[0]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    next_pos = position_ids_from_mask(mask)[:, -1] + 1
    full_mask = mask
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    tokens, logps = [], []
    for _ in range(max_new_tokens):
        logp_all = torch.log_softmax(process_logits(logits.float(), temperature, top_k, top_p), -1)
        if greedy:
            tok = logp_all.argmax(-1)
        else:
            tok = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
        tok = torch.where(finished, torch.full_like(tok, pad), tok)
        tokens.append(tok)
        logps.append(logp_all.gather(-1, tok[:, None]).squeeze(-1))
        finished = finished | (tok == eos)
        if finished.all():
            break
        full_mask = torch.cat([full_mask, torch.ones_like(full_mask[:, :1])], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=full_mask, position_ids=next_pos[:, None],
                    past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
        next_pos = next_pos + 1
    completion = torch.stack(tokens, 1)
    cmask = completion_mask(completion, eos)
    return Generation(ids, mask, completion, cmask, torch.stack(logps, 1) * cmask, finished)


def completion_logits(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                      shared_prefix: bool = True) -> torch.Tensor:
    """Logits ``[B, C, V]`` where ``out[:, j]`` predicts ``completion_ids[:, j]`` (from position ``P − 1 + j``).

    The G completions of a group share their prompt, so the prompt is run once per *distinct* prompt
    and its KV cache is copied to the rows that share it; the completions then attend to that cache.
    This is the same computation as one forward pass over ``[prompt, completion]`` (equal to ~1e-6),
    gradients included (they flow into the shared prompt states), with G× less work on the prompt.
    Rows are deduplicated by content, so any subset or order of rows works. ``shared_prefix=False``
    (or few repeated prompts) runs the plain single forward pass.
    """
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.shape[0] != completion_ids.shape[0]:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)}, prompt_mask {tuple(prompt_mask.shape)} and "
                         f"completion_ids {tuple(completion_ids.shape)} must agree on [B, P] and B")
    B, P = prompt_ids.shape
    C = completion_ids.shape[1]
    uniq, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask.long()], 1), dim=0, return_inverse=True)
    if not shared_prefix or 2 * uniq.shape[0] > B:  # few repeats: one forward pass is cheaper than two
        ids = torch.cat([prompt_ids, completion_ids], 1)
        mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1)
        return model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, P - 1:-1]
    u_ids, u_mask = uniq[:, :P], uniq[:, P:]
    out = model(input_ids=u_ids, attention_mask=u_mask, position_ids=position_ids_from_mask(u_mask), use_cache=True)
    first = out.logits[:, -1:][inverse]  # [B, 1, V]: predicts the first completion token
    if C == 1:
        return first
    past = out.past_key_values
    past.batch_select_indices(inverse)
    mask = torch.cat([prompt_mask, torch.ones_like(completion_ids[:, :-1])], 1)
    pos = position_ids_from_mask(prompt_mask)[:, -1:] + torch.arange(1, C, device=prompt_ids.device)
    rest = model(input_ids=completion_ids[:, :-1], attention_mask=mask, position_ids=pos, past_key_values=past,
                 use_cache=True).logits
    return torch.cat([first, rest], 1)


def sequence_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                      temperature: float = 1.0, shared_prefix: bool = True) -> torch.Tensor:
    """Log-probs of the completion tokens under ``model``: ``[B, C]``.

    Column j of the result scores ``completion_ids[:, j]``, predicted from position ``P − 1 + j``.
    """
    logits = completion_logits(model, prompt_ids, prompt_mask, completion_ids, shared_prefix)
    return aligned_logprobs(logits, completion_ids, temperature)
