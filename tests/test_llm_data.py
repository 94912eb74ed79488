"""Tasks from data and reward functions as TRL users write them; the GSM8K-format generator, loader and rewards."""

import functools
import json
import math
import random
import types

import pytest

from minigrpo.llm import gsm8k
from minigrpo.llm.data import DatasetTask, as_rows, load_rows, task_dataset
from minigrpo.llm.rewards import TaskReward, check_reward_funcs, reward_func_name, task_reward_funcs
from minigrpo.llm.tasks import AdditionTask, CountdownTask, SortTask

# ----------------------------------------------------------------------------- reward functions


def exact(prompts, completions, answer, **kwargs):
    return [float(c == a) for c, a in zip(completions, answer)]


def short(prompts, completions, **kwargs):
    return [1.0 if len(c) <= 2 else 0.0 for c in completions]


ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+3=", "answer": "5"}]


def _task(*funcs, weights=None, rows=ROWS, **kw):
    return DatasetTask(rows, list(funcs), reward_weights=weights, eval_dataset=rows, answer_column="answer", **kw)


def test_weighted_rewards_and_trl_metrics_by_hand():
    task = _task(exact, short, weights=[1.0, 0.5])
    p0, p1 = task.train_set
    rewards, m = task.score([p0, p0, p1, p1], ["2", "22", "5", "555"], [True] * 4)
    assert rewards == [1.5, 0.5, 1.5, 0.0]  # exact + 0.5 · short
    assert m["rewards/exact/mean"] == 0.5 and m["rewards/short/mean"] == 0.75
    assert m["rewards/exact/std"] == pytest.approx(math.sqrt(1 / 3))  # Bessel: var of (1,0,1,0) = 4·0.25/3
    assert m["rewards/short/std"] == pytest.approx(0.5)  # (1,1,1,0): var = 0.75/3
    assert m["correct"] == 0.5 and m["format"] == 1.0  # format: no format function, every completion ended


def test_columns_reach_the_reward_functions_by_name_as_trl_passes_them():
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(kwargs, prompts=prompts, completions=completions, step=kwargs["trainer_state"].global_step)
        return [0.0] * len(completions)

    rows = [{"prompt": "q1", "answer": "a1", "level": 3, "completion": "dropped"}]
    task = DatasetTask(rows, spy)
    task.score([task.train_set[0]] * 2, ["x", "y"], [True, False], completion_ids=[[5, 2], [6]])
    assert seen["prompts"] == ["q1", "q1"] and seen["completions"] == ["x", "y"]
    assert seen["answer"] == ["a1", "a1"] and seen["level"] == [3, 3] and "completion" not in seen
    assert seen["completion_ids"] == [[5, 2], [6]] and seen["step"] == 0
    assert callable(seen["log_metric"]) and callable(seen["log_extra"])
    task.score([task.train_set[0]], ["z"], [True])
    assert seen["step"] == 1 and seen["completion_ids"] is None  # no tokenizer: None


def test_conversational_prompts_get_conversational_completions():
    got = {}

    def spy(prompts, completions, **kwargs):
        got.update(prompts=prompts, completions=completions)
        return [1.0] * len(completions)

    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    task = DatasetTask([{"prompt": chat}], spy)
    task.score(task.train_set, ["hello"], [True])
    assert got["prompts"] == [chat] and got["completions"] == [[{"role": "assistant", "content": "hello"}]]


def test_none_is_nan_and_the_weighted_sum_skips_it_as_trl_does():
    def only_first(prompts, completions, **kwargs):
        return [1.0] + [None] * (len(completions) - 1)

    task = _task(only_first, short, weights=[2.0, 1.0])
    rewards, m = task.score([task.train_set[0]] * 3, ["2", "2", "222"], [True] * 3)
    assert rewards == [3.0, 1.0, 0.0]
    assert m["rewards/only_first/mean"] == 1.0 and math.isnan(m["rewards/only_first/std"])  # one value: no std

    def never(prompts, completions, **kwargs):
        return [None] * len(completions)

    with pytest.raises(ValueError, match=r"every reward function \(never\) returned None for completion 0"):
        _task(never).score([_task(never).train_set[0]], ["2"], [True])


