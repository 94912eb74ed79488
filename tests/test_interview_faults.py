"""Nothing a learner types into ``minigrpo interview`` is lost, and nothing ends in a traceback: two terminals at
once, a read-only home, a closed terminal or a killed process in a mock round, a progress file with times
without a timezone or fields it cannot understand, paths that cannot be written.

The faults are real where they can be: real processes, a real pseudo-terminal that is closed, real signals."""

import io
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from minigrpo_course.cli import main
from minigrpo_course.interview import Progress, by_topic, get
from minigrpo_course.interview.schedule import WAITS, next_box

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
POSIX = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and pseudo-terminals")


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)


def _cli(capsys, *argv):
    rc = main(["interview", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


class Terminal:
    """``minigrpo interview ...`` in a subprocess, typed into through a pipe; its output read as it comes."""

    def __init__(self, *argv: str, cwd: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "minigrpo_course", "interview", *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=cwd, env=_env())
        self.out, self.seen = "", 0
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in iter(lambda: self.proc.stdout.read(1), ""):
            self._lines.put(line)

    def expect(self, text: str, timeout: float = 120) -> None:
        """Wait until ``text`` appears in the output after what was expected last."""
        deadline = time.monotonic() + timeout
        while text not in self.out[self.seen:]:
            try:
                self.out += self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{text!r} never came; the output ends with {self.out[-400:]!r}") from None
        self.seen = self.out.index(text, self.seen) + len(text)

    def type(self, text: str) -> None:
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=timeout)
        return rc, self.proc.stderr.read()


def _wait_for(path: Path, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text(encoding="utf-8") if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"{path} never held {text!r}")


# ----------------------------------------------------------------------------- two terminals at once

def test_two_terminals_practising_at_once_keep_every_attempt(tmp_path):
    """Both sessions read the (empty) progress file at start, then answer in turn: A, B, A, B. Each save merges
    under the lock, so all four attempts survive (before, each save wrote its own copy: B's first save wiped
    A's first attempt, and so on)."""
    pf = tmp_path / "p.json"
    a, b = (Terminal("--topic", "attention", "--count", "2", "--progress-file", str(pf), cwd=tmp_path)
            for _ in range(2))
    first, second = (q.id for q in by_topic("attention")[:2])
    for t in (a, b):
        t.expect("Your answer (finish with an empty line):")   # both have read the file
    for t, ticks in ((a, "all"), (b, "none"), (a, "1"), (b, "all")):
        t.type(f"an answer\n\n{ticks}\n")
        t.expect("points: box")
    for t in (a, b):
        rc, err = t.finish()
        assert rc == 0 and err == "", err
    saved = json.loads(pf.read_text())["questions"]
    assert sorted(saved) == sorted([first, second])
    assert [h["rating"] for h in saved[first]["history"]] == [3, 0], "A's attempt, then B's, in time order"
    assert len(saved[second]["history"]) == 2 and saved[second]["history"][-1]["rating"] == 3
    # the box is the replay of both attempts: all covered (box 2), then nothing covered (box 0)
    assert saved[first]["box"] == next_box(next_box(0, 3), 0) == 0


def test_a_save_merges_with_what_another_process_recorded_since(tmp_path):
    path = tmp_path / "p.json"
    seed = Progress(path)
    seed.record("gae", 2, now=T0)
    seed.save()
    one, two = Progress(path), Progress(path)        # two terminals, both at box 1
    one.record("gae", 3, now=T0 + timedelta(days=1))
    one.save()
    two.record("gae", 2, now=T0 + timedelta(days=2))
    two.record("gqa", 0, now=T0 + timedelta(days=2))
    two.save()
    card = Progress(path).card("gae")
    assert [h["rating"] for h in card.history] == [2, 3, 2]
    assert card.box == next_box(next_box(next_box(0, 2), 3), 2) == 4
    assert card.due == T0 + timedelta(days=2) + WAITS[4]
    assert Progress(path).card("gqa").box == 0
    assert two.card("gae").box == 4, "the saving process now sees the merged state"


def test_a_save_with_nothing_new_leaves_the_file_as_it_is(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"version": 2, "questions": {}}')
    Progress(path).save()
    assert path.read_text() == '{"version": 2, "questions": {}}'


# ----------------------------------------------------------------------------- what is in the file

def _card(**fields) -> dict:
    card = {"box": 1, "due": "2026-01-02T12:00:00+00:00",
            "history": [{"at": "2026-01-01T12:00:00+00:00", "rating": 2}]}
    card.update(fields)
    return {"version": 2, "questions": {"gae": card}}


def test_times_without_a_timezone_are_read_as_utc_and_said_once(capsys, tmp_path):
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(_card(due="2026-01-02T12:00:00",
                                   history=[{"at": "2026-01-01T12:00:00", "rating": 2}])))
    before = pf.read_text()
    rc, out, err = _cli(capsys, "--list", "--progress-file", str(pf))
    assert rc == 0 and "gae" in out
    assert err.count("\n") == 1 and "2 time(s) without a timezone (the first: questions.gae.history[0].at)" in err
    assert "read as UTC" in err and pf.read_text() == before, "listing changes nothing"
    assert Progress(pf).card("gae").due == datetime(2026, 1, 2, 12, tzinfo=timezone.utc)
    rc, out, err = _cli(capsys, "--id", "gqa", "--rating", "2", "--progress-file", str(pf))
    assert rc == 0 and "without a timezone" in err
    saved = json.loads(pf.read_text())["questions"]
    assert saved["gae"]["due"] == "2026-01-02T12:00:00+00:00" and saved["gae"]["history"][0]["rating"] == 2
    assert "gqa" in saved


