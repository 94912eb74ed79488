"""What a GRPO trainer saves reloads as the model it trained (issue 23): full fine-tuning, LoRA on a checkpoint,
and LoRA after SFT of the whole model (the CLI's `train llm --lora`), whose adapters alone would point at the
un-SFT'd checkpoint. Equal logits after reload, at float32 tolerance."""

import copy
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from minigrpo.infra.tracking import load_saved_model
from minigrpo.llm.data import DatasetTask
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.sampling import encode_prompts
from minigrpo.llm.sft import SFTConfig, train_sft
from minigrpo.llm.tasks import SortTask
from minigrpo.llm.tokenizer import build_char_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def checkpoint(tok, tmp_path_factory):
    """A small Llama checkpoint folder, as a hub model would be (loading it records its path)."""
    folder = tmp_path_factory.mktemp("llama")
    make_tiny_model(tok, "llama", seed=11, hidden_size=32, num_heads=4, num_kv_heads=2).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _task():
    return DatasetTask([{"prompt": f"sort {i}{i + 3}{i + 1}:"} for i in range(6)],
                       [lambda completions, **kw: [len(c) + c.count("1") for c in completions]],
                       max_completion_length=5)


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      init_lora_weights=False)


def _grpo(model, tok, **kw):
    cfg = GRPOConfig(prompts_per_step=2, num_generations=4, max_steps=2, eval_every=0, learning_rate=1e-2, beta=0.1)
    trainer = GRPOTrainer(model, tok, _task(), cfg, **kw)
    trainer.train(progress=False)
    return trainer


def _logits(model, tok):
    ids, mask = encode_prompts(tok, ["sort 3141:", "sort 27:", "7"])
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=mask).logits


def _same_model(trained, reloaded, tok):
    torch.testing.assert_close(_logits(reloaded, tok), _logits(trained, tok), rtol=1e-5, atol=1e-5)


def test_full_fine_tuning_reloads_as_trained(tok, checkpoint, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(checkpoint)
    trainer = _grpo(base, tok)
    assert (_logits(trainer.model, tok) - _logits(AutoModelForCausalLM.from_pretrained(checkpoint), tok)).abs().max() > 1e-3
    trainer.save(tmp_path / "out")
    _same_model(trainer.model, load_saved_model(tmp_path / "out"), tok)
    _same_model(trainer.model, AutoModelForCausalLM.from_pretrained(tmp_path / "out"), tok)


def test_lora_on_a_checkpoint_reloads_as_trained(tok, checkpoint, tmp_path):
    from peft import PeftModel

    trainer = _grpo(AutoModelForCausalLM.from_pretrained(checkpoint), tok, peft_config=_lora())
    trainer.save(tmp_path / "out")
    _same_model(trainer.model, load_saved_model(tmp_path / "out"), tok)
    _same_model(trainer.model, AutoModelForCausalLM.from_pretrained(tmp_path / "out"), tok)  # transformers + peft
    on_the_checkpoint = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(checkpoint), tmp_path / "out")
    _same_model(trainer.model, on_the_checkpoint, tok)  # the adapters alone still fit the base they came from


def test_lora_after_sft_reloads_as_trained_not_on_the_checkpoint_it_came_from(tok, checkpoint, tmp_path):
    """SFT moves every weight, then GRPO trains adapters on the SFT'd base: the save holds that base
    (base_model/), so it reloads as the trained model, even after the folder is moved; the adapters put on the
    original checkpoint give another model (what a save of adapters alone reloaded to)."""
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    train_sft(model, tok, SortTask(eval_size=2), SFTConfig(steps=5, batch_size=8, learning_rate=1e-2),
              progress=False)
    trainer = _grpo(model, tok, peft_config=_lora())
    trainer.save(tmp_path / "out")
    _same_model(trainer.model, load_saved_model(tmp_path / "out"), tok)
    _same_model(trainer.model, AutoModelForCausalLM.from_pretrained(tmp_path / "out"), tok)
    shutil.move(tmp_path / "out", tmp_path / "moved")
    _same_model(trainer.model, load_saved_model(tmp_path / "moved"), tok)
    wrong = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(checkpoint), tmp_path / "moved")
    assert (_logits(wrong, tok) - _logits(trainer.model, tok)).abs().max() > 0.1


def test_a_lora_checkpoint_after_sft_resumes_without_redoing_sft(tok, checkpoint, tmp_path):
    """The checkpoint's base_model/ is loaded on resume: a trainer built on the original checkpoint (SFT not
    re-run) continues from the trained model."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    train_sft(model, tok, SortTask(eval_size=2), SFTConfig(steps=5, batch_size=8, learning_rate=1e-2),
              progress=False)
    trained = _grpo(model, tok, peft_config=_lora())
    folder = trained.save_checkpoint(tmp_path / "checkpoint-2")
    cfg = copy.deepcopy(trained.cfg)
    resumed = GRPOTrainer(AutoModelForCausalLM.from_pretrained(checkpoint), tok, _task(), cfg, peft_config=_lora())
    resumed.load_checkpoint(folder)
    assert resumed.step_count == 2
    _same_model(trained.model, resumed.model, tok)


def test_run_recipe_resumes_without_sft_and_refuses_a_missing_checkpoint_before_training(tmp_path, monkeypatch):
    """`train llm ... grpo.resume_from_checkpoint=true`: the checkpoint is found before anything trains (none: one
    sentence, SFT never ran); found, SFT is skipped (the checkpoint holds its result) and GRPO continues."""
    import minigrpo.llm.recipes as recipes

    sft_runs = []
    real_sft = recipes.train_sft
    monkeypatch.setattr(recipes, "train_sft", lambda *a, **k: sft_runs.append(1) or real_sft(*a, **k))
    small = ["sft.steps=2", "sft.batch_size=8", "grpo.prompts_per_step=2", "grpo.num_generations=2",
             "grpo.eval_every=0", f"grpo.output_dir={tmp_path}"]
    recipe = recipes.resolve_recipe("sort", smoke=True, overrides=small + ["grpo.resume_from_checkpoint=true"])
    with pytest.raises(FileNotFoundError, match="no checkpoint-<step> folder"):
        recipes.run_recipe(recipe, progress=False, evaluate=False)
    assert sft_runs == []
    first = recipes.run_recipe(recipes.resolve_recipe("sort", smoke=True, overrides=small + ["grpo.max_steps=2"]),
                               progress=False, evaluate=False)
    assert sft_runs == [1] and first.grpo.history["step"] == [1, 2]
    resumed = recipes.run_recipe(recipes.resolve_recipe("sort", smoke=True, overrides=small + [
        "grpo.max_steps=3", "grpo.resume_from_checkpoint=true"]), progress=False, evaluate=False)
    assert sft_runs == [1] and resumed.grpo.history["step"] == [1, 2, 3] and resumed.sft_history == {}
