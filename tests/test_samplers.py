"""The sampler as a replaceable part of GRPOTrainer (minigrpo/llm/samplers.py): Hugging Face's model.generate with
output_scores gives the trainer the same Generation as our sampler, and its log-probs match the trainer's."""

import pytest
import torch

from minigrpo.llm.data import DatasetTask
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer, completion_logprobs
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.samplers import hf_generate
from minigrpo.llm.sampling import completion_mask, generate
from minigrpo.llm.tokenizer import build_char_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_hf_generate_gives_a_generation_whose_logprobs_are_the_trainers():
    """Measured: |log π_sampler − log π_trainer| at most 4.8e-7 nats on tiny float32 models (5 seeds); 1e-4 here."""
    tok = build_char_tokenizer()
    model = make_tiny_model(tok, seed=0).eval()
    prompts = ["1+2=", "34+5="]
    gen = hf_generate(model, tok, prompts, 3, 6, 0.7, generator=torch.Generator().manual_seed(0))
    again = hf_generate(model, tok, prompts, 3, 6, 0.7, generator=torch.Generator().manual_seed(0))
    assert torch.equal(gen.completion_ids, again.completion_ids)  # reproducible from the trainer's generator
    ours = generate(model, tok, prompts, 3, 6, 0.7, generator=torch.Generator().manual_seed(0))
    assert gen.prompt_ids.shape == ours.prompt_ids.shape and torch.equal(gen.prompt_mask, ours.prompt_mask)
    assert gen.completion_ids.shape[0] == 6 and gen.stop_ids == ours.stop_ids
    assert torch.equal(gen.completion_mask, completion_mask(gen.completion_ids, gen.stop_ids))
    with torch.no_grad():
        trainer_logp = completion_logprobs(model, gen, slice(None), 0.7)
    m = gen.completion_mask.bool()
    assert (trainer_logp - gen.sampler_logprobs)[m].abs().max() < 1e-4
    assert (gen.sampler_logprobs[m] < 0).all()


def test_the_trainer_samples_with_the_sampler_it_is_given():
    tok = build_char_tokenizer()
    calls = []

    def counting_sampler(*args, **kwargs):
        calls.append(kwargs["generator"])
        return hf_generate(*args, **kwargs)

    def length(completions, **kwargs):
        return [len(c) for c in completions]

    task = DatasetTask([{"prompt": f"{i}+{i}="} for i in range(6)], [length], max_completion_length=5)
    cfg = GRPOConfig(prompts_per_step=2, num_generations=3, max_completion_length=5, eval_every=0)
    trainer = GRPOTrainer(make_tiny_model(tok, seed=0), tok, task, cfg, sampler=counting_sampler)
    assert GRPOTrainer(make_tiny_model(tok, seed=0), tok, task, cfg).sample_completions is generate  # the default
    metrics = trainer.step()
    assert calls == [trainer.gen] and metrics["sampling/sampling_logp_difference/max"] < 1e-4


