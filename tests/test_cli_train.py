"""`minigrpo train llm` with your model, your data and your reward (as `trl grpo`), configs as TRL reads them
(HfArgumentParser, YAML, --flags), and one sentence, exit status 2, for every bad input, before any training."""

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from minigrpo.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")

REWARDS = '''
import math

def exact(prompts, completions, answer, **kwargs):
    return [float(answer_ in c[-1]["content"]) for c, answer_ in zip(completions, answer)]

def lengthy(prompts, completions, **kwargs):
    return [len(c[-1]["content"]) / 10 for c in completions]

def no_kwargs(prompts, completions):
    return [0.0] * len(completions)

def wants_solution(prompts, completions, solution, **kwargs):
    return [0.0] * len(completions)

def too_few(prompts, completions, **kwargs):
    return [0.0]

def words(prompts, completions, **kwargs):
    return ["good"] * len(completions)

def nan(prompts, completions, **kwargs):
    return [math.nan] * len(completions)

def crashes(prompts, completions, answer, **kwargs):
    return [int(a) / 0 for a in answer]

NOT_A_FUNCTION = 3
'''


def _rows(n, offset=0):
    return [{"prompt": [{"role": "user", "content": f"What is {a} + {a + 1}?"}], "answer": str(2 * a + 1),
             "level": "easy"} for a in range(offset, offset + n)]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder with a tiny hub-shaped chat model, data files and a reward module, as a user would have them."""
    from minigrpo.llm.models import build_qwen_like

    folder = tmp_path_factory.mktemp("work")
    build_qwen_like(folder / "model", hidden_size=32, num_layers=1, max_positions=256)
    (folder / "my_rewards.py").write_text(REWARDS)
    for name, rows in (("train.jsonl", _rows(8)), ("eval.jsonl", _rows(2, offset=20))):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "questions.jsonl").write_text(json.dumps({"question": "hi", "answer": "1"}) + "\n")
    (folder / "data.txt").write_text("prompt\nhi\n")
    (folder / "a_file").write_text("")
    return folder


@pytest.fixture
def in_workspace(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("my_rewards", None)
    return workspace


TINY = ["--device", "cpu", "--max_steps", "1", "--prompts_per_step", "2", "--num_generations", "2",
        "--max_completion_length", "4"]


def _one_line(capsys, start: str) -> str:
    """The error is one line (a progress bar that had started, drawn with carriage returns, aside)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "\r" not in line and "it/s]" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"minigrpo train: {start}") and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------- configs as TRL reads them

def test_hf_argument_parser_reads_grpo_config_from_flags_and_yaml(tmp_path):
    from transformers import HfArgumentParser

    from minigrpo.llm.grpo import GRPOConfig

    parser = HfArgumentParser(GRPOConfig)
    (cfg,) = parser.parse_args_into_dataclasses(["--learning_rate", "1e-5", "--num_generations", "4", "--bf16",
                                                 "--report_to", "tensorboard", "--logging-dir", "logs",
                                                 "--resume_from_checkpoint", "true", "--epsilon_high", "0.28"])
    assert (cfg.learning_rate, cfg.num_generations, cfg.bf16, cfg.epsilon_high) == (1e-5, 4, True, 0.28)
    assert cfg.report_to == ["tensorboard"] and str(cfg.logging_dir) == "logs" and cfg.resume_from_checkpoint is True
    (tmp_path / "c.yaml").write_text("learning_rate: 3.0e-6\nloss_type: dr_grpo\nresume_from_checkpoint: ck/p\n")
    (cfg,) = parser.parse_yaml_file(tmp_path / "c.yaml")
    assert (cfg.learning_rate, cfg.loss_type, str(cfg.resume_from_checkpoint)) == (3e-6, "dr_grpo", "ck/p")
    (tmp_path / "bad.yaml").write_text("num_generations: 1\n")
    with pytest.raises(ValueError, match=r"GRPOConfig.num_generations must be >= 2, got 1"):  # its own checks run
        parser.parse_yaml_file(tmp_path / "bad.yaml")
    assert GRPOConfig(resume_from_checkpoint=True).resume_from_checkpoint is True  # still takes True
    assert GRPOConfig(resume_from_checkpoint=False).resume_from_checkpoint is None


