"""Paired rounds for the "ours vs a peer" benchmarks, and competing processes to run them beside.

Timing all of our steps and then all of the peer's lets a change of load between the two windows move
the ratio: on a shared machine that cannot tell a real slowdown from bad luck. Here both sides are built
once and then alternate: round k runs ``per_round`` steps of each, the side that goes first alternating
from round to round, so both see (nearly) the same load and every round gives its own ratio. We report
each side's median seconds per step and the **median of the per-round ratios**, with their interquartile
range and min–max, and the 1-minute load average seen at each round.

``Competitors(n, "torch")`` starts ``n`` processes beside the benchmark, each a loop of 1024 × 1024 float32
matmuls on all the cores (as a neighbour's training job would); ``"python"`` is a pure-Python busy loop
(one core each, no OpenMP). They stop when the ``with`` block ends, on Ctrl-C or an exception too, and
by themselves if this process dies (they watch their parent; they are in their own session, so a Ctrl-C reaches only this process, which stops them).

Used by grpo_vs_trl.py and ppo_cartpole.py.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# ---------------------------------------------------------------------------------------------- statistics


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, quartiles (inclusive method) and extremes of ``xs``."""
    xs = sorted(xs)
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0], None, xs[0])
    return {"median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1], "n": len(xs)}


def fmt_ratio(s: dict[str, float]) -> str:
    """``1.42x [IQR 1.35–1.50, min–max 1.30–1.58, 8 rounds]``"""
    return (f"{s['median']:.2f}x [IQR {s['q1']:.2f}–{s['q3']:.2f}, min–max {s['min']:.2f}–{s['max']:.2f}, "
            f"{s['n']} rounds]")


def load1() -> float:
    return os.getloadavg()[0]


# ------------------------------------------------------------------------------------------- peak memory


def _read_hwm_kib() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    """Reset the process's peak resident set size (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory of one side's steps: ``torch.cuda.max_memory_allocated`` on CUDA; on the CPU the process's
    peak resident memory (VmHWM, reset before each step; it includes what the other side holds resident, since
    both live in this process)."""

    def __init__(self, device: str):
        self.device = device
        self.resettable = device == "cuda" or _reset_hwm()

    def reset(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        else:
            _reset_hwm()

    def read(self) -> float:
        """GiB."""
        if self.device == "cuda":
            import torch

            return torch.cuda.max_memory_allocated() / 2**30
        kib = _read_hwm_kib()
        if kib is None:
            import resource

            kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kib / 2**20

    @property
    def label(self) -> str:
        if self.device == "cuda":
            return "peak CUDA memory allocated"
        return "peak RSS of the process during its steps" if self.resettable else "peak RSS of the process (whole run)"


# ------------------------------------------------------------------------------------------ paired rounds


@dataclass
class Rounds:
    """The timed steps of a paired run. ``names[0]`` is ours, ``names[1]`` the peer; ``ratio`` = peer ÷ ours."""

    names: tuple[str, str]
    times: dict[str, list[float]] = field(default_factory=dict)  #: seconds per step, timed rounds only
    peaks: dict[str, float] = field(default_factory=dict)  #: GiB, max over the timed steps
    loads: list[float] = field(default_factory=list)  #: 1-min load average at the start of each timed round
    per_round: int = 1
    memory_label: str = ""

    @property
    def ratios(self) -> list[float]:
        """Per round: the peer's mean s/step ÷ ours (> 1: ours is faster)."""
        ours, peer = self.names
        k = self.per_round
        return [statistics.fmean(self.times[peer][i:i + k]) / statistics.fmean(self.times[ours][i:i + k])
                for i in range(0, len(self.times[ours]), k)]

    def summary(self) -> dict:
        return {"names": list(self.names), "per_round": self.per_round,
                "seconds": {n: spread(t) for n, t in self.times.items()}, "raw_seconds": self.times,
                "peak_gib": self.peaks, "memory": self.memory_label, "ratio": spread(self.ratios),
                "raw_ratios": self.ratios, "load1": spread(self.loads)}


class Pairing:
    """The order of a paired run and its bookkeeping. ``plan`` lists the sides step by step: round k runs
    ``per_round`` steps of each, ours first in even rounds and the peer first in odd ones (A B, B A, A B, ...);
    the first ``warmup`` rounds are not recorded. :meth:`timed` runs and records the next planned step.

    A peer whose loop cannot be called one step at a time (TRL's ``trainer.train()``) drives the plan itself: it
    times its own steps (:meth:`start` / :meth:`stop` around each) and runs ours where the plan says
    (:meth:`run_ours_while_planned`), so both stay in the one thread and the one OpenMP team."""

    def __init__(self, names: Sequence[str], rounds: int, warmup: int = 1, per_round: int = 1, device: str = "cpu",
                 log: Callable[[str], None] | None = print):
        assert len(names) == 2, "two sides: ours and the peer"
        self.names, self.rounds, self.warmup, self.per_round = tuple(names), rounds, warmup, per_round
        self.plan = [(k, name) for k in range(warmup + rounds)
                     for name in (self.names if k % 2 == 0 else self.names[::-1]) for _ in range(per_round)]
        self.pos, self.device, self.log, self.mem = 0, device, log, PeakMemory(device)
        self.out = Rounds(self.names, {n: [] for n in self.names}, {n: 0.0 for n in self.names},
                          per_round=per_round, memory_label=self.mem.label)
        self._line: list[str] = []
        self._t0 = 0.0

    @property
    def done(self) -> bool:
        return self.pos >= len(self.plan)

    @property
    def next_side(self) -> str | None:
        return None if self.done else self.plan[self.pos][1]

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def start(self) -> None:
        """Just before the next planned step."""
        k, _ = self.plan[self.pos]
        if k >= self.warmup and (self.pos == 0 or self.plan[self.pos - 1][0] != k):  # a round begins
            self.out.loads.append(load1())
        self._sync()
        self.mem.reset()
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        """Just after it."""
        self._sync()
        dt = time.perf_counter() - self._t0
        k, name = self.plan[self.pos]
        if k >= self.warmup:
            self.out.times[name].append(dt)
            self.out.peaks[name] = max(self.out.peaks[name], self.mem.read())
        self._line.append(f"{name} {dt:.3f}s")
        self.pos += 1
        if self.done or self.plan[self.pos][0] != k:  # the round is over
            if self.log:
                self.log(f"  round {k - self.warmup + 1 if k >= self.warmup else 'warm-up'}: {', '.join(self._line)}"
                         f"  (load {load1():.2f})")
            self._line = []

    def timed(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` as the next planned step."""
        self.start()
        fn()
        self.stop()

    def run_ours_while_planned(self, ours: Callable[[], object]) -> None:
        while not self.done and self.next_side == self.names[0]:
            self.timed(ours)


def run_rounds(steps: dict[str, Callable[[], object]], rounds: int, warmup: int = 1, per_round: int = 1,
               device: str = "cpu", log: Callable[[str], None] | None = print) -> Rounds:
    """Alternate the two step functions of ``steps`` (ours first in the dict) as :class:`Pairing` plans."""
    pairing = Pairing(list(steps), rounds, warmup, per_round, device, log)
    while not pairing.done:
        pairing.timed(steps[pairing.next_side])
    return pairing.out


def report(r: Rounds, tokens_per_step: int | None = None) -> str:
    """The lines a benchmark prints: per side median s/step [IQR], tokens/s, peak memory; the paired ratio; load."""
    lines = []
    for name in r.names:
        s = spread(r.times[name])
        tps = f"  {tokens_per_step / s['median']:,.0f} completion tokens/s" if tokens_per_step else ""
        lines.append(f"{name:<16} median {s['median']:.3f} s/step [IQR {s['q1']:.3f}–{s['q3']:.3f}]{tps}  "
                     f"peak {r.peaks[name]:.2f} GiB")
    ld = spread(r.loads)
    lines.append(f"paired ratio {r.names[1]} ÷ {r.names[0]} (s/step; > 1: {r.names[0]} faster), median of per-round "
                 f"ratios: {fmt_ratio(spread(r.ratios))}")
    lines.append(f"memory: {r.memory_label}; 1-min load average at the rounds' starts: median {ld['median']:.2f} "
                 f"(min–max {ld['min']:.2f}–{ld['max']:.2f})")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- competitors

_COMPETITOR = r"""
import os, sys
kind, parent = sys.argv[1], int(sys.argv[2])
if kind == "torch":
    import torch
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024) / 32
    while os.getppid() == parent:          # stop by ourselves if the benchmark dies
        for _ in range(10):
            a = torch.tanh(a @ b)          # every core, as torch's default thread count does
else:
    while os.getppid() == parent:
        x = 0
        for i in range(200_000):
            x += i * i
"""


class Competitors:
    """``with Competitors(n, kind):`` — ``n`` busy processes beside the block (see the module docstring)."""

    def __init__(self, n: int, kind: str = "torch"):
        if kind not in ("torch", "python"):
            raise ValueError(f"competitor kind must be 'torch' or 'python', got {kind!r}")
        self.n, self.kind, self.procs = n, kind, []

    def __enter__(self) -> Competitors:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", _COMPETITOR, self.kind, str(os.getpid())],
                                               env=env, stdin=subprocess.DEVNULL, start_new_session=True))
        if self.n:
            time.sleep(2.0 if self.kind == "torch" else 0.2)  # let them import torch and start computing
            dead = [p.returncode for p in self.procs if p.poll() is not None]
            if dead:
                self.stop()
                raise RuntimeError(f"a competing process exited at once (status {dead[0]})")
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def __exit__(self, *exc) -> None:
        self.stop()

    def __str__(self) -> str:
        what = "torch matmul loops on all cores" if self.kind == "torch" else "pure-Python busy loops"
        return f"{self.n} competing processes ({what})" if self.n else "no competing processes"


def add_arguments(parser) -> None:
    """``--rounds``, ``--warmup``, ``--per-round``, ``--compete``, ``--compete-kind``, ``--json``."""
    parser.add_argument("--compete", type=int, default=0, metavar="N",
                        help="start N competing processes beside the benchmark for its duration")
    parser.add_argument("--compete-kind", choices=["torch", "python"], default="torch",
                        help="torch: matmul loops on all cores (a neighbour's training job); python: busy loops")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE (JSON)")