@pytest.mark.parametrize("card,field", [
    (_card(history=[{"at": "2026-01-01T12:00:00+00:00", "rating": 2, "covered": 5, "missed": []}]),
     "questions.gae.history[0].covered must be a list of checklist-item keys (strings), got 5"),
    (_card(history=[{"at": "2026-01-01T12:00:00+00:00", "rating": 2, "covered": []}]),
     "questions.gae.history[0] has covered without missed"),
    (_card(history=[{"at": "2026-01-01T12:00:00+00:00"}]), "questions.gae.history[0] lacks rating"),
    (_card(history=[{"at": "yesterday", "rating": 1}]), "questions.gae.history[0].at must be an ISO date and time"),
    (_card(history={"at": "x"}), "questions.gae.history must be a list of attempts"),
    (_card(due="tomorrow"), "questions.gae.due must be an ISO date and time"),
    (_card(due=20260102), "questions.gae.due must be an ISO date and time"),
    (_card(box="2"), "questions.gae.box must be an integer from 0 to 5, got '2'"),
    (_card(box=9), "questions.gae.box must be an integer from 0 to 5, got 9"),
    ({"version": 2, "questions": {"gae": [1, 2]}}, "questions.gae must be an object"),
])
def test_a_field_that_cannot_be_understood_is_named_and_the_file_kept(capsys, tmp_path, card, field):
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(card))
    before = pf.read_text()
    for argv in (["--stats"], ["--id", "gae", "--answer", "A = Q - V", "--covered", "1"]):
        rc, out, err = _cli(capsys, *argv, "--progress-file", str(pf))
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in out + err
        assert f"{pf} does not hold interview attempts in the expected format ({field}" in err
        assert err.strip().endswith("nothing is written to it until then (or choose another file with "
                                    "--progress-file)")
        assert pf.read_text() == before, "the learner's file is never overwritten"


def test_a_file_that_went_bad_during_a_session_is_not_overwritten(capsys, tmp_path, monkeypatch):
    """The session read a good file; another program broke it before the first save: the attempt is kept in a
    file of its own, the broken file stays as it is."""
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(_card()))

    class BreakTheFileFirst(io.StringIO):
        def readline(self, *args):
            line = super().readline(*args)
            if line == "all\n":
                pf.write_text("{broken")
            return line

    monkeypatch.setattr(sys, "stdin", BreakTheFileFirst("my answer about GQA\n\nall\n"))
    rc, out, err = _cli(capsys, "--id", "gqa", "--progress-file", str(pf))
    assert rc == 1 and pf.read_text() == "{broken" and err.count("\n") == 1
    assert err.startswith(f"minigrpo interview: your attempt was not saved: {pf} is not valid JSON (Expecting")
    assert "nothing is written to it until then; your answer was kept in " in err
    kept = Path(err.split("your answer was kept in ")[1].split(";")[0])
    assert "my answer about GQA" in kept.read_text() and "minigrpo interview --id gqa --covered" in kept.read_text()
    kept.unlink()


# ----------------------------------------------------------------------------- a home that cannot be written

