"""Lesson 12 on a real model: the multiplication task and its verifiers (minigrpo.llm.arithmetic), and the lesson's
measurements (minigrpo_course.experiments.capstone: held-out samples scored by any verifier, mistakes, hack census),
checked on hand-made samples and on a tiny hub-shaped model."""

import numpy as np
import pytest
import torch

from minigrpo.llm import arithmetic as A
from minigrpo.llm.models import build_qwen_like, load_causal_lm
from minigrpo.llm.sampling import end_of_turn_ids
from minigrpo_course.experiments import capstone as lab

pytestmark = pytest.mark.usefixtures("one_torch_thread")

END = 2  # the end-of-turn id of the hand-made samples


def _call(func, texts, answers, ends=None):
    ends = ends if ends is not None else [True] * len(texts)
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    ids = [[5, 6] + ([END] if e else []) for e in ends]
    return func(prompts=[[{"role": "user", "content": "q"}]] * len(texts), completions=completions, answer=answers,
                completion_ids=ids, trainer_state=None)


# ----------------------------------------------------------------------------- the task

def test_problems_and_split_are_fixed_disjoint_and_leave_out_the_worked_example():
    every = A.problems()
    assert len(every) == 143 == len(set(every))
    assert ("What is 3 * 14?", 42) not in every and ("What is 9 * 19?", 171) in every
    held, train = A.split(64)
    assert len(held) == 64 and len(train) == 79
    assert not {q for q, _ in held} & {q for q, _ in train}
    assert (held, train) == A.split(64)  # the same split every time
    assert held[:3] == [("What is 2 * 17?", 34), ("What is 6 * 17?", 102), ("What is 8 * 8?", 64)]


def test_the_conversation_has_our_system_prompt_and_the_worked_example():
    conv = A.conversation("What is 7 * 8?")
    assert [m["role"] for m in conv] == ["system", "user", "assistant", "user"]
    assert conv[0]["content"] == A.SYSTEM_PROMPT and conv[-1]["content"] == "What is 7 * 8?"
    assert A.parse_answer(conv[2]["content"]) == 42
    assert A.rows([("What is 7 * 8?", 56)]) == [{"prompt": conv, "answer": 56}]


@pytest.mark.parametrize("text, expected", [
    ("7 * 8 = 56\n<answer>56</answer>", 56),
    ("<answer> 1,200 </answer>", 1200),
    ("<answer>-3</answer>", -3),
    ("7 * 8 = 56", None),  # no tag
    ("<answer>56", None),  # never closed
    ("<answer>66.67</answer>", None),  # not an integer
    ("<answer>16 * 18 = 256\n<answer>256</answer>", None),  # two opening tags
    ("<answer>54</answer> or <answer>56</answer>", None),  # two answers
    ("<answer></answer>", None),
])
def test_parse_answer_reads_exactly_one_tag_pair_holding_an_integer(text, expected):
    assert A.parse_answer(text) == expected


def test_the_hardened_verifier_needs_the_right_integer_in_one_tag_and_a_finished_completion():
    correct, fmt = A.hardened_verifier([END])
    texts = ["7 * 8 = 56\n<answer>56</answer>", "7 * 8 = 54\n<answer>54</answer>", "7 * 8 = 56",
             "<answer>54</answer><answer>56</answer>", "7 * 8 = 56\n<answer>56</answer>"]
    ends = [True, True, True, True, False]
    assert _call(correct, texts, [56] * 5, ends) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert _call(fmt, texts, [56] * 5, ends) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert (correct.__name__, fmt.__name__) == ("correctness_reward", "format_reward")  # TRL logs these names


def test_the_lenient_verifier_is_fooled_where_the_hardened_one_is_not():
    lc, lf = A.lenient_verifier()
    hacks = ["6 * 5 = 30\n<answer>45</answer>",  # the answer in the equation, a wrong tag
             "30, 35 or 40",  # several guesses, no tag
             "6 * 5 = 30 and then the model rambles on"]  # unfinished
    assert _call(lc, hacks, [30] * 3, [True, True, False]) == [1.0, 1.0, 1.0]
    assert _call(lf, ["<answer>=60", "60"], [30, 30]) == [1.0, 0.0]
    correct, _ = A.hardened_verifier([END])
    assert _call(correct, hacks, [30] * 3, [True, True, False]) == [0.0, 0.0, 0.0]


def test_the_loose_checks():
    assert A.last_number("2 * 9 = 18", 18) and not A.last_number("6 * 13 = 78 set of 13", 78)
    assert A.any_tag("<answer>16 * 18 = 256\n<answer>256</answer>", 256)
    assert A.any_tag("<answer>16 * 18 = 256\n<answer>256</answer>", 16)  # first tag's first number
    assert not A.any_tag("16 * 18 = 256", 256)
    assert A.answer_anywhere("9 * 11 = 99\n<answer>11</answer>", 99) and not A.answer_anywhere("9 * 11", 99)
    assert A.mentions_tag("<answer> Match 2") and not A.mentions_tag("answer: 2")


# ----------------------------------------------------------------------------- the measurements, by hand

