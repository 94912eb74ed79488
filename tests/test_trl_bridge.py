"""The bridge to TRL (minigrpo/llm/trl_bridge.py): the config conversion, the mapping tables and the copy in docs/trl.md of
them, and one batch fed to both trainers: TRL's own ``compute_loss`` and ours give the same loss and gradient."""

import copy
import dataclasses
import re
from pathlib import Path

import pytest
import torch
import trl  # the course extra installs it: this test runs in CI

from minigrpo.llm.data import DatasetTask
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import build_qwen_like, load_causal_lm
from minigrpo.llm.trl_bridge import FIELDS, METRICS, readme_section, to_trl_config, trl_grpo_kwargs, unmapped_fields

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TRL_PAGE = Path(__file__).resolve().parents[1] / "docs" / "trl.md"
PROMPTS = ["1+2=", "3+4=", "5+6=", "7+1="]


def length_reward(completions, **kwargs):
    """A TRL-style reward with spread inside a group: the same function object goes to both trainers."""
    return [len(c) / 10 for c in completions]


def test_batch_and_step_units_convert():
    cfg = GRPOConfig(prompts_per_step=16, num_generations=8, gradient_accumulation_steps=2, num_iterations=2,
                     max_steps=50, logging_steps=5, eval_every=10, output_dir="out", save_steps=0, beta=0.04)
    kw = trl_grpo_kwargs(cfg, num_processes=2, max_completion_length=64)
    assert kw["per_device_train_batch_size"] == 16 * 8 // (2 * 2)  # completions, per process, per micro-batch
    assert kw["steps_per_generation"] == 2 and kw["gradient_accumulation_steps"] == 2
    assert (kw["max_steps"], kw["logging_steps"], kw["eval_steps"], kw["save_steps"]) == (100, 10, 20, 100)
    assert kw["max_completion_length"] == 64 and kw["use_bias_correction_kl"] is False
    assert kw["lr_scheduler_type"] == "constant" and kw["weight_decay"] == 0.0
    args = to_trl_config(cfg, 2, 64, use_cpu=True)  # TRL accepts every key and derives the same generation batch
    assert args.generation_batch_size == 16 * 8 // 2  # per process: prompts_per_step × G / num_processes
    with pytest.raises(ValueError, match="kl_estimator"):
        trl_grpo_kwargs(GRPOConfig(kl_estimator="k1"))
    with pytest.raises(ValueError, match="filter_zero_std_groups"):
        trl_grpo_kwargs(GRPOConfig(filter_zero_std_groups=True))
    with pytest.raises(ValueError, match="split evenly"):
        trl_grpo_kwargs(GRPOConfig(prompts_per_step=3, num_generations=2, gradient_accumulation_steps=2), 2)


def test_every_field_is_mapped_to_a_real_trl_name_and_the_docs_show_the_tables():
    assert not unmapped_fields()
    theirs = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert {m.trl for m in FIELDS if m.trl != "—"} <= theirs
    assert set(trl_grpo_kwargs(GRPOConfig(output_dir="o", eval_every=5))) <= theirs
    assert {"reward", "kl", "entropy", "clip_ratio/region_mean"} <= {m.trl for m in METRICS}
    text = TRL_PAGE.read_text(encoding="utf-8")
    found = re.search(r"<!-- trl-table:begin -->\n(.*?)\n<!-- trl-table:end -->", text, re.S)
    assert found, "docs/trl.md lacks the trl-table markers"
    assert found.group(1) == readme_section(), "docs/trl.md's TRL tables are stale: paste trl_bridge.readme_section()"


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """A tiny Qwen2 checkpoint; the policy is it plus noise (so that π_θ ≠ π_ref and β acts on the gradient), the
    reference is the checkpoint itself in both trainers (TRL reloads it from the folder)."""
    folder = build_qwen_like(tmp_path_factory.mktemp("qwen"), seed=0)
    base, tok = load_causal_lm(folder)
    policy = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    cfg = GRPOConfig(prompts_per_step=2, num_generations=4, max_completion_length=6, beta=0.04, temperature=0.7,
                     eval_every=0, loss_type="grpo", learning_rate=0.0)
    from datasets import Dataset

    args = to_trl_config(cfg, output_dir=str(folder / "trl"), use_cpu=True, disable_tqdm=True)
    theirs = trl.GRPOTrainer(model=copy.deepcopy(policy), reward_funcs=length_reward, args=args,
                             train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tok)
    return policy, base, tok, cfg, theirs


