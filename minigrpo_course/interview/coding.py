"""Blank-page coding drills against the clock: ``minigrpo interview --code NAME``.

The drill writes a file that holds only the task, as comments, and the time you started; you write
the function from nothing in your editor, then run the hidden tests (``--check``). The verdict names
the first failing case, its input, what was expected and what came back, and a hint when your result
matches a typical mistake; it also says how long you took against the drill's time.

The hidden tests are the grader's own (``minigrpo_course.grading``: the GRPO loss, the completion token
log-probs, truncated-IS weights, the diffusion step log-prob), all cases including the ones an
exercise's check cell does not show. For GQA decoding and causal linear attention, which have no
exercise, the cases below use the same grading engine with the package's implementations
(``minigrpo.attention``) as the reference. Each drill and its reference answer is a Markdown file,
``minigrpo_course/interview/questions/code_*.md``.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import TextIO

from minigrpo_course.interview.bank import BankFormatError, _blocks, _front_matter, _split_headings
from minigrpo_course.interview.terminal import readline
from minigrpo_course.state import atomic_write_text, check_writable

CODE_DIR = "questions"  #: ``code_*.md`` inside the package ``minigrpo_course.interview``
_STARTED = re.compile(r"^# started: (\S+)$", re.M)


@dataclass(frozen=True)
class CodeDrill:
    id: str
    title: str
    function: str
    grader: str  #: an exercise number ("06") whose item of the same function is reused, or "interview"
    minutes: float
    task: str
    reference: str  #: the reference answer's source code

    def item(self):
        """The grading item: its cases are the hidden tests."""
        if self.grader == "interview":
            return _own_items()[self.function]
        from minigrpo_course.grading import items

        found = [i for i in items(self.grader) if i.function == self.function]
        if len(found) != 1:
            raise ValueError(f"exercise {self.grader} has no graded function {self.function!r}")
        return found[0]


def parse_code_drill(text: str, name: str = "<text>") -> CodeDrill:
    try:
        meta, body = _front_matter(text)
        for key in ("drill", "title", "function", "grader", "minutes"):
            if not meta.get(key):
                raise ValueError(f"the front matter needs '{key}: …'")
        _, sections = _split_headings(body, "## ")
        found = dict(sections)
        if set(found) != {"Task", "Reference answer"}:
            raise ValueError(f"expected the sections '## Task' and '## Reference answer', got {sorted(found)}")
        code = re.search(r"^```python\n(.*?)^```", "\n".join(found["Reference answer"]), re.M | re.S)
        if not code:
            raise ValueError("'## Reference answer' needs a ```python code block")
        if f"def {meta['function']}(" not in code.group(1):
            raise ValueError(f"the reference answer does not define {meta['function']}()")
        task = "\n".join(found["Task"]).strip("\n")
        if not _blocks(found["Task"]):
            raise ValueError("'## Task' is empty")
        return CodeDrill(meta["drill"], meta["title"], meta["function"], meta["grader"], float(meta["minutes"]),
                         task, code.group(1))
    except ValueError as exc:
        raise BankFormatError(f"{name}: {exc}") from None


def load_code_drills() -> dict[str, CodeDrill]:
    folder = resources.files("minigrpo_course.interview").joinpath(CODE_DIR)
    drills = {}
    for f in sorted(folder.iterdir(), key=lambda f: f.name):
        if f.name.startswith("code_") and f.name.endswith(".md"):
            d = parse_code_drill(f.read_text(encoding="utf-8"), f"{CODE_DIR}/{f.name}")
            drills[d.id] = d
    return drills


def get_code_drill(name: str) -> CodeDrill:
    drills = load_code_drills()
    if name not in drills:
        raise ValueError(f"no coding drill {name!r}; drills: {', '.join(drills)}")
    return drills[name]


def list_code_drills(stdout: TextIO) -> None:
    for d in load_code_drills().values():
        print(f"  --code {d.id:24s} {d.title} ({d.minutes:g} min): write {d.function}()", file=stdout)


# --------------------------------------------------------------------------------------------
# The blank page and the verdict
# --------------------------------------------------------------------------------------------


def default_path(drill: CodeDrill) -> Path:
    from minigrpo_course.progress import home

    return home() / "drills" / f"{drill.function}.py"


def task_lines(drill: CodeDrill, width: int = 96) -> list[str]:
    """The task, each Markdown line wrapped to ``width`` (list items keep a hanging indent)."""
    logical: list[str] = []
    for line in drill.task.splitlines():
        if line.strip() and logical and logical[-1] and not line.startswith("- "):
            logical[-1] += " " + line.strip()
        else:
            logical.append(line.strip())
    out = []
    for line in logical:
        hang = "  " if line.startswith("- ") else ""
        out += textwrap.wrap(line, width, subsequent_indent=hang, break_on_hyphens=False) or [""]
    return out


def blank_page(drill: CodeDrill, started: datetime) -> str:
    """The file the learner starts from: the task as comments, and no code."""
    task = "\n".join("#   " + line if line else "#" for line in task_lines(drill))
    return (f"# Coding drill: {drill.title} (minigrpo interview --code {drill.id})\n"
            f"# Write {drill.function}() below, from a blank page, in {drill.minutes:g} minutes. "
            f"Run the hidden tests:\n"
            f"#     minigrpo interview --code {drill.id} --check --file <this file>\n"
            f"# started: {started.isoformat(timespec='seconds')}\n#\n{task}\n\n")


def start(drill: CodeDrill, path: Path | str | None = None, now: datetime | None = None) -> tuple[Path, bool]:
    """Create the blank page (never overwrites an existing file). Returns (path, created)."""
    path = Path(path).expanduser() if path else default_path(drill)
    if path.is_dir():
        raise ValueError(f"the drill file {path} is a folder; give a file name")
    if path.exists():
        return path, False
    check_writable(path, "drill file")
    atomic_write_text(path, blank_page(drill, now or datetime.now()))
    return path, True


def load_function(path: Path, name: str):
    """Run the learner's file and return the function ``name`` (None if it does not define it). A file
    that does not run is a ValueError naming the file, the line and the error."""
    if not path.exists():
        raise ValueError(f"{path} does not exist: start the drill first (minigrpo interview --code NAME)")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path} ({getattr(exc, 'strerror', None) or exc})") from None
    namespace: dict = {"__name__": "drill", "__file__": str(path)}
    try:
        exec(compile(source, str(path), "exec"), namespace)  # noqa: S102 - the learner's own file
    except SyntaxError as exc:
        raise ValueError(f"{path}, line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - anything the learner's module-level code raises
        raise ValueError(f"{path} raised {type(exc).__name__} when run: {exc}") from None
    fn = namespace.get(name)
    return fn if callable(fn) else None


def elapsed(path: Path, now: datetime | None = None) -> float | None:
    """Seconds since the ``# started:`` line of the file (None if there is none)."""
    m = _STARTED.search(path.read_text(encoding="utf-8")) if path.exists() else None
    if not m:
        return None
    try:
        started = datetime.fromisoformat(m.group(1))
    except ValueError:
        return None
    return ((now or datetime.now()) - started).total_seconds()