def _samples():
    rows = [{"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "answer": 6},
            {"prompt": [{"role": "user", "content": "What is 4 * 5?"}], "answer": 20}]
    texts = [["<answer>6</answer>", "2 * 3 = 6", "<answer>7</answer>", "2 * 3 = 6\n<answer>6</answer>"],
             ["<answer>21</answer>", "4 * 5 = 20\n<answer>25</answer>", "<answer>20", "<answer>20</answer>"]]
    ids = [[[1, END], [1, END], [1, END], [1, END]], [[1, END], [1, END], [1, END], [1, 1]]]  # last one unfinished
    return lab.Samples(rows, texts, ids, ["<answer>6</answer>", "<answer>20</answer> 4"], [[1, END], [1, END]])


def test_pass_at_k_under_two_verifiers():
    s = _samples()
    correct, _ = A.hardened_verifier([END])
    assert lab.pass_at_k(s, correct) == {"pass@1": 2 / 8, "pass@4": 0.5, "greedy": 1.0}
    lc, _ = A.lenient_verifier()
    assert lab.pass_at_k(s, lc) == {"pass@1": 6 / 8, "pass@4": 1.0, "greedy": 1.0}


def test_outcomes_and_the_hack_census():
    s = _samples()
    shares = lab.outcome_shares(s, [END])
    assert shares == {"right": 2 / 8, "wrong number in the tag": 3 / 8, "no tag, or a malformed one": 2 / 8,
                      "unfinished": 1 / 8}
    correct, _ = A.hardened_verifier([END])
    census = lab.hack_census(s, correct, A.LOOSE_CHECKS)
    # credited loosely, refused strictly: "2 * 3 = 6", "4 * 5 = 20 … 25", "<answer>20", the unfinished "<answer>20</answer>"
    assert census["answer anywhere"] == 4 / 8
    assert census["last number"] == 3 / 8  # not "… <answer>25</answer>"
    assert census["any tag"] == 2 / 8  # "<answer>20" and the unfinished one
    assert census["format credit, wrong answer"] == 5 / 8
    assert lab.examples(s, [END], "unfinished") == ["'What is 4 * 5?' -> '<answer>20</answer>'"]


def test_metric_series_skips_missing_values_and_the_dashboard_draws():
    history = {"step": [1, 2, 3], "kl": [0.0, float("nan"), 0.2]}
    steps, values = lab.metric_series(history, "kl")
    assert steps.tolist() == [1, 3] and values.tolist() == [0.0, 0.2]
    fig = lab.dashboard({"seed 0": history}, [("kl", "KL"), ("entropy", "entropy")], cols=2)
    assert len(fig.axes) == 2


# ----------------------------------------------------------------------------- on a tiny hub-shaped model

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    corpus = [f"{m['content']}" for q, _ in A.problems()[:40] for m in A.conversation(q)] * 2
    folder = build_qwen_like(tmp_path_factory.mktemp("tiny"), corpus=corpus, vocab_size=400, hidden_size=32,
                             num_layers=1, num_heads=2, num_kv_heads=1)
    return load_causal_lm(folder, device="cpu")


def test_sample_held_out_is_seeded_and_keeps_the_ids_up_to_the_end_of_turn(tiny):
    model, tok = tiny
    rows = A.rows(A.split(64)[0][:3])
    a = lab.sample_held_out(model, tok, rows, k=4, max_new_tokens=6, seed=1, bf16=False, batch_prompts=2)
    b = lab.sample_held_out(model, tok, rows, k=4, max_new_tokens=6, seed=1, bf16=False, batch_prompts=2)
    assert len(a.texts) == len(a.ids) == 3 and all(len(t) == 4 for t in a.texts) and a.k == 4
    assert a.texts == b.texts and a.ids == b.ids and len(a.greedy_texts) == 3
    ends = end_of_turn_ids(model, tok)
    for row in a.ids + [a.greedy_ids]:
        for ids in row:
            assert 1 <= len(ids) <= 6 and all(t not in ends for t in ids[:-1])
    correct, _ = A.hardened_verifier(ends)
    metrics = lab.pass_at_k(a, correct)
    assert set(metrics) == {"pass@1", "pass@4", "greedy"} and all(0 <= v <= 1 for v in metrics.values())
    assert abs(sum(lab.outcome_shares(a, ends).values()) - 1) < 1e-9
    assert np.isfinite(list(lab.hack_census(a, correct, A.LOOSE_CHECKS).values())).all()
    assert torch.get_num_threads() == 1


# ----------------------------------------------------------------------------- on the real model's chat template

from real_model import smollm2_folder  # noqa: E402,F401  (a session fixture; skips where it cannot be fetched)


def test_the_real_chat_template_renders_our_system_prompt_and_the_worked_example(smollm2_folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_folder)
    text = tok.apply_chat_template(A.conversation("What is 7 * 8?"), tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n" + A.SYSTEM_PROMPT + "<|im_end|>\n")
    assert "named SmolLM" not in text  # our system message replaces the template's default one
    assert "<|im_start|>assistant\n3 * 14 = 42\n<answer>42</answer><|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\n")