def test_a_grpo_step_uses_no_deprecated_transformers_api(caplog):
    """transformers 5.24 renamed the KV cache ``past_key_values`` -> ``cache`` and warns (a FutureWarning, and a
    logged warning) that the old name goes in 5.40: a GRPO step (sampling, scoring, the loss) must not warn."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # logger.warning_once: a warning logged by an earlier test would hide
    hf_logger = hf_logging.get_logger("transformers")
    hf_logger.addHandler(caplog.handler)  # transformers' loggers do not propagate to the root logger
    tok = build_char_tokenizer()
    task = DatasetTask([{"prompt": f"{i}+{i}="} for i in range(6)], [lambda completions, **kw: [len(c) for c in
                                                                                              completions]],
                       max_completion_length=5)
    cfg = GRPOConfig(prompts_per_step=2, num_generations=3, max_completion_length=5, eval_every=0, beta=0.04,
                     num_iterations=2)  # beta, mu > 1: the reference and old log-probs are scored too
    try:
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            for arch in ("llama", "qwen2"):
                GRPOTrainer(make_tiny_model(tok, arch, seed=0), tok, task, cfg).step()
    finally:
        hf_logger.removeHandler(caplog.handler)
    deprecations = [f"{w.category.__name__}: {w.message}" for w in caught
                    if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert deprecations == []
    assert [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()] == []


def _reference_generate(model, tok, prompts, G, max_new_tokens, generator, **kw):
    """The sampler as it was before its KV cache was preallocated and its thread count fixed (transformers'
    DynamicCache, grown by concatenation; torch's thread count as set): the oracle for ``generate``."""
    from minigrpo.llm.sampling import CACHE, encode_prompts, end_of_turn_ids, position_ids_from_mask, process_logits

    stop = end_of_turn_ids(model, tok)
    ids, mask = encode_prompts(tok, prompts)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=True,
                logits_to_keep=1)
    past, logits = getattr(out, CACHE), out.logits[:, -1].repeat_interleave(G, 0)
    past.batch_repeat_interleave(G)
    mask = mask.repeat_interleave(G, 0)
    next_pos, finished, tokens, logps = position_ids_from_mask(mask)[:, -1] + 1, torch.zeros(len(mask), dtype=bool), [], []
    for _ in range(max_new_tokens):
        logp_all = torch.log_softmax(process_logits(logits.float(), kw.get("temperature", 1.0), kw.get("top_k", 0),
                                                    kw.get("top_p", 1.0)), -1)
        tok_ = logp_all.argmax(-1) if kw.get("greedy") else torch.multinomial(logp_all.exp(), 1, generator=generator)[:, 0]
        tok_ = torch.where(finished, torch.full_like(tok_, tok.pad_token_id), tok_)
        tokens.append(tok_)
        logps.append(logp_all.gather(-1, tok_[:, None])[:, 0])
        finished = finished | torch.isin(tok_, torch.tensor(stop))
        if finished.all():
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        out = model(input_ids=tok_[:, None], attention_mask=mask, position_ids=next_pos[:, None], use_cache=True,
                    **{CACHE: past})
        past, logits, next_pos = getattr(out, CACHE), out.logits[:, -1], next_pos + 1
    completion = torch.stack(tokens, 1)
    return completion, torch.stack(logps, 1) * completion_mask(completion, stop)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(temperature=1.3, top_k=5, top_p=0.9), dict(greedy=True)])
def test_generate_draws_the_same_tokens_and_logprobs_as_the_reference_sampler(arch, kw):
    """Bit for bit: the preallocated KV cache and the fixed thread count change no sample and no log-prob (the
    reference at one thread, the sampler's own count; measured also on the 13M benchmark model and SmolLM2-135M)."""
    tok = build_char_tokenizer()
    model = make_tiny_model(tok, arch, seed=0).eval()
    prompts = ["1+2=", "34+5=", "7="]
    for seed in range(3):
        with torch.no_grad():
            ref_ids, ref_logp = _reference_generate(model, tok, prompts, 4, 12, torch.Generator().manual_seed(seed), **kw)
        gen = generate(model, tok, prompts, 4, 12, generator=torch.Generator().manual_seed(seed), **kw)
        assert torch.equal(gen.completion_ids, ref_ids) and torch.equal(gen.sampler_logprobs, ref_logp)


def test_generate_samples_the_same_whatever_torchs_thread_count_and_leaves_it_as_it_was():
    from minigrpo.llm import sampling

    tok = build_char_tokenizer()
    model = make_tiny_model(tok, seed=1).eval()
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        runs.append(generate(model, tok, ["12+3=", "4+4="], 3, 10, generator=torch.Generator().manual_seed(0)))
        assert torch.get_num_threads() == threads
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert torch.equal(runs[0].sampler_logprobs, runs[1].sampler_logprobs)
    assert sampling.CPU_SAMPLING_THREADS == 1
