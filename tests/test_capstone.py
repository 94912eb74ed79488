"""Lesson 12's plumbing (minigrpo_course.experiments.capstone): problems, slipped demonstrations, pretraining, and the
pieces of the workflow connected end to end on a tiny Qwen2-shaped model (pretrain → SFT → GRPO over seeds →
save → reload, with full weights and with LoRA adapters)."""

import random
import re

import pytest
import torch

from minigrpo_course.experiments import capstone as lab
from minigrpo.llm.data import DatasetTask
from minigrpo.llm.grpo import GRPOConfig
from minigrpo.llm.gsm8k import TEMPLATES, correctness_reward, format_reward, prepare_gsm8k
from minigrpo.llm.models import load_causal_lm
from minigrpo.llm.sampling import generate, sequence_logprobs
from minigrpo.llm.sft import SFTConfig, train_sft

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEP = re.compile(r"(\d+)([-+*/])(\d+) = (-?\d+)")
SOLUTION = ("<think>\nShe gives away 72/4 = 18 cards.\nShe has 72-18 = 54 left.\nNow she has 54+8 = 62 cards.\n"
            "</think>\n<answer>62</answer>")


def _steps(solution):
    return [tuple(int(x) if x.lstrip("-").isdigit() else x for x in m.groups()) for m in STEP.finditer(solution)]


def _value(a, op, b):
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]


def _answer(solution):
    return int(re.search(r"<answer>(.*?)</answer>", solution).group(1))


# ----------------------------------------------------------------------------- data


def test_word_problems_are_distinct_seeded_and_from_the_templates():
    rows = lab.word_problems(300, lab.OWN_TEMPLATES, seed=3)
    assert len({r["question"] for r in rows}) == 300
    assert rows == lab.word_problems(300, lab.OWN_TEMPLATES, seed=3)
    # the two templates' questions: shopping change, or sharing among friends
    assert all("How much change" in r["question"] or "shares the rest" in r["question"] for r in rows)
    held = lab.word_problems(20, lab.OWN_TEMPLATES, seed=4, exclude=[r["question"] for r in rows])
    assert not {r["question"] for r in held} & {r["question"] for r in rows}
    with pytest.raises(ValueError, match="templates must be names from"):
        lab.word_problems(5, ["change", "nope"])


def test_pretraining_documents_are_plain_text_with_worked_solutions():
    row = {"question": "Q?", "answer": "A has 2*3 = <<2*3=6>>6 pens.\n#### 6"}
    assert lab.pretraining_documents([row]) == ["Q?\nA has 2*3 = 6 pens.\n#### 6"]


def test_a_step_slip_is_one_wrong_step_carried_to_a_wrong_answer():
    for seed in range(50):
        slipped = lab.slip_solution(SOLUTION, random.Random(seed), "step")
        steps = _steps(slipped)
        wrong = [i for i, (a, op, b, c) in enumerate(steps) if _value(a, op, b) != c]
        assert len(wrong) == 1, slipped  # one slip; every later step is right arithmetic on the wrong numbers
        first = wrong[0]
        assert abs(steps[first][3] - _value(*steps[first][:3])) in (1, 2, 10)
        assert steps[:first] == _steps(SOLUTION)[:first]  # the steps before the slip are untouched
        assert _answer(slipped) == steps[-1][3] != 62 and _answer(slipped) >= 0
        assert slipped.replace("</think>", "").count("\n") == SOLUTION.replace("</think>", "").count("\n")


def test_an_answer_slip_keeps_the_reasoning_and_stops_a_step_early():
    slipped = lab.slip_solution(SOLUTION, random.Random(0), "answer")
    assert slipped == SOLUTION.replace("<answer>62", "<answer>54")
    one_step = "<think>\nThe pens cost 3*4 = 12 dollars.\n</think>\n<answer>12</answer>"
    assert lab.slip_solution(one_step, random.Random(0), "answer").endswith("<answer>13</answer>")
    with pytest.raises(ValueError, match="kind must be"):
        lab.slip_solution(SOLUTION, random.Random(0), "typo")
    with pytest.raises(ValueError, match="no worked step"):
        lab.slip_solution("<think>\nno numbers\n</think>\n<answer>1</answer>", random.Random(0))