def test_a_read_only_home_is_one_sentence_and_the_answer_is_kept(capsys, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("MINIGRPO_HOME", str(tmp_path / "afile" / "home"))
    monkeypatch.delenv("MINIGRPO_INTERVIEW_PROGRESS", raising=False)
    rc, out, err = main(["interview", "--id", "gae", "--answer", "A = Q - V", "--covered", "1,2"]), *capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and out == "", "refused before anything is shown or recorded"
    assert "cannot write the progress file" in err and "a file stands where a folder of that path should be" in err
    kept = Path(err.strip().split("your answer was kept in ")[1])
    assert "A = Q - V" in kept.read_text()
    kept.unlink()
    # an interactive session is refused before the first question, so nothing is typed in vain
    monkeypatch.setattr(sys, "stdin", io.StringIO("never read\n"))
    rc = main(["interview"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "nothing was recorded" in err and err.count("\n") == 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_home_folder(capsys, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    monkeypatch.setenv("MINIGRPO_HOME", str(home))
    monkeypatch.delenv("MINIGRPO_INTERVIEW_PROGRESS", raising=False)
    try:
        rc = main(["interview", "--id", "gae", "--rating", "2"])
        err = capsys.readouterr().err
        assert rc == 2 and "Permission denied" in err and err.count("\n") == 1
    finally:
        home.chmod(0o755)


def test_a_save_that_fails_mid_session_keeps_the_typed_answer(capsys, tmp_path, monkeypatch):
    """The folder turns read-only after the session started (every replace is refused): one sentence, exit 1,
    the typed answer in a file of its own with the command that records it again."""
    import minigrpo_course.state as state

    pf = tmp_path / "p.json"

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(sys, "stdin", io.StringIO("the first line of my answer\nand the second\n\n1 3\n"))
    monkeypatch.setattr(state.os, "replace", refuse)
    rc, out, err = _cli(capsys, "--id", "gqa", "--progress-file", str(pf))
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"minigrpo interview: could not save your interview attempts to {pf} (Permission denied); "
                          "your answer was kept in ")
    assert err.strip().endswith("record it later with: minigrpo interview --id gqa --covered 1,3")
    kept = Path(err.split("your answer was kept in ")[1].split(";")[0])
    assert "the first line of my answer\nand the second" in kept.read_text()
    assert not pf.exists()
    kept.unlink()


@pytest.mark.parametrize("flag,message", [
    ("--progress-file", "cannot write the progress file"),
    ("--transcript", "cannot write the transcript"),
])
def test_a_mock_round_with_an_unwritable_path_is_refused_before_the_brief(capsys, tmp_path, monkeypatch, flag,
                                                                          message):
    (tmp_path / "afile").write_text("x")
    paths = {"--progress-file": str(tmp_path / "p.json"), "--transcript": str(tmp_path / "t.md")}
    paths[flag] = str(tmp_path / "afile" / "x")
    monkeypatch.setattr(sys, "stdin", io.StringIO("never read\n"))
    rc, out, err = _cli(capsys, "--mock", "debugging", *(x for kv in paths.items() for x in kv))
    assert rc == 2 and out == "" and err.count("\n") == 1 and message in err


@pytest.mark.parametrize("where,message", [
    ("afile/drill.py", "cannot write the drill file"),
    (".", "is a folder; give a file name"),
])
def test_a_coding_drill_file_that_cannot_be_written_is_refused(capsys, tmp_path, monkeypatch, where, message):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    for extra in ([], ["--check"]):
        if where.startswith("afile") and extra:
            continue  # --check reads: a missing file has its own message
        rc, out, err = _cli(capsys, "--code", "grpo-loss", "--file", str(tmp_path / where), *extra)
        assert rc == 2 and out == "" and err.count("\n") == 1 and message in err


def test_a_mock_round_goes_on_when_progress_cannot_be_saved(capsys, tmp_path, monkeypatch):
    """The progress file becomes unwritable during the round: one line, the round goes on, every answer is in
    the transcript, exit status 1."""
    import minigrpo_course.state as state

    def refuse(path, data, what="data"):  # the progress file's folder is full; the transcript's is not
        raise state.UnwritableStateFile(path, f"could not save your {what} to {path} (No space left on device)")

    monkeypatch.setattr(state, "write_json", refuse)
    monkeypatch.setattr(sys, "stdin", io.StringIO("what reward?\n\nall\nsample, score, advance, step\n\nq\n"))
    transcript = tmp_path / "t.md"
    rc, out, err = _cli(capsys, "--mock", "debugging", "--transcript", str(transcript), "--progress-file",
                        str(tmp_path / "p.json"))
    assert rc == 1 and err.count("\n") == 1 and "(No space left on device); the round goes on" in err
    assert "could not save your interview attempts to" in err
    text = transcript.read_text()
    assert "> what reward?" in text and "> sample, score, advance, step" in text
    assert not (tmp_path / "p.json").exists()


# ----------------------------------------------------------------------------- a mock round killed mid-answer

def _start_round(tmp_path: Path):
    transcript, pf = tmp_path / "t.md", tmp_path / "p.json"
    t = Terminal("--mock", "debugging", "--transcript", str(transcript), "--progress-file", str(pf), cwd=tmp_path)
    t.expect("Your answer (finish with an empty line):")
    t.type("is the reward outcome or process?\nhow many epochs per batch?\n\n")
    t.expect("Which points did your answer cover?")
    t.type("1 2\n")
    t.expect("Your answer (finish with an empty line):")
    t.type("prompts, then G completions each,\nthen group advantages\n")   # no empty line yet: still typing
    _wait_for(transcript, "> then group advantages")
    return t, transcript, pf


def _typed_so_far_is_in(text: str) -> None:
    assert "> is the reward outcome or process?\n> how many epochs per batch?" in text
    assert "(2/6 asked)" in text
    assert "**You (still typing when the round ended):**" in text
    assert "> prompts, then G completions each,\n> then group advantages" in text
    assert text.index("## Part 1:") < text.index("> prompts, then G completions"), "the answer under its question"


@POSIX
def test_kill_9_in_a_mock_round_loses_no_typed_line(tmp_path):
    t, transcript, pf = _start_round(tmp_path)
    t.proc.kill()
    assert t.proc.wait(timeout=60) == -signal.SIGKILL
    _typed_so_far_is_in(transcript.read_text())
    assert "clarifying-questions" in json.loads(pf.read_text())["questions"], "the scored part is in the progress"


@POSIX
def test_sigterm_in_a_mock_round_saves_and_ends_with_one_line(tmp_path):
    t, transcript, pf = _start_round(tmp_path)
    t.proc.send_signal(signal.SIGTERM)
    rc = t.proc.wait(timeout=60)
    err = t.proc.stderr.read()
    assert rc == 128 + signal.SIGTERM, err
    text = transcript.read_text()
    _typed_so_far_is_in(text)
    assert text.rstrip().endswith("*The round ended here: asked to stop (SIGTERM).*")
    assert err.strip() == f"minigrpo interview: stopped by SIGTERM (asked to stop); your progress is saved in {pf}"


@POSIX
def test_closing_the_terminal_in_a_mock_round_saves_what_was_typed(tmp_path):
    """A real pseudo-terminal, as a terminal window gives: closing it sends SIGHUP to the round."""
    import pty

    transcript, pf = tmp_path / "t.md", tmp_path / "p.json"
    argv = [sys.executable, "-m", "minigrpo_course", "interview", "--mock", "debugging", "--transcript",
            str(transcript), "--progress-file", str(pf)]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        os.chdir(tmp_path)
        os.execve(sys.executable, argv, _env())
    seen, stop = [], threading.Event()

    def drain():  # keep reading what the round prints (a full terminal buffer would block it)
        while not stop.is_set():
            if select.select([fd], [], [], 0.05)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    return
                if not chunk:
                    return
                seen.append(chunk.decode(errors="replace"))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()

    def wait_output(text, timeout=120):
        deadline = time.monotonic() + timeout
        while text not in "".join(seen):
            assert time.monotonic() < deadline, f"{text!r} never came: {''.join(seen)[-300:]!r}"
            time.sleep(0.05)

    try:
        wait_output("Your answer (finish with an empty line):")
        os.write(fd, b"is the reward outcome or process?\nhow many epochs per batch?\n\n")
        wait_output("Which points did your answer cover?")
        os.write(fd, b"1 2\n")
        _wait_for(transcript, "(2/6 asked)")
        os.write(fd, b"prompts, then G completions each,\nthen group advantages\n")
        _wait_for(transcript, "> then group advantages")
    finally:
        stop.set()
        reader.join()  # no read in flight, or the close below would not hang the terminal up
        os.close(fd)   # the terminal window closes
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGHUP
    text = transcript.read_text()
    _typed_so_far_is_in(text)
    assert text.rstrip().endswith("*The round ended here: the terminal was closed (SIGHUP).*")
    assert "clarifying-questions" in json.loads(pf.read_text())["questions"]