@pytest.mark.parametrize("returned,error,message", [
    ([1.0], ValueError, "reward function 'bad' returned 1 rewards for 2 completions"),
    ([1.0, float("nan")], ValueError, "reward function 'bad' returned nan for completion 1"),
    ([float("inf"), 0.0], ValueError, "reward function 'bad' returned inf for completion 0"),
    (["1", 0.0], TypeError, "reward function 'bad' returned str '1' for completion 0"),
    (3.0, TypeError, "reward function 'bad' returned float, not a list"),
])
def test_bad_rewards_are_one_sentence_naming_the_function(returned, error, message):
    def bad(prompts, completions, **kwargs):
        return returned

    task = _task(bad)
    with pytest.raises(error, match=message.replace("(", r"\(")):
        task.score([task.train_set[0]] * 2, ["2", "2"], [True, True])


def test_numpy_and_torch_scalars_and_bools_are_numbers():
    np = pytest.importorskip("numpy")
    import torch

    def mixed(prompts, completions, **kwargs):
        return [np.float32(0.5), torch.tensor(2.0), True][: len(completions)]

    task = _task(mixed)
    assert task.score([task.train_set[0]] * 3, ["a", "b", "c"], [True] * 3)[0] == [0.5, 2.0, 1.0]


def test_reward_function_list_checks_and_names():
    assert reward_func_name(functools.partial(exact, answer=None)) == "exact"  # TRL unwraps partials

    class Scorer:
        def __call__(self, prompts, completions, **kwargs):
            return [0.0] * len(completions)

    funcs, names, weights = check_reward_funcs([exact, Scorer(), exact])
    assert names == ["exact", "Scorer", "exact_2"] and weights == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="reward_weights has 1 entries for 2 reward functions"):
        check_reward_funcs([exact, short], [1.0])
    with pytest.raises(ValueError, match="weight of 'short' must be a finite number"):
        check_reward_funcs([exact, short], [1.0, float("nan")])
    with pytest.raises(TypeError, match="reward models by name are not supported"):
        check_reward_funcs(["Skywork/reward-model"])
    with pytest.raises(ValueError, match="reward_funcs is empty"):
        check_reward_funcs([])


def test_dataset_errors_name_the_columns():
    with pytest.raises(ValueError, match="train_dataset has no prompt column 'prompt'; its columns are "
                                         "'question', 'answer' \\(set prompt_column=\\)"):
        DatasetTask([{"question": "q", "answer": "a"}], exact)
    with pytest.raises(ValueError, match="eval_dataset has no answer column 'solution'"):
        DatasetTask([{"prompt": "p", "solution": "s"}], exact, answer_column="solution",
                    eval_dataset=[{"prompt": "p", "answer": "a"}])
    with pytest.raises(ValueError, match="column named 'completions'"):
        DatasetTask([{"prompt": "p", "completions": "c"}], exact)
    with pytest.raises(TypeError, match=r"train_dataset\[0\]\['prompt'\] must be a string or a list"):
        DatasetTask([{"prompt": 3}], exact)
    with pytest.raises(ValueError, match="correctness_func='nope' is not one of the reward functions \\(exact\\)"):
        DatasetTask(ROWS, exact, correctness_func="nope")


def test_load_dataset_on_a_local_jsonl_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "train.jsonl"
    chat = [{"role": "user", "content": "2+2?"}]
    path.write_text("\n".join(json.dumps(r) for r in [{"prompt": chat, "answer": "4"},
                                                        {"prompt": chat, "answer": "5"}]))
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    task = DatasetTask(ds, exact, eval_dataset=load_rows(path), answer_column="answer")
    assert task.train_set[0].prompt == chat and task.train_set[1].answer == "5" and len(task.eval_set) == 2
    rewards, _ = task.score(task.train_set, ["4", "4"], [True, True])
    assert rewards == [0.0, 0.0]  # conversational: completions are message lists, never equal to "4"
    assert as_rows({"prompt": ["a", "b"], "answer": ["1", "2"]}) == [{"prompt": "a", "answer": "1"},
                                                                    {"prompt": "b", "answer": "2"}]