def _trl_inputs(theirs, gen, advantages, rows, num_items):
    """The dict that TRL's ``_generate_and_score_completions`` hands ``compute_loss``, from the rows of the batch our
    step drew; the reference log-probs computed by TRL itself on its reference model."""
    inputs = {"prompt_ids": gen.prompt_ids[rows], "prompt_mask": gen.prompt_mask[rows],
              "completion_ids": gen.completion_ids[rows], "completion_mask": gen.completion_mask[rows],
              "advantages": advantages[rows], "num_items_in_batch": torch.tensor(float(num_items))}
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        inputs["ref_per_token_logps"] = theirs._get_per_token_logps_and_entropies(
            theirs.ref_model, ids, mask, gen.completion_ids.shape[1])[0]
    return inputs


def _recording(trainer):
    """Record what the trainer's next step draws: its problems and its completions."""
    drawn = {"problems": [], "gen": []}
    sample, sampler = trainer.task.sample, trainer.sample_completions
    trainer.task.sample = lambda rng: drawn["problems"].append(sample(rng)) or drawn["problems"][-1]
    trainer.sample_completions = lambda *a, **k: drawn["gen"].append(sampler(*a, **k)) or drawn["gen"][-1]
    return drawn


@pytest.mark.parametrize("loss_type, accum", [("grpo", 2), ("dapo", 2), ("dr_grpo", 1), ("bnpo", 2)])
def test_one_batch_gives_trl_the_same_loss_and_gradient(both, loss_type, accum):
    """μ = 1, β = 0.04, temperature 0.7: our GRPO step (learning rate 0 and no gradient clipping, so its gradient
    stays in ``.grad``), and TRL's ``compute_loss`` on the batch that step drew (scored by TRL's
    ``_calculate_rewards``, advantages by group) over the same micro-batches; losses within 1e-5 and every
    parameter's gradient within 1e-4 relative (float32, two log-prob code paths)."""
    from minigrpo.advantages import group_advantages
    from minigrpo.llm.grpo import completion_logprobs

    policy, base, tok, cfg, theirs = both
    cfg = dataclasses.replace(cfg, loss_type=loss_type, gradient_accumulation_steps=accum, max_grad_norm=float("inf"))
    G = cfg.num_generations
    task = DatasetTask([{"prompt": p} for p in PROMPTS], [length_reward], max_completion_length=6)
    ours = GRPOTrainer(copy.deepcopy(policy), tok, task, cfg, ref_model=base)
    drawn = _recording(ours)
    metrics = ours.step()
    problems, gen = drawn["problems"], drawn["gen"][0]
    texts = gen.texts(tok)
    per_row = [{"prompt": p.prompt} for p in problems for _ in range(G)]
    trl_rewards = theirs._calculate_rewards(per_row, [r["prompt"] for r in per_row], texts, [[0]] * len(texts)).sum(1)
    assert trl_rewards.tolist() == pytest.approx(task.score([p for p in problems for _ in range(G)], texts,
                                                            gen.finished.tolist())[0])
    assert metrics["reward"] == pytest.approx(trl_rewards.mean().item())
    advantages = group_advantages(trl_rewards, G)

    kw = trl_grpo_kwargs(cfg)  # the fields this case changes (a new TRL config would need a new Accelerator)
    for key in ("loss_type", "gradient_accumulation_steps", "steps_per_generation"):
        setattr(theirs.args, key, kw[key])
    theirs.loss_type, theirs.current_gradient_accumulation_steps = loss_type, accum
    model = theirs.model.train()
    model.zero_grad()
    loss_trl = 0.0
    for rows in torch.tensor_split(torch.arange(len(texts)), accum):
        inputs = _trl_inputs(theirs, gen, advantages, rows, gen.completion_mask.sum())
        with torch.no_grad():
            ref_ours = completion_logprobs(base, gen, rows, cfg.temperature)
        torch.testing.assert_close(inputs["ref_per_token_logps"] * inputs["completion_mask"],
                                   ref_ours * inputs["completion_mask"], rtol=1e-5, atol=1e-5)
        mine = theirs.compute_loss(model, inputs)
        mine.backward()
        loss_trl += mine.item()
    assert loss_trl == pytest.approx(metrics["loss"], abs=1e-5)
    for (name, p), q in zip(model.named_parameters(), ours.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