def test_slips_on_every_template_change_the_final_answer():
    rows = prepare_gsm8k(lab.word_problems(400, None, seed=1))
    rng = random.Random(0)
    for row in rows:
        for kind in ("step", "answer"):
            slipped = lab.slip_solution(row["solution"], rng, kind)
            assert correctness_reward([""], [slipped], answer=[row["answer"]]) == [0.0], slipped
            assert format_reward([""], [slipped]) == [1.0], slipped


def test_imperfect_demonstrations_slip_the_share_asked_and_keep_the_answers():
    rows = prepare_gsm8k(lab.word_problems(1000, lab.OWN_TEMPLATES, seed=0), conversational=True)
    demos = lab.imperfect_demonstrations(rows, error_rate=0.3, seed=1)
    kinds = [d["slip"] for d in demos]
    # 1,000 draws at 0.3: the share's standard deviation is 0.014; 0.06 is more than 4 of them
    assert abs(sum(k != "" for k in kinds) / 1000 - 0.3) < 0.06
    assert abs(kinds.count("step") - kinds.count("answer")) < 80
    for row, demo in zip(rows, demos):
        assert demo["prompt"] == row["prompt"] and demo["answer"] == row["answer"]
        assert (demo["solution"] == row["solution"]) == (demo["slip"] == "")
    assert demos == lab.imperfect_demonstrations(rows, error_rate=0.3, seed=1)
    only_steps = lab.imperfect_demonstrations(rows[:200], error_rate=1.0, seed=0, kinds=("step",))
    assert {d["slip"] for d in only_steps} == {"step"}
    with pytest.raises(ValueError, match="error_rate must be in"):
        lab.imperfect_demonstrations(rows, error_rate=1.5)
    with pytest.raises(ValueError, match="kinds must name"):
        lab.imperfect_demonstrations(rows, error_rate=0.5, kinds=("typo",))


def test_classify_completion_tells_the_mistakes_apart():
    right = "<think>\nThe pens cost 3*4 = 12 dollars.\nMia gets 20-12 = 8 dollars in change.\n</think>\n<answer>8</answer>"
    slipped = right.replace("= 12 d", "= 13 d").replace("20-12 = 8", "20-13 = 7").replace(">8<", ">7<")
    misread = right.replace("3*4 = 12", "3*5 = 15").replace("20-12 = 8", "20-15 = 5").replace(">8<", ">5<")
    cases = {(right, True): "right", (right, False): "malformed or unfinished", ("8", True): "malformed or unfinished",
             (slipped, True): "a wrong step", (right.replace(">8<", ">12<"), True): "answer tag ≠ last step",
             (misread, True): "other wrong",
             ("<think>\nEach gets 79/8 = 9 stamps.\n</think>\n<answer>9</answer>", True): "a wrong step"}
    for (text, finished), expected in cases.items():
        assert lab.classify_completion(text, finished, "8") == expected, text
    assert set(cases.values()) == set(lab.OUTCOMES)


def test_pretrain_config_errors_name_the_field():
    with pytest.raises(ValueError, match="steps"):
        lab.PretrainConfig(steps=0)
    with pytest.raises(ValueError, match="learning_rate"):
        lab.PretrainConfig(learning_rate=-1.0)


def test_metric_series_skips_the_steps_without_an_update():
    history = {"step": [1, 2, 3], "skipped": [0.0, 1.0, 0.0], "reward": [0.1, 0.0, 0.3], "entropy": [0.5, 0.4]}
    steps, values = lab.metric_series(history, "entropy")
    assert steps.tolist() == [1, 3] and values.tolist() == [0.5, 0.4]
    assert lab.metric_series(history, "reward")[0].tolist() == [1, 2, 3]


# ----------------------------------------------------------------------------- the workflow, connected

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="module")
def rows():
    test = lab.word_problems(4, lab.OWN_TEMPLATES, seed=1)
    train = lab.word_problems(96, lab.OWN_TEMPLATES, seed=2, exclude=[r["question"] for r in test])
    return train, test


@pytest.fixture(scope="module")
def base_folder(rows, tmp_path_factory):
    return lab.build_own_model(tmp_path_factory.mktemp("capstone") / "base", rows[0], **TINY)