def test_evaluation_counts_a_positive_correctness_reward_of_a_finished_completion():
    def graded(prompts, completions, answer, **kwargs):
        return [2.0 if c == a else (-1.0 if c else None) for c, a in zip(completions, answer)]

    task = _task(short, graded, correctness_func="graded", format_func=short)
    p = task.train_set[0]  # answer "2"
    assert task.correctness_reward(p, "2", True) == 1.0  # 2.0 > 0 counts as correct: pass@1 stays a share
    assert task.correctness_reward(p, "2", False) == 0.0  # did not end: not an answer
    assert task.correctness_reward(p, "3", True) == 0.0 and task.correctness_reward(p, "", True) == 0.0  # None: 0
    assert task.format_reward(p, "222", True) == 0.0 and task.format_reward(p, "22", True) == 1.0
    assert task.reward(p, "2", True) == 3.0


# ----------------------------------------------------------------------------- built-in tasks as reward functions

@pytest.mark.parametrize("task", [AdditionTask(eval_size=20), CountdownTask(eval_size=20), SortTask(eval_size=20)],
                         ids=["addition", "countdown", "sort"])
def test_builtin_tasks_as_trl_reward_functions_score_what_the_task_scores(task):
    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(30)]
    completions = [p.answer if i % 3 == 0 else (p.answer[::-1] if i % 3 == 1 else "x") for i, p in enumerate(problems)]
    expected, expected_metrics = task.score(problems, completions, [True] * 30)
    funcs, weights = task_reward_funcs(task)
    from_data = DatasetTask(task_dataset(task, 30), funcs, reward_weights=weights, answer_column="answer",
                            correctness_func="correctness_reward", format_func="format_reward")
    rows = [from_data._problems([{"prompt": p.prompt, "answer": p.answer}], "rows")[0] for p in problems]
    rewards, metrics = from_data.score(rows, completions, [True] * 30)
    assert rewards == pytest.approx(expected)
    assert {k: metrics[k] for k in expected_metrics} == pytest.approx(expected_metrics)
    assert 0 < expected_metrics["correct"] < 1  # both kinds present
    direct = TaskReward(task)(prompts=[p.prompt for p in problems], completions=completions, completion_ids=None)
    assert direct == [task.correctness_reward(p, c) for p, c in zip(problems, completions)]


def test_a_prompt_the_task_cannot_have_made_is_an_error():
    with pytest.raises(ValueError, match="'7-3=' is not a prompt of the addition task"):
        AdditionTask(eval_size=5).problem_from_prompt("7-3=")


# ----------------------------------------------------------------------------- GSM8K format

def test_generated_problems_have_gsm8k_shape_and_are_deterministic_and_distinct():
    rows = gsm8k.generate_word_problems(3000, seed=0)
    assert rows == gsm8k.generate_word_problems(3000, seed=0) and rows != gsm8k.generate_word_problems(3000, seed=1)
    assert len({r["question"] for r in rows}) == 3000
    for r in rows:
        lines = r["answer"].split("\n")
        assert 2 <= len(lines) - 1 <= 4 and lines[-1].startswith("#### ")
        for line in lines[:-1]:  # every step: "... a op b = <<a op b=c>>c ...", and the arithmetic is right
            expr, value = gsm8k.re.search(r"<<([\d+\-*/]+)=(\d+)>>\2", line).groups()
            a, op, b = gsm8k.re.fullmatch(r"(\d+)([+\-*/])(\d+)", expr).groups()
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                    "/": int(a) / int(b)}[op] == int(value)
        assert int(gsm8k.extract_hash_answer(r["answer"])) == int(value)  # the last step's result
    used = {t: 0 for t in gsm8k.TEMPLATES}
    rng = random.Random(0)
    for _ in range(1100):
        used[rng.choice(list(gsm8k.TEMPLATES))] += 1
    assert min(used.values()) > 0


