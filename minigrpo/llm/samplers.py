"""The sampler as a replaceable part of the GRPO trainer.

``GRPOTrainer(..., sampler=...)`` takes any callable with :class:`Sampler`'s signature: prompts in, a
``sampling.Generation`` out — G completions per prompt, grouped by prompt, **with the sampler's own log-prob of
every sampled token** (``sampler_logprobs``). The trainer scores the same tokens again with its own forward pass;
the difference of the two is logged as ``sampling/sampling_logp_difference/mean`` (and ``/max``), and
``vllm_importance_sampling_correction`` turns it into truncated importance weights. That is the seam where an
inference engine (vLLM, SGLang: another process, other kernels, maybe stale weights) plugs in, as TRL's
``use_vllm`` does.

Two samplers:

- ``sampling.generate`` (the default): our KV-cached loop, prefilling each prompt once for its G rows;
- :func:`hf_generate`: Hugging Face's ``model.generate(do_sample=True, output_scores=True)``, the worked example
  of a second sampler. Its ``scores`` are the processed logits each token was drawn from (here only ÷
  temperature: ``top_k=0``, ``top_p=1``, no other processor), so their log-softmax is the sampler's log-prob.
  Measured against the trainer's log-probs on the tiny float32 llama of the tests (CPU, 5 seeds, 4 prompts × 8
  completions × 16 tokens, temperature 1): gap mean 1.6e-7, max 4.8e-7 nats (our sampler: 1.6e-7, max 9.5e-7) —
  float32 rounding of two code paths. In bf16 on a GPU our sampler's gap is ~4.5e-3 (see ``minigrpo.llm.grpo``).

A sampler must: left-pad the prompts (``prompt_mask`` 0 on the padding), mark each completion's tokens up to and
including its first end-of-turn id in ``completion_mask``, set ``finished`` where that id came within
``max_new_tokens``, and draw its randomness from ``generator`` (the trainer's, per process) so that runs repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import GenerationConfig

from minigrpo.llm.sampling import (Generation, Prompt, check_context_length, completion_mask, encode_prompts,
                                   end_of_turn_ids)


class Sampler(Protocol):
    """What ``GRPOTrainer.step`` calls to draw its completions (``sampling.generate`` fits). With
    ``GRPOConfig.top_k`` / ``top_p`` set it also passes them as keywords (``sampling.process_logits``'s meaning)."""

    def __call__(self, model, tokenizer, prompts: Sequence[Prompt], num_generations: int, max_new_tokens: int,
                 temperature: float, *, generator: torch.Generator | None, use_chat_template: bool,
                 system_prompt: str | None) -> Generation: ...


def hf_generate(model, tokenizer, prompts: Sequence[Prompt], num_generations: int = 1, max_new_tokens: int = 8,
                temperature: float = 1.0, *, generator: torch.Generator | None = None, use_chat_template: bool = False,
                system_prompt: str | None = None) -> Generation:
    """A :class:`Sampler` built on ``model.generate`` (``output_scores=True``): the sampler log-probs are the
    log-softmax of the scores each token was drawn from. ``model.generate`` draws from torch's global generator:
    it is seeded here from ``generator`` inside ``torch.random.fork_rng``, so the global state is left as it was."""
    device = next(model.parameters()).device
    stop = end_of_turn_ids(model, tokenizer)
    ids, mask = encode_prompts(tokenizer, prompts, device, use_chat_template, system_prompt)
    check_context_length(model, int(mask.sum(1).max()), max_new_tokens)
    ids, mask = ids.repeat_interleave(num_generations, 0), mask.repeat_interleave(num_generations, 0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                              max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=pad, output_scores=True,
                              return_dict_in_generate=True)
    seed = int(torch.randint(2**62, (1,), generator=generator, device=generator.device)) if generator else None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    completion = out.sequences[:, ids.shape[1]:]  # [B, C]
    logp = torch.log_softmax(torch.stack(out.scores, 1).float(), -1).gather(-1, completion[..., None]).squeeze(-1)
    cmask = completion_mask(completion, stop)
    finished = (torch.isin(completion, torch.tensor(stop, device=device)) & cmask.bool()).any(1)
    return Generation(ids, mask, completion, cmask, logp * cmask, finished, tuple(stop))


__all__ = ["Sampler", "hf_generate"]
