"""The `minigrpo` command (minigrpo_course.cli, with the library's `train` from minigrpo.cli): a fast start, clear
one-line errors, and `run` keeping what it executed."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

import minigrpo
from minigrpo_course.cli import build_parser, main
from minigrpo_course import provenance
from minigrpo_course.progress import HOME_ENV_VAR, record_grade
from minigrpo.smoke import SMOKE_ENV_VAR

ROOT = Path(__file__).resolve().parents[1]


def _numbers(folder: str) -> list[str]:
    return sorted(p.name[:2] for p in (ROOT / folder).glob("[0-9][0-9]_*.ipynb"))


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != SMOKE_ENV_VAR}
    return dict(env, **extra)


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, str(path))
    return path


# ----------------------------------------------------------------------------- start-up, version, help

def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), flags=re.M).group(1)
    assert capsys.readouterr().out.strip() == f"minigrpo {version}" == f"minigrpo {minigrpo.__version__}"


def test_the_command_line_imports_no_torch():
    """`minigrpo --help` must not pay for torch: importing the packages and building the parsers (the course's
    command and the library's) import neither torch nor numpy nor transformers (checked in a fresh interpreter)."""
    code = ("import sys, minigrpo, minigrpo.cli, minigrpo_course.cli; minigrpo.cli.build_parser(); "
            "minigrpo_course.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_lazy_names_still_import_from_the_package():
    from minigrpo import get_device, seed_everything
    from minigrpo.utils import get_device as from_utils

    assert get_device is from_utils and seed_everything(3) == 3 and get_device("cpu").type == "cpu"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        minigrpo.nope  # noqa: B018


def test_python_dash_m_minigrpo_course_runs_the_command():
    proc = subprocess.run([sys.executable, "-m", "minigrpo_course", "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: minigrpo") and "``" not in proc.stdout
    for command in ("list", "run", "grade", "make-exercises", "train", "interview"):
        assert f"    {command}" in proc.stdout


def test_python_dash_m_minigrpo_is_the_librarys_train_command():
    """The library alone: `python -m minigrpo` (and `accelerate launch -m minigrpo`) has `train`, the same command
    as the course's `minigrpo train`, and imports nothing of the course."""
    code = ("import sys, runpy; sys.argv = ['minigrpo', '--help']\ntry:\n    runpy.run_module('minigrpo', "
            "run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('minigrpo_course')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: minigrpo") and "``" not in proc.stdout
    assert "    train" in proc.stdout and "    run" not in proc.stdout and "    grade" not in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]", "the library's command imported the course"
    from minigrpo import cli as library

    def train_help(parser):
        return parser._subparsers._group_actions[0].choices["train"].format_help()

    assert train_help(library.build_parser()) == train_help(build_parser())


def test_run_help_shows_the_defaults():
    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    text = " ".join(text.split())
    assert "(default: 1800)" in text and "(default: notebooks)" in text and "runs/<notebook name>" in text


# ----------------------------------------------------------------------------- one-line errors

def test_run_of_an_unknown_lesson_lists_the_lessons(capsys):
    assert main(["run", "99"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.strip() == f"minigrpo run: no lesson 99 in notebooks/; lessons: {', '.join(_numbers('notebooks'))}"


def test_grading_a_lesson_without_an_exercise_lists_the_exercises(capsys):
    lessons, exercises = _numbers("notebooks"), _numbers("exercises")
    missing = next(n for n in lessons if n not in exercises)  # 08 today: DDPM has no exercise
    assert main(["grade", str(int(missing))]) == 2  # "8" means 08
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.strip().endswith(f"exercises: {', '.join(exercises)}") and f"no exercise {missing}" in err


# ----------------------------------------------------------------------------- list

def test_list_shows_lessons_and_this_learners_grades(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV_VAR, str(tmp_path))
    record_grade("01", 3, 4)
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    lesson_01 = next(line for line in lines if line.startswith("  01  REINFORCE"))
    assert "REINFORCE on CartPole-v1" in lesson_01 and lesson_01.endswith("exercise 01")
    lesson_08 = next(line for line in lines if line.startswith("  08  "))
    assert "DDPM" in lesson_08 and lesson_08.endswith(" -")
    exercises = lines[lines.index("exercises (exercises/; grade one with: minigrpo grade NN)") + 1:]
    graded = [line for line in exercises if line.startswith("  01  ")]
    assert len(graded) == 1 and re.search(r"graded 3/4 on \d{4}-\d\d-\d\d \d\d:\d\d$", graded[0])
    assert next(line for line in exercises if line.startswith("  02  ")).endswith("not graded yet")
    assert lines[-1] == f"your grades are kept in {tmp_path / 'grades.json'}"


# ----------------------------------------------------------------------------- run (no kernel)

class FakeClient:
    """Stands in for nbclient.NotebookClient: 'executes' each code cell by recording the smoke switch."""

    def __init__(self, nb, **kwargs):
        self.nb, self.km = nb, None
        self.on_notebook_start = self.on_cell_start = None

    def execute(self):
        self.on_notebook_start(notebook=self.nb)
        for i, cell in enumerate(self.nb.cells):
            self.on_cell_start(cell=cell, cell_index=i)
            seen = os.environ.get(SMOKE_ENV_VAR, "unset")
            if cell.source == provenance.PROBE:   # the kernel's answer: which package modules it imported
                seen = json.dumps(["minigrpo", "minigrpo.smoke"])
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=seen)]
        return self.nb


def _course(tmp_path: Path) -> Path:
    for folder in ("notebooks", "solutions", "exercises"):
        (tmp_path / folder).mkdir()
    return _notebook(tmp_path / "notebooks" / "01_tiny.ipynb", "x = 1")


@pytest.mark.parametrize("flag,env,mode", [
    ([], None, "in full mode"),
    ([], "1", f"in smoke mode ({SMOKE_ENV_VAR}=1 in the environment)"),
    ([], "0", "in full mode"),
    (["--smoke"], None, "in smoke mode (--smoke)"),
])
def test_run_reports_the_real_mode_and_writes_to_runs_by_default(capsys, tmp_path, monkeypatch, flag, env, mode):
    import nbclient

    source = _course(tmp_path)
    before = source.read_text()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(nbclient, "NotebookClient", FakeClient)
    if env is None:
        monkeypatch.delenv(SMOKE_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(SMOKE_ENV_VAR, env)
    assert main(["run", "1", *flag]) == 0
    out = capsys.readouterr().out
    assert mode in out and out.splitlines()[0].endswith("writing runs/01_tiny.ipynb")
    assert out.splitlines()[-1].endswith("wrote runs/01_tiny.ipynb")
    assert source.read_text() == before, "the course notebook stays as it was"
    saved = nbformat.read(tmp_path / "runs" / "01_tiny.ipynb", as_version=4)
    smoke_seen_by_cells = saved.cells[0].outputs[0].text
    assert smoke_seen_by_cells == ("1" if flag else env or "unset")


def test_run_in_place_and_a_bad_timeout(capsys, tmp_path, monkeypatch):
    import nbclient

    source = _course(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(nbclient, "NotebookClient", FakeClient)
    assert main(["run", "01", "--timeout", "0"]) == 2
    assert "--timeout must be a positive number of seconds, got 0" in capsys.readouterr().err
    assert main(["run", "01", "--in-place"]) == 0
    assert nbformat.read(source, as_version=4).cells[0].outputs, "--in-place writes the source"
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- run (a real kernel)

def test_a_failing_cell_saves_the_run_so_far_and_exits_1(tmp_path):
    source = _notebook(tmp_path / "tiny.ipynb", f"import os; print(os.environ['{SMOKE_ENV_VAR}'])",
                       "raise ValueError('boom')", "print('never')")
    stale = nbformat.read(source, as_version=4)
    stale.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="old output\n")]
    nbformat.write(stale, str(source))
    out = tmp_path / "sub" / "run.ipynb"
    proc = subprocess.run([sys.executable, "-m", "minigrpo_course", "run", str(source), "--output", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, env=_env(**{SMOKE_ENV_VAR: "1"}),
                          timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"in smoke mode ({SMOKE_ENV_VAR}=1 in the environment)" in proc.stdout
    ours = [line for line in proc.stderr.splitlines() if line.startswith("minigrpo run:")]
    assert ours == ["minigrpo run: cell 2 of 3 (In [2]) failed: ValueError: boom; "
                    "saved the run so far to sub/run.ipynb"]
    assert "Traceback" not in proc.stdout
    nb = nbformat.read(out, as_version=4)
    assert [o.text for o in nb.cells[0].outputs] == ["1\n"]
    assert [(o.output_type, o.ename, o.evalue) for o in nb.cells[1].outputs] == [("error", "ValueError", "boom")]
    assert nb.cells[2].outputs == [] and nb.cells[2].execution_count is None, "no stale output after the stop"
    assert nbformat.read(source, as_version=4).cells[1].outputs == [], "the source notebook is untouched"


@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT")
def test_ctrl_c_saves_the_run_so_far_and_exits_130(tmp_path):
    marker = tmp_path / "started"
    source = _notebook(tmp_path / "slow.ipynb",
                       f"import pathlib, time\nprint('started', flush=True)\npathlib.Path({str(marker)!r}).touch()\n"
                       "time.sleep(120)",
                       "print('never')")
    out = tmp_path / "run.ipynb"
    proc = subprocess.Popen([sys.executable, "-m", "minigrpo_course", "run", str(source), "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=_env())
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the first cell never started"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stdout + stderr
    assert "in full mode" in stdout
    ours = [line for line in stderr.splitlines() if line.startswith("minigrpo run:")]
    assert ours == ["minigrpo run: interrupted at cell 1 of 2 (In [1]); saved the run so far to run.ipynb"]
    nb = nbformat.read(out, as_version=4)
    outputs = nb.cells[0].outputs
    assert outputs[0].text == "started\n" and outputs[-1].output_type == "error"
    assert outputs[-1].ename == "KeyboardInterrupt" and nb.cells[1].outputs == []


def test_run_writes_json_that_nbformat_validates(tmp_path, monkeypatch, capsys):
    """The saved notebook (partial or not) is a valid notebook with the repository's 1-space indent."""
    import nbclient

    source = _course(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(nbclient, "NotebookClient", FakeClient)
    assert main(["run", str(source), "--output", "elsewhere.ipynb"]) == 0
    text = (tmp_path / "elsewhere.ipynb").read_text()
    nbformat.validate(nbformat.reads(text, as_version=4))
    assert text.startswith('{\n "cells": [') and json.loads(text)["nbformat"] == 4


# ----------------------------------------------------------------------------- make-exercises, course extra

def _mini_course(root: Path) -> tuple[Path, Path]:
    """A course with one solution notebook; returns (solution, exercise) paths."""
    (root / "solutions").mkdir()
    (root / "exercises").mkdir()
    solution = _notebook(root / "solutions" / "01_demo.ipynb",
                         "# EXERCISE 01.1\ndef f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION")
    return solution, root / "exercises" / "01_demo.ipynb"


def test_make_exercises_keeps_a_learners_answers_unless_forced(tmp_path):
    from minigrpo_course.grading.notebooks import sync_exercises

    solution, exercise = _mini_course(tmp_path)
    changed, kept = sync_exercises(tmp_path)
    assert changed == [exercise] and kept == [] and "raise NotImplementedError" in exercise.read_text()
    # the learner answers; then the maintainer's solution changes
    nb = nbformat.read(str(exercise), as_version=4)
    nb.cells[0].source = "# EXERCISE 01.1\ndef f(x):\n    return x + x"
    nbformat.write(nb, str(exercise))
    nb = nbformat.read(str(solution), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("print(f(2))"))
    nbformat.write(nb, str(solution))
    assert sync_exercises(tmp_path, check=True) == ([exercise], [])
    assert sync_exercises(tmp_path) == ([], [exercise])
    assert "return x + x" in exercise.read_text()  # kept
    assert sync_exercises(tmp_path, force=True) == ([exercise], [])
    assert "return x + x" not in exercise.read_text()


def test_a_library_only_install_gets_one_line_for_course_commands(monkeypatch, capsys):
    """Without the `course` extra (no nbformat), run/grade/make-exercises say what to install."""
    monkeypatch.setitem(sys.modules, "nbformat", None)  # `import nbformat` now raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "minigrpo_course.grading.notebooks", raising=False)  # imported again, anew
    assert main(["make-exercises", "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nbformat" in err and "pip install -e '.[course]'" in err


# ----------------------------------------------------------------------------- train llm

def test_train_llm_recipes_listed_without_torch_are_the_recipes():
    from minigrpo.cli import LLM_RECIPES
    from minigrpo.llm.recipes import RECIPES

    assert set(LLM_RECIPES) == set(RECIPES)
    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "--recipe NAME" in text and "gsm8k" in text and "FIELD=VALUE" in text


def test_train_llm_on_a_saved_model_writes_a_checkpoint_and_results(tmp_path, monkeypatch, capsys):
    """The whole command on a tiny model saved to a folder: smoke recipe, overrides after the options too."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the gsm8k loader must not look for the hub
    import torch

    from minigrpo.llm.gsm8k import ALPHABET
    from minigrpo.llm.models import load_causal_lm, make_tiny_model
    from minigrpo.llm.tokenizer import build_char_tokenizer

    torch.set_num_threads(1)
    tok = build_char_tokenizer(ALPHABET)
    make_tiny_model(tok, "qwen2", seed=0, hidden_size=32, num_layers=1, max_positions=256).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    out = tmp_path / "run"
    argv = ["train", "llm", "--recipe", "gsm8k", "--model", str(tmp_path / "m"), "--smoke", "--output", str(out),
            "--device", "cpu", "sft.steps=2", "grpo.max_steps=1", "task_kwargs.max_completion_length=12"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"training {tmp_path / 'm'} on cpu with the gsm8k recipe (smoke): SFT 2 steps, then GRPO 1 steps" in printed
    assert "held-out (4 problems, 4 samples each)" in printed and "checkpoint-1" in printed
    record = json.loads((out / "results.json").read_text())
    assert record["recipe"]["grpo"]["max_steps"] == 1 and record["model"] == str(tmp_path / "m")
    assert set(record["grpo_eval"]) >= {"pass@1", "pass@4", "format"} and len(record["grpo_history"]["reward"]) == 1
    assert "rewards/correctness_reward/mean" in record["grpo_history"]
    model, _ = load_causal_lm(str(out / "checkpoint-1"))
    assert model.config.hidden_size == 32


def test_train_llm_lora_trains_and_saves_only_the_adapters(tmp_path, monkeypatch, capsys):
    """``--lora``: GRPO wraps the model with adapters of the rank and scale asked, on every linear layer; the
    checkpoint holds the adapters (no full weights), and results.json records them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    out = tmp_path / "run"
    argv = ["train", "llm", "--recipe", "sort", "--smoke", "--output", str(out), "--device", "cpu", "--lora",
            "--lora-r", "4", "sft.steps=1", "grpo.max_steps=1", "model_kwargs.hidden_size=32", "model_kwargs.num_layers=1"]
    assert main(argv) == 0
    assert "GRPO 1 steps (LoRA r=4, alpha=8)" in capsys.readouterr().out
    saved = out / "checkpoint-1"
    adapter = json.loads((saved / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], adapter["lora_dropout"]) == (4, 8, 0.0)
    linear = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # lm_head: never
    assert {name.rsplit(".", 1)[-1] for name in adapter["target_modules"]} == linear
    assert not (saved / "model.safetensors").exists()
    assert json.loads((out / "results.json").read_text())["lora"] == {"r": 4, "alpha": 8, "target_modules": "all-linear"}


@pytest.mark.parametrize("argv, message", [
    (["--recipe", "gsm9k"], "minigrpo train: no recipe 'gsm9k' (did you mean gsm8k?); recipes: countdown, sort, "
                            "addition, gsm8k"),
    (["--recipe", "sort", "grpo.max_step=3"], "minigrpo train: unknown field 'grpo.max_step'; close matches: "
                                              "grpo.max_steps"),
    (["--recipe", "sort", "learning_rate=1e-4"], "minigrpo train: learning_rate is ambiguous: write "
                                                 "sft.learning_rate or grpo.learning_rate"),
    (["--recipe", "sort", "max_steps=ten"], "minigrpo train: grpo.max_steps: cannot read 'ten' as an int"),
    (["--recipe", "sort", "grpo.num_generations=1"], "minigrpo train: GRPOConfig.num_generations must be >= 2, got 1"),
    (["--recipe", "sort", "steps"], "minigrpo train: override 'steps' must be field=value, e.g. grpo.max_steps=10"),
    (["--recipe", "sort", "--device", "cpu", "--model", "MISSING"], "minigrpo train: no model folder at MISSING"),
    (["--recipe", "sort", "--device", "cpu", "--model", "EMPTY"], "minigrpo train: cannot load a model from 'EMPTY'"),
    (["--recipe", "sort", "--lora-r", "8"], "minigrpo train: --lora-r and --lora-alpha need --lora"),
    (["--recipe", "sort", "--lora", "--lora-r", "0"], "minigrpo train: --lora-r must be > 0, got 0"),
    (["--recipe", "sort", "--lora", "--lora-alpha", "-2"], "minigrpo train: --lora-alpha must be > 0, got -2"),
])
def test_train_llm_errors_are_one_line(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty").mkdir()
    folders = {"MISSING": str(tmp_path / "missing"), "EMPTY": str(tmp_path / "empty")}
    argv, message = [folders.get(a, a) for a in argv], message.replace("MISSING", folders["MISSING"])
    message = message.replace("EMPTY", folders["EMPTY"])
    assert main(["train", "llm", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err


def test_recipe_overrides_are_read_by_the_fields_types():
    from minigrpo.llm.recipes import RECIPES, apply_overrides, resolve_recipe

    r = apply_overrides(RECIPES["sort"], ["beta=0.04", "grpo.epsilon_high=none", "sft.steps=7", "arch=qwen2",
                                          "filter_zero_std_groups=false", "report_to=none", "grpo.output_dir=out/x",
                                          "task_kwargs.max_len=6", 'model_kwargs={"hidden_size": 32}'])
    assert (r.grpo.beta, r.grpo.epsilon_high, r.sft.steps, r.arch) == (0.04, None, 7, "qwen2")
    assert r.grpo.filter_zero_std_groups is False and str(r.grpo.output_dir) == "out/x"
    assert r.task_kwargs == {"max_len": 6} and r.model_kwargs == {"hidden_size": 32}
    assert apply_overrides(r, ["sft=none"]).sft is None
    assert apply_overrides(r, ["resume_from_checkpoint=true"]).grpo.resume_from_checkpoint is True
    smoke = resolve_recipe("gsm8k", smoke=True, overrides=["grpo.num_generations=2"])
    assert smoke.grpo.max_steps == 4 and smoke.task_kwargs["eval_size"] == 4 and smoke.grpo.num_generations == 2
    assert RECIPES["gsm8k"].grpo.num_generations == 8  # the registry is left as it was


def test_train_llm_gsm8k_on_a_qwen_shaped_chat_model(tmp_path, monkeypatch, capsys):
    """A hub-shaped model (byte-level BPE, no BOS, ChatML template): the gsm8k prompts become conversations with
    the system prompt, and SFT, GRPO and evaluation run on them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch

    from minigrpo.llm import gsm8k
    from minigrpo.llm.models import build_qwen_like
    from minigrpo.llm.recipes import build_task, resolve_recipe
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    rows = gsm8k.generated_split("test")[:300]
    corpus = [gsm8k.SYSTEM_PROMPT] + [r["question"] for r in rows] + [gsm8k.sft_target(r["answer"]) for r in rows]
    folder = build_qwen_like(tmp_path / "qwen", corpus=corpus, vocab_size=400, hidden_size=32, num_layers=1,
                             max_positions=512)
    task = build_task(resolve_recipe("gsm8k", smoke=True), AutoTokenizer.from_pretrained(folder))
    assert task.train_set[0].prompt[0] == {"role": "system", "content": gsm8k.SYSTEM_PROMPT}
    argv = ["train", "llm", "--recipe", "gsm8k", "--model", str(folder), "--smoke", "--output", str(tmp_path / "run"),
            "--device", "cpu", "sft.steps=2", "grpo.max_steps=1", "task_kwargs.max_completion_length=12"]
    assert main(argv) == 0
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["grpo_history"]["completions/mean_length"][0] > 0 and "pass@1" in record["grpo_eval"]


def test_run_records_the_modules_the_kernel_imported_and_removes_its_probe(tmp_path, monkeypatch):
    """The saved notebook has the source's cells only, and metadata naming the mode and the imported modules'
    fingerprints as they were when the run started."""
    import nbclient

    source = _course(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(nbclient, "NotebookClient", FakeClient)
    monkeypatch.delenv(SMOKE_ENV_VAR, raising=False)
    assert main(["run", str(source), "--output", "out.ipynb"]) == 0
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert [c.source for c in nb.cells] == [c.source for c in nbformat.read(source, as_version=4).cells]
    before = provenance.package_fingerprints()
    assert nb.metadata["minigrpo"] == {"mode": "full", "code": {m: before[m] for m in ("minigrpo", "minigrpo.smoke")}}
    assert main(["run", str(source), "--output", "smoke.ipynb", "--smoke"]) == 0
    assert nbformat.read(tmp_path / "smoke.ipynb", as_version=4).metadata["minigrpo"]["mode"] == "smoke"


def test_run_gives_the_kernel_72_dpi_figures(tmp_path, monkeypatch):
    """Committed figures are drawn at 72 dpi (the kernel inherits MATPLOTLIBRC), which keeps notebooks small."""
    import matplotlib
    import nbclient

    source = _course(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(nbclient, "NotebookClient", FakeClient)
    monkeypatch.setenv("MATPLOTLIBRC", "unset at teardown")  # so that what the run sets does not outlive the test
    monkeypatch.delenv("MATPLOTLIBRC")
    assert main(["run", str(source), "--output", "out.ipynb"]) == 0
    rc = matplotlib.rc_params_from_file(os.environ["MATPLOTLIBRC"], use_default_template=False)
    assert rc["figure.dpi"] == 72