def test_generated_splits_are_disjoint_and_load_gsm8k_never_goes_online_when_offline(monkeypatch):
    train, test = gsm8k.generated_split("train"), gsm8k.generated_split("test")
    assert (len(train), len(test)) == (7473, 1319)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    import datasets

    def no_network(*args, **kwargs):
        raise AssertionError("load_dataset must not be called offline")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert gsm8k.hub_reachable() is False
    ds = gsm8k.load_gsm8k("test", num_problems=5)
    assert ds.column_names == ["question", "answer"] and ds.to_list() == test[:5]
    assert "generated" in ds.info.description
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(gsm8k, "hub_reachable", lambda timeout=3.0: False)
    assert gsm8k.load_gsm8k("train", source="auto", num_problems=2).to_list() == train[:2]
    with pytest.raises(ValueError, match="split must be one of train, test"):
        gsm8k.load_gsm8k("validation", source="generated")


def test_answer_extraction_and_sft_targets():
    answer = "He buys 4*3 = <<4*3=12>>12 pens.\nHe has 20-12 = <<20-12=8>>8 left.\n#### 8"
    target = gsm8k.sft_target(answer)
    assert target == "<think>\nHe buys 4*3 = 12 pens.\nHe has 20-12 = 8 left.\n</think>\n<answer>8</answer>"
    assert gsm8k.extract_hash_answer(answer) == "8" and gsm8k.extract_hash_answer("no hashes") is None
    assert gsm8k.extract_answer("<answer>1</answer> then <answer> 1,200 </answer>") == "1,200"
    assert gsm8k.extract_answer("<answer>7") is None
    assert [gsm8k.normalize_number(x) for x in ("$1,200", "12.0", "3.5", "abc", None, "-4.")] == \
        ["1200", "12", "3.5", None, None, "-4"]


def test_gsm8k_rewards_by_hand():
    right = "<think>\n4*3 = 12\n</think>\n<answer>12</answer>"
    cases = [right, "<answer>12</answer>", "<think>\nx\n</think>\n<answer>13</answer>",
             right + " and more", "<think>\nx\n</think><answer>twelve</answer>", ""]
    kw = dict(prompts=["q"] * 6, completions=cases, answer=["12"] * 6)
    assert gsm8k.correctness_reward(**kw) == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert gsm8k.format_reward(**kw) == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    # the answer column may hold a whole GSM8K solution; conversational completions are read too
    assert gsm8k.correctness_reward(prompts=["q"], completions=[[{"role": "assistant", "content": right}]],
                                    answer=["so 4*3 = <<4*3=12>>12\n#### 12"]) == [1.0]