def test_the_shipped_yaml_recipe_parses_and_finds_its_data_and_rewards(monkeypatch, tmp_path):
    from transformers import HfArgumentParser

    from minigrpo.llm.data import dataset_task_from_files
    from minigrpo.llm.grpo import GRPOConfig
    from minigrpo.llm.recipes import ScriptArguments, read_config

    path = ROOT / "recipes" / "smollm2_arithmetic.yaml"
    script, grpo = HfArgumentParser((ScriptArguments, GRPOConfig)).parse_yaml_file(path)
    assert script.model_name_or_path == "smollm2" and grpo.learning_rate == 1e-6 and grpo.num_generations == 8
    monkeypatch.chdir(tmp_path)  # from anywhere: the paths resolve against the YAML's folder
    monkeypatch.setattr(sys, "path", list(sys.path))
    script, explicit = read_config(path)
    assert Path(script.dataset_name) == ROOT / "recipes" / "arithmetic_train.jsonl"
    assert explicit == {"learning_rate": 1e-6, "max_steps": 50, "prompts_per_step": 8, "num_generations": 8,
                        "max_completion_length": 32, "temperature": 1.0, "beta": 0.0, "report_to": "none"}
    task = dataset_task_from_files(script.dataset_name, script.reward_funcs, script.reward_weights,
                                   script.eval_dataset_name)
    assert (len(task.train_set), len(task.eval_set), task.reward_func_names) == (200, 40, ["correct", "number_only"])
    p = task.train_set[0]
    rewards, _ = task.score([p, p], [dict(p.meta)["answer"], f"It is {dict(p.meta)['answer']} of course"],
                            [True, True])
    assert rewards == [1.2, 1.0]


def test_yaml_errors_name_the_file_and_the_key(tmp_path, capsys):
    (tmp_path / "typo.yaml").write_text("learning_rat: 1.0e-6\n")
    assert main(["train", "llm", "--config", str(tmp_path / "typo.yaml")]) == 2
    _one_line(capsys, f"--config {tmp_path / 'typo.yaml'}: unknown key 'learning_rat' (did you mean learning_rate?)")
    (tmp_path / "text.yaml").write_text("recipe: sort\nlearning_rate: fast\n")
    assert main(["train", "llm", "--config", str(tmp_path / "text.yaml")]) == 2
    _one_line(capsys, f"--config {tmp_path / 'text.yaml'}: learning_rate: cannot read 'fast' as a number")


def test_flags_yaml_and_overrides_combine_in_order(tmp_path):
    from minigrpo.cli import _llm_recipe, build_parser, parse_args

    (tmp_path / "r.yaml").write_text("recipe: sort\nlearning_rate: 1.0e-4\nbeta: 0.1\nmax_steps: 40\n")
    args = parse_args(build_parser(), ["train", "llm", "--config", str(tmp_path / "r.yaml"), "--learning-rate", "2e-5",
                                       "--num_generations=4", "--bf16", "--smoke", "beta=0.2"])
    recipe, explicit, _ = _llm_recipe(args)
    assert (recipe.grpo.learning_rate, recipe.grpo.num_generations, recipe.grpo.bf16, recipe.grpo.beta) == \
        (2e-5, 4, True, 0.2)
    assert recipe.grpo.max_steps == 4  # --smoke after the YAML: tiny
    assert {"grpo.learning_rate", "grpo.beta", "grpo.num_generations", "grpo.bf16"} <= explicit


def test_train_help_lists_tracking_and_your_data():
    from minigrpo.cli import build_parser

    text = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
    text = text.choices["train"].format_help()
    for needle in ("--report_to TRACKERS", "--logging_dir DIR", "default: OUTPUT/logs", "--dataset FILE",
                   "--reward-funcs MODULE:FUNC[,MODULE:FUNC]", "--config FILE.yaml", "--learning_rate 1e-5"):
        assert needle in text, needle


# ----------------------------------------------------------------------------- your model, data and reward

def test_train_llm_with_your_data_and_reward_functions(in_workspace, capsys):
    out = in_workspace / "run"
    argv = ["train", "llm", "--model", "model", "--dataset", "train.jsonl", "--eval-dataset", "eval.jsonl",
            "--reward-funcs", "my_rewards:exact,my_rewards:lengthy", "--reward-weights", "1,0.5", "--output", str(out),
            "--report_to", "tensorboard", *TINY]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "training model on cpu on train.jsonl: GRPO 1 steps at learning rate 1e-06;" in printed
    assert "held-out (2 problems, 2 samples each)" in printed and "learning rate: GRPO 1e-06" in printed
    assert f"tracker logs (tensorboard): {Path('run') / 'logs'} (tensorboard --logdir {Path('run') / 'logs'})" \
        in printed
    record = json.loads((out / "results.json").read_text())
    assert record["recipe"]["reward_funcs"] == ["my_rewards:exact", "my_rewards:lengthy"]
    assert record["recipe"]["reward_weights"] == [1.0, 0.5] and record["recipe"]["sft"] is None
    assert {"rewards/exact/mean", "rewards/lengthy/std"} <= set(record["grpo_history"])
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "logs").rglob("*"))