def check(drill: CodeDrill, path: Path | str, now: datetime | None = None):
    """Grade the file on every hidden case. Returns (ItemResult, seconds since the start or None)."""
    from minigrpo_course.grading import run_item

    path = Path(path).expanduser()
    fn = load_function(path, drill.function)
    return run_item(drill.item(), fn, quick=False), elapsed(path, now)


def verdict(drill: CodeDrill, result, seconds: float | None) -> str:
    from minigrpo_course.interview.terminal import clock_text

    if not result.passed and all(c.message.startswith("no function named") for c in result.cases):
        lines = [f"✗ the file defines no function {drill.function}() yet: all {len(result.cases)} hidden tests fail"]
    else:
        lines = [result.report()]
    if seconds is not None:
        budget = drill.minutes * 60
        lines.append(f"time: {clock_text(seconds)} of {clock_text(budget)}"
                     + (f" ({clock_text(seconds - budget)} over)" if seconds > budget else ""))
    if result.passed:
        lines.append(f"Compare with the reference answer: minigrpo interview --code {drill.id} --solution")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Hidden tests for the drills without an exercise (the grading engine, package references)
# --------------------------------------------------------------------------------------------


def _own_items() -> dict:
    import torch

    from minigrpo.attention import decode_attention, linear_attention_recurrent
    from minigrpo_course.grading.core import Case, Item, Made, WrongAnswer, randn

    def decode_case(seed, B, Hq, Hkv, L, d, dv):
        """(q [B, Hq, d], k_cache [B, Hkv, L, d], v_cache [B, Hkv, L, dv]), random float64."""
        return (Made(randn, B, Hq, d, seed=seed), Made(randn, B, Hkv, L, d, seed=seed + 1),
                Made(randn, B, Hkv, L, dv, seed=seed + 2))

    def gqa_tiled(q, k, v):  # heads assigned h % Hkv instead of h // group
        B, Hq, d = q.shape
        Hkv = k.shape[1]
        kr, vr = k.repeat(1, Hq // Hkv, 1, 1), v.repeat(1, Hq // Hkv, 1, 1)
        w = torch.softmax((q.unsqueeze(2) @ kr.transpose(-2, -1)).squeeze(2) / d**0.5, -1)
        return (w.unsqueeze(2) @ vr).squeeze(2)

    def gqa_unscaled(q, k, v):
        return decode_attention(q * q.shape[-1] ** 0.5, k, v)

    def gqa_first_head(q, k, v):
        return decode_attention(q, k[:, :1].expand_as(k).contiguous(), v[:, :1].expand_as(v).contiguous())

    def gqa_wrong_axis(q, k, v):
        B, Hq, d = q.shape
        Hkv = k.shape[1]
        qg = q.reshape(B, Hkv, Hq // Hkv, d)
        w = torch.softmax(qg @ k.transpose(-2, -1) / d**0.5, dim=-2)
        return (w @ v).reshape(B, Hq, v.shape[-1])

    gqa = Item(
        exercise="interview", number=1, function="gqa_decode", title="one decoding step of grouped-query attention",
        reference=decode_attention,
        cases=[
            Case("MHA: as many KV heads as query heads", decode_case(0, 2, 4, 4, 5, 8, 8)),
            Case("GQA: 8 query heads share 2 KV heads", decode_case(10, 2, 8, 2, 6, 8, 8)),
            Case("MQA: one KV head for all", decode_case(20, 1, 6, 1, 7, 4, 4)),
            Case("values of another width (d_v ≠ d)", decode_case(30, 2, 4, 2, 5, 8, 3)),
            Case("one cached position: the output is its value", decode_case(40, 1, 4, 2, 1, 4, 4)),
            Case("KV heads that do not divide the query heads are refused", decode_case(50, 1, 6, 4, 3, 4, 4),
                 hint="raise ValueError unless Hkv divides Hq (and batch and head dimension agree)."),
            Case("a long cache, 32 query heads and 8 KV heads", decode_case(60, 2, 32, 8, 64, 16, 16), quick=False,
                 rtol=1e-9, atol=1e-12),
        ],
        wrong_answers=[
            WrongAnswer("heads tiled", gqa_tiled,
                        "query head h belongs to KV head h // (Hq/Hkv): heads 0 … Hq/Hkv − 1 share KV head 0. "
                        "`repeat` tiles the KV heads (h % Hkv); use repeat_interleave, or reshape q to "
                        "[B, Hkv, group, d]."),
            WrongAnswer("no 1/√d", gqa_unscaled, "scale the scores by 1/√d before the softmax."),
            WrongAnswer("first KV head only", gqa_first_head,
                        "every group reads its own KV head; you used KV head 0 for all of them."),
            WrongAnswer("softmax over the heads", gqa_wrong_axis,
                        "the softmax runs over the L cached positions (the last axis of the scores), not over heads."),
        ],
    )

    def attn_case(seed, B, H, T, d, dv, T_k=None):
        """(q, k, v) of shapes [B, H, T, d], [B, H, T_k (= T), d], [B, H, T, dv], random float64."""
        return (Made(randn, B, H, T, d, seed=seed), Made(randn, B, H, T_k or T, d, seed=seed + 1),
                Made(randn, B, H, T, dv, seed=seed + 2))

    def _phi(x):
        return torch.nn.functional.elu(x) + 1

    def la_not_causal(q, k, v, eps=1e-6):
        fq, fk = _phi(q), _phi(k)
        S, z = fk.transpose(-2, -1) @ v, fk.sum(-2)
        return (fq @ S) / ((fq * z.unsqueeze(-2)).sum(-1, keepdim=True) + eps)

    def la_no_normaliser(q, k, v, eps=1e-6):
        fq, fk = _phi(q), _phi(k)
        return ((fq @ fk.transpose(-2, -1)).tril()) @ v

    def la_no_feature_map(q, k, v, eps=1e-6):
        return linear_attention_recurrent(q, k, v, feature_map=lambda x: x, eps=eps)

    def la_relu(q, k, v, eps=1e-6):
        return linear_attention_recurrent(q, k, v, feature_map=torch.relu, eps=eps)

    la = Item(
        exercise="interview", number=2, function="causal_linear_attention", title="causal linear attention",
        reference=linear_attention_recurrent,
        cases=[
            Case("one head, three positions", attn_case(0, 1, 1, 3, 2, 2)),
            Case("a batch of heads, d_v ≠ d", attn_case(10, 2, 2, 6, 4, 3)),
            Case("one position: the output is its value", attn_case(20, 1, 2, 1, 4, 4)),
            Case("shapes that do not fit are refused", attn_case(0, 1, 2, 4, 3, 3, T_k=5),
                 hint="raise ValueError unless q and k have the same shape and v matches them except its last axis."),
            Case("a longer sequence", attn_case(30, 2, 3, 32, 8, 5), quick=False, rtol=1e-9, atol=1e-12),
        ],
        wrong_answers=[
            WrongAnswer("not causal", la_not_causal,
                        "position t may only use keys s ≤ t: accumulate S and z as running (cumulative) sums, not over "
                        "the whole sequence."),
            WrongAnswer("no normaliser", la_no_normaliser,
                        "divide by φ(q_t)ᵀ z_t (+ eps) with z_t = Σ_{s≤t} φ(k_s): without it the output's scale grows "
                        "with t."),
            WrongAnswer("no feature map", la_no_feature_map,
                        "apply φ(x) = elu(x) + 1 to q and k first: raw dot products can be negative and the normaliser "
                        "can cross 0."),
            WrongAnswer("relu feature map", la_relu, "the feature map here is elu(x) + 1, not relu."),
        ],
    )
    return {gqa.function: gqa, la.function: la}


def run_code_drill(drill: CodeDrill, path: Path | str | None, stdin: TextIO, stdout: TextIO, check_only: bool = False,
                   solution: bool = False) -> int:
    """The ``--code`` command: print the reference answer, check a file once, or start the drill and run
    the hidden tests each time the learner presses Enter, until they pass or the learner stops.
    Returns the exit status: 0 when the last check passed (or nothing was checked), 1 otherwise."""

    def say(text: str = "") -> None:
        print(text, file=stdout, flush=True)

    if solution:
        say(f"Reference answer of the coding drill {drill.id}:\n\n{drill.reference}")
        return 0
    if check_only:
        path = Path(path).expanduser() if path else default_path(drill)
        result, seconds = check(drill, path)
        say(verdict(drill, result, seconds))
        return 0 if result.passed else 1
    path, created = start(drill, path)
    say(f"Coding drill: {drill.title} ({drill.minutes:g} minutes)\n")
    say("\n".join("  " + line for line in task_lines(drill)) + "\n")
    say(("Wrote the blank page " if created else "Your file (kept as it is) ") + f"{path}: write {drill.function}() "
        f"there in your editor. The clock started when the file was created.")
    while True:
        print("Press Enter to run the hidden tests (q to stop): ", end="", file=stdout, flush=True)
        line = readline(stdin)
        if not line or line.strip().lower() in ("q", "quit"):
            say(f"\nstopped; your file stays at {path}")
            return 1
        try:
            result, seconds = check(drill, path)
        except ValueError as exc:
            say(f"✗ {exc}")
            continue
        say(verdict(drill, result, seconds))
        if result.passed:
            return 0
