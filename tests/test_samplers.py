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