def test_build_own_model_is_hub_shaped(base_folder):
    model, tok = load_causal_lm(base_folder, device="cpu")
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.hidden_size == 32
    assert tok.bos_token_id is None and tok.pad_token_id != tok.eos_token_id and tok.chat_template
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.pad_token_id]
    # the tokenizer was trained on the problems: a whole word of theirs is one token
    assert len(tok.tokenize(" change")) == 1


def test_pretraining_lowers_the_loss(rows, base_folder):
    """Tiny model (1 layer of width 32), 96 documents, 60 steps at the default learning rate: the mean loss of
    the last 5 steps over the first 5 (≈ 6.2 nats, about ln of the vocabulary) was 0.53 / 0.54 / 0.57 for model
    seeds 0 / 1 / 2; asserted < 0.7."""
    model, tok = load_causal_lm(base_folder, device="cpu")
    hist = lab.pretrain(model, tok, lab.pretraining_documents(rows[0]), lab.PretrainConfig(steps=60, warmup_steps=5),
                        progress=False)
    first, last = sum(hist["loss"][:5]) / 5, sum(hist["loss"][-5:]) / 5
    assert last < 0.7 * first, (first, last)
    assert not model.training
    with pytest.raises(ValueError, match="documents is empty"):
        lab.pretrain(model, tok, [])


def _task(tok, train, test):
    demos = lab.imperfect_demonstrations(prepare_gsm8k(train, conversational=True), error_rate=0.5, seed=0)
    return DatasetTask(demos, [correctness_reward, format_reward], reward_weights=[1.0, 0.1],
                       eval_dataset=prepare_gsm8k(test, conversational=True), answer_column="solution",
                       correctness_func="correctness_reward", format_func="format_reward", max_completion_length=24,
                       tokenizer=tok)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_pretrain_sft_grpo_seeds_save_and_reload_connect(rows, base_folder, tmp_path, lora):
    from peft import LoraConfig

    model, tok = load_causal_lm(base_folder, device="cpu")
    lab.pretrain(model, tok, lab.pretraining_documents(rows[0]), lab.PretrainConfig(steps=2), progress=False)
    task = _task(tok, *rows)
    train_sft(model, tok, task, SFTConfig(steps=2, batch_size=4), progress=False)
    model.save_pretrained(tmp_path / "sft"); tok.save_pretrained(tmp_path / "sft")
    cfg = GRPOConfig(max_steps=1, prompts_per_step=2, num_generations=4, eval_generations=2, learning_rate=1e-3)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM") if lora else None
    runs = lab.grpo_seeds(tmp_path / "sft", task, cfg, seeds=(0, 1), peft_config=peft_config, device="cpu")
    assert [r.seed for r in runs] == [0, 1] and all(len(r.history["step"]) == 1 for r in runs)
    assert all(set(r.after) >= {"pass@1", "pass@2", "greedy", "format"} for r in runs)
    assert hasattr(runs[0].model, "disable_adapter") == lora
    table = lab.seed_table(runs[0].after, runs, k=2)
    assert table.count("\n") == 5 and "| seed 1 |" in table and "| mean of 2 seeds |" in table

    folder = lab.save_policy(runs[0].model, tok, tmp_path / "grpo")
    assert (folder / "adapter_config.json").is_file() == lora and (folder / "tokenizer.json").is_file()
    reloaded, tok2 = lab.load_policy(folder, device="cpu")
    assert tok2.get_vocab() == tok.get_vocab() and hasattr(reloaded, "disable_adapter") == lora
    g = generate(runs[0].model, tok, [p.prompt for p in task.eval_set[:2]], 2, 12, 1.0,
                 generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = sequence_logprobs(runs[0].model, g.prompt_ids, g.prompt_mask, g.completion_ids)
        b = sequence_logprobs(reloaded, g.prompt_ids, g.prompt_mask, g.completion_ids)
    torch.testing.assert_close(a * g.completion_mask, b * g.completion_mask)
    if not lora:
        shares = lab.outcome_shares(runs[0].model, tok, task, num_generations=2)
        assert set(shares) == set(lab.OUTCOMES) and abs(sum(shares.values()) - 1) < 1e-9


def test_the_templates_named_exist():
    assert set(lab.OWN_TEMPLATES) <= set(TEMPLATES)