def test_gsm8k_rewards_run_as_trls_grpo_trainer_calls_them():
    """TRL's own ``GRPOTrainer._calculate_rewards`` on a stand-in trainer: its keyword arguments, its None
    handling, its output; then its weighted sum equals the task's reward."""
    pytest.importorskip("trl")
    import torch
    from transformers import TrainerState
    from trl import GRPOTrainer

    rows = gsm8k.prepare_gsm8k(gsm8k.generated_split("test")[:2], conversational=True)
    funcs = [gsm8k.correctness_reward, gsm8k.format_reward]
    logged = []
    trainer = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        args=types.SimpleNamespace(report_to=[]), state=TrainerState(), reward_funcs=funcs,
        reward_processing_classes=[None, None], reward_func_names=["correctness_reward", "format_reward"],
        _log_completion_extra=lambda column, values: None, _log_metric=lambda n, v: logged.append(n),
        environments=None)
    inputs = [r for r in rows for _ in range(2)]  # G = 2
    texts = [rows[0]["solution"], "junk", rows[1]["solution"], "<think>\nx\n</think>\n<answer>0</answer>"]
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    per_func = GRPOTrainer._calculate_rewards(trainer, inputs, [r["prompt"] for r in inputs], completions,
                                              [[1, 2]] * 4)
    assert per_func.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
    task = DatasetTask(rows, funcs, reward_weights=[1.0, 0.1], answer_column="solution")
    problems = [task.train_set[i // 2] for i in range(4)]
    rewards, metrics = task.score(problems, texts, [True] * 4)
    assert rewards == pytest.approx((per_func * torch.tensor([1.0, 0.1])).sum(1).tolist())
    assert metrics["rewards/correctness_reward/mean"] == 0.5 and metrics["rewards/format_reward/mean"] == 0.75

    countdown = CountdownTask(eval_size=5)  # a built-in task's rewards, on a data set of its prompts alone
    trainer.reward_funcs, weights = task_reward_funcs(countdown)
    problems = countdown.eval_set[:2]
    texts = [problems[0].answer, "1+2", problems[1].answer[::-1], "x"]
    per_func = GRPOTrainer._calculate_rewards(trainer, [{"prompt": p.prompt} for p in problems for _ in range(2)],
                                              [p.prompt for p in problems for _ in range(2)], texts, [[1]] * 4)
    expected = countdown.score([p for p in problems for _ in range(2)], texts, [True] * 4)[0]
    assert (per_func * torch.tensor(weights)).sum(1).tolist() == pytest.approx(expected)


def test_gsm8k_task_trains_on_train_and_holds_out_test(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    task = gsm8k.gsm8k_task(train_size=50, eval_size=10, system_prompt=None)
    assert len(task.train_set) == 50 and len(task.eval_set) == 10 and task.max_completion_length == 320
    assert not {p.prompt for p in task.train_set} & {p.prompt for p in task.eval_set}
    p = task.eval_set[0]
    assert p.prompt.endswith("?\n") and p.answer.startswith("<think>\n") and dict(p.meta)["answer"].isdigit()
    assert task.correctness_reward(p, p.answer, True) == 1.0 and task.format_reward(p, p.answer, True) == 1.0
    assert task.correctness_reward(p, "<think>\n?\n</think>\n<answer>-1</answer>", True) == 0.0
    chat = gsm8k.gsm8k_task(train_size=5, eval_size=2, conversational=True)
    assert chat.train_set[0].prompt[0] == {"role": "system", "content": gsm8k.SYSTEM_PROMPT}


def test_grpo_steps_on_a_dataset_task_see_the_step_and_log_trl_metrics():
    """The trainer's rollout calls DatasetTask.score: reward functions get the columns, trainer_state counts the
    steps, log_metric values reach the step's metrics."""
    import torch

    from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
    from minigrpo.llm.models import make_tiny_model
    from minigrpo.llm.tokenizer import build_char_tokenizer

    steps_seen = []

    def digits(prompts, completions, answer, trainer_state, log_metric, **kwargs):
        steps_seen.append(trainer_state.global_step)
        log_metric("answer_length", sum(map(len, answer)) / len(answer))
        return [None if c == "" else float(c == a) for c, a in zip(completions, answer)]

    def ended(prompts, completions, completion_ids, **kwargs):
        return [float(bool(ids) and ids[-1] == tok.eos_token_id) for ids in completion_ids]

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    task = DatasetTask(task_dataset(AdditionTask(eval_size=4), 16), [digits, ended], [1.0, 0.1],
                       answer_column="answer", max_completion_length=4, tokenizer=tok)
    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32, num_layers=1)
    trainer = GRPOTrainer(model, tok, task, GRPOConfig(max_steps=2, prompts_per_step=2, num_generations=4,
                                                       eval_every=0))
    metrics = [trainer.step() for _ in range(2)]
    assert steps_seen == [0, 1]
    assert all({"rewards/digits/mean", "rewards/ended/std", "answer_length", "correct"} <= m.keys() for m in metrics)
    assert 2 <= metrics[0]["answer_length"] <= 3  # two-digit sums: 2 or 3 characters