def test_lora_on_a_pretrained_model_starts_at_ten_times_the_rate_and_sft_reads_the_answer_column(in_workspace, capsys):
    argv = ["train", "llm", "--model", "model", "--dataset", "train.jsonl", "--reward-funcs", "my_rewards:exact",
            "--output", str(in_workspace / "lora"), "--lora", "--lora-r", "2", "--sft", "sft.steps=1", *TINY]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "SFT 1 steps, then GRPO 1 steps (LoRA r=2, alpha=4) at learning rate 1e-05" in printed
    assert "no held-out set, no evaluation" in printed and "learning rate: GRPO 1e-05, SFT 2e-05" in printed


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "missing.jsonl"], "--dataset missing.jsonl: no such file"),
    (["--dataset", "data.txt"], "--dataset data.txt: minigrpo reads .jsonl, .json, .csv or .parquet files, not .txt"),
    (["--dataset", "questions.jsonl"], "--dataset questions.jsonl has no 'prompt' column; its columns are question, "
                                       "answer: name the column that holds the prompts 'prompt'"),
    (["--reward-funcs", "nowhere:exact"], "--reward-funcs: there is no module 'nowhere' to import"),
    (["--reward-funcs", "my_rewards:absent"], "--reward-funcs: my_rewards ("),
    (["--reward-funcs", "my_rewards:NOT_A_FUNCTION"], "--reward-funcs: my_rewards:NOT_A_FUNCTION is a int, not a "
                                                      "function"),
    (["--reward-funcs", "exact"], "--reward-funcs: 'exact' must be MODULE:FUNCTION"),
    (["--reward-funcs", "my_rewards:no_kwargs"], "reward function no_kwargs(prompts, completions) cannot take the "
                                                 "keyword arguments TRL passes"),
    (["--reward-funcs", "my_rewards:wants_solution"], "reward function wants_solution(prompts, completions, solution, "
                                                      "**kwargs) asks for 'solution', which is neither"),
    (["--reward-funcs", "my_rewards:exact,my_rewards:lengthy", "--reward-weights", "1"],
     "--reward-weights has 1 weights for 2 reward functions (my_rewards:exact, my_rewards:lengthy)"),
    (["--reward-funcs", "my_rewards:exact", "--sft", "--dataset", "eval.jsonl", "--recipe", "sort"],
     "give --recipe sort or --dataset eval.jsonl, not both"),
    (["--reward-funcs", "my_rewards:too_few"], "reward function 'too_few' returned 1 rewards for 4 completions: it "
                                               "must return exactly one per completion (GRPO step 1)"),
    (["--reward-funcs", "my_rewards:words"], "reward function 'words' returned str 'good' for completion 0"),
    (["--reward-funcs", "my_rewards:nan"], "reward function 'nan' returned nan for completion 0; rewards must be "
                                           "finite (return None for 'not applicable') (GRPO step 1)"),
    (["--reward-funcs", "my_rewards:crashes"], "reward function 'crashes' raised ZeroDivisionError: division by zero "
                                               "(at my_rewards.py:"),
])
def test_bad_data_and_reward_functions_are_one_sentence(in_workspace, capsys, argv, message):
    base = {"--model": "model", "--dataset": "train.jsonl", "--reward-funcs": "my_rewards:exact"}
    for i in range(0, len(argv) - 1):
        if argv[i] in base:
            base[argv[i]] = argv[i + 1]
    extra = [a for i, a in enumerate(argv) if a not in base and (i == 0 or argv[i - 1] not in base)]
    full = ["train", "llm", *[x for kv in base.items() for x in kv], *extra, "--output", str(in_workspace / "bad"),
            *TINY]
    assert main(full) == 2
    _one_line(capsys, message)


# ----------------------------------------------------------------------------- no traceback for bad input (issue 25)

@pytest.mark.parametrize("argv, message", [
    (["--recipe", "sort", "--device", "cuda"], "--device cuda: this torch ("),
    (["--recipe", "sort", "--device", "gpu"], "--device 'gpu' is not a device name: use cpu, cuda, cuda:1 or mps"),
    (["--recipe", "sort", "model_kwargs.hidden_size=-5"], "Recipe.model_kwargs['hidden_size'] must be an int >= 1, "
                                                          "got -5"),
    (["--recipe", "sort", "model_kwargs.hidden_size=30"], "Recipe.model_kwargs: hidden_size (30) must be a multiple "
                                                          "of num_heads (4)"),
    (["--recipe", "sort", "model_kwargs.width=3"], "Recipe.model_kwargs has no setting 'width'"),
    (["--recipe", "sort", "--seed", "99999999999999999999999"], "--seed must be an integer from 0 to 4294967295 "
                                                               "(2**32 - 1), got 99999999999999999999999"),
    (["--recipe", "sort", "--seed", "-1"], "--seed must be an integer from 0 to 4294967295"),
    (["--recipe", "sort", "--output", "a_file"], "--output a_file cannot be written (it is a file, not a folder)"),
    (["--recipe", "sort", "--output", "a_file/run"], "--output a_file/run cannot be written (not a directory)"),
    (["--recipe", "sort", "--output", "ok", "--report_to", "tensorboard", "--logging_dir", "a_file/logs"],
     "the tracker's logging_dir a_file/logs cannot be written (not a directory)"),
    (["--recipe", "sort", "--output", "fresh", "--resume"], "GRPOConfig.resume_from_checkpoint=True: no "
                                                            "checkpoint-<step> folder"),
    (["--recipe", "sort", "--resume"], "--resume needs --output DIR, the folder of the run to resume"),
    (["--dataset", "train.jsonl", "--reward-funcs", "my_rewards:exact"], "--dataset needs --model: a pretrained chat "
                                                                         "model, e.g. --model smollm2"),
    ([], "say what to train on: --recipe NAME (countdown, sort, addition, gsm8k), --dataset FILE, or --config "
         "FILE.yaml"),
    (["--model", "smollm2", "--recipe", "sort"], "SmolLM2-135M-Instruct has not been fetched yet: run `minigrpo "
                                                 "models fetch smollm2`"),
])
def test_bad_input_is_one_sentence_before_any_training(in_workspace, capsys, monkeypatch, argv, message):
    import minigrpo.llm.recipes as recipes

    monkeypatch.setenv("MINIGRPO_CACHE", str(in_workspace / "empty-cache"))
    monkeypatch.setattr(recipes, "train_sft", lambda *a, **k: pytest.fail("training started"))
    assert main(["train", "llm", *argv]) == 2
    _one_line(capsys, message)


def test_resume_finds_the_checkpoint_first_and_does_not_run_sft_again(in_workspace, capsys, monkeypatch):
    import minigrpo.llm.recipes as recipes

    out = in_workspace / "resumable"
    argv = ["train", "llm", "--recipe", "sort", "--smoke", "--output", str(out), "--device", "cpu", "sft.steps=2",
            "grpo.max_steps=1", "model_kwargs.hidden_size=32", "model_kwargs.num_layers=1", "task_kwargs.eval_size=2"]
    assert main(argv) == 0
    monkeypatch.setattr(recipes, "train_sft", lambda *a, **k: pytest.fail("SFT ran again"))
    capsys.readouterr()
    assert main([*argv[:-4], "grpo.max_steps=2", *argv[-3:], "--resume"]) == 0
    assert f"resuming from {Path('resumable') / 'checkpoint-1'}" in capsys.readouterr().out
    assert len(json.loads((out / "results.json").read_text())["grpo_history"]["reward"]) == 2


def test_a_diverging_run_is_one_sentence_and_exit_status_1(in_workspace, capsys, monkeypatch):
    import minigrpo.llm.recipes as recipes
    from minigrpo.infra.divergence import TrainingDiverged

    def diverge(*args, **kwargs):
        raise TrainingDiverged("the policy's logits became NaN at GRPO step 3: lower the learning rate")

    monkeypatch.setattr(recipes, "run_recipe", diverge)
    assert main(["train", "llm", "--recipe", "sort", "--output", "div", "--device", "cpu"]) == 1
    _one_line(capsys, "the policy's logits became NaN at GRPO step 3: lower the learning rate")


# ----------------------------------------------------------------------------- the real model (issue 23's command)

def test_train_the_real_model_with_your_data_and_reward(smollm2_folder, in_workspace, capsys):
    argv = ["train", "llm", "--model", "smollm2", "--dataset", "train.jsonl", "--reward-funcs", "my_rewards:exact",
            "--eval-dataset", "eval.jsonl", "--smoke", "--output", str(in_workspace / "real"), "--device", "cpu",
            "--max_steps", "1", "--num_generations", "2", "--max_completion_length", "6", "task_kwargs.eval_size=1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "training smollm2 on cpu on train.jsonl (smoke): GRPO 1 steps at learning rate 1e-06" in printed
    record = json.loads((in_workspace / "real" / "results.json").read_text())
    assert record["model"] == "smollm2" and 0 < record["grpo_history"]["completions/mean_length"][0] <= 6
    assert set(record["grpo_eval"]) >= {"pass@1", "pass@2", "greedy"}


from real_model import smollm2_folder  # noqa: E402,F401  (a session fixture)
