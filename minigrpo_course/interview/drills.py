"""Derivation drills: the derivations interviewers ask for, one checked step at a time.

``minigrpo interview --drill NAME`` walks through a derivation on small numbers. Each step asks for a
number (arithmetic is fine: ``0.9*1.5 - 1``, ``sqrt(2*0.01/1.14)``, ``7/8``) or a choice (a, b, c),
checks it, gives a hint after a wrong try, and shows the worked step before moving on. Every answer
key is computed by the package's own functions (``minigrpo.advantages.gae``, ``group_advantages``,
``losses.clipped_surrogate_loss``, ``losses.kl_estimate``, ``attention.kv_cache_bytes``), so a drill
cannot disagree with the code it teaches.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

#: relative tolerance of a numeric step (answers may be rounded to 3 significant digits)
REL_TOL = 5e-3


@dataclass(frozen=True)
class Step:
    prompt: str
    answer: Callable[[], float | str]  #: the key: a number, or the letter of the right choice
    explain: str  #: the worked step, shown after the answer
    hint: str  #: shown after a wrong first try
    choices: tuple[str, ...] = ()  #: for a choice step: the options, lettered a, b, c …
    abs_tol: float = 1e-3

    @property
    def is_choice(self) -> bool:
        return bool(self.choices)


@dataclass(frozen=True)
class Drill:
    id: str
    title: str
    setup: str
    steps: tuple[Step, ...]
    bank: str  #: the bank question this derivation belongs to


# --------------------------------------------------------------------------------------------
# Reading answers: numbers and a little arithmetic, safely
# --------------------------------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow}
_FUNCS = {"sqrt": math.sqrt, "log": math.log, "ln": math.log, "exp": math.exp}


def evaluate(text: str) -> float:
    """A number or an arithmetic expression (+ − × ÷, ^ or **, parentheses, sqrt/√, log/ln, exp, e, pi);
    a ValueError that says what is accepted otherwise."""
    cleaned = (text.strip().replace("−", "-").replace("×", "*").replace("·", "*").replace("÷", "/")
               .replace("^", "**").replace(",", ""))
    cleaned = re.sub(r"√\s*(\d+(?:\.\d+)?|pi|e\b)", r"sqrt(\1)", cleaned).replace("√", "sqrt")
    try:
        tree = ast.parse(cleaned, mode="eval")
        return float(_eval(tree.body))
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError) as exc:
        detail = f" ({exc})" if isinstance(exc, (ZeroDivisionError, OverflowError)) else ""
        raise ValueError(f"expected a number or arithmetic such as 0.9*1.5 - 1 or sqrt(2*0.01/1.14), "
                         f"got {text.strip()!r}{detail}") from None


def _eval(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in ("e", "pi"):
        return math.e if node.id == "e" else math.pi
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS \
            and len(node.args) == 1 and not node.keywords:
        return _FUNCS[node.func.id](_eval(node.args[0]))
    raise ValueError("unsupported expression")


def is_correct(step: Step, reply: str) -> bool:
    """Whether ``reply`` answers ``step``; a ValueError for a reply that is not an answer at all."""
    key = step.answer()
    if step.is_choice:
        letter = reply.strip().lower().rstrip(").")
        letters = [chr(ord("a") + i) for i in range(len(step.choices))]
        if letter not in letters:
            raise ValueError(f"answer with one letter: {', '.join(letters)}")
        return letter == key
    return math.isclose(evaluate(reply), float(key), rel_tol=REL_TOL, abs_tol=step.abs_tol)


def key_text(step: Step) -> str:
    key = step.answer()
    if step.is_choice:
        return f"({key}) {step.choices[ord(key) - ord('a')]}"
    return f"{float(key) + 0.0:.6g}"  # + 0.0 turns −0.0 into 0


# --------------------------------------------------------------------------------------------
# The answer keys, from the package
# --------------------------------------------------------------------------------------------

_GAE_R, _GAE_V, _GAE_BOOT, _GAMMA, _LAM = [1.0, 0.0, 2.0], [0.5, 1.0, 1.5], 2.0, 0.9, 0.8


def _gae(lam: float, t: int) -> float:
    import torch

    from minigrpo.advantages import gae

    r = torch.tensor(_GAE_R, dtype=torch.float64)
    v = torch.tensor(_GAE_V, dtype=torch.float64)
    nv = torch.tensor(_GAE_V[1:] + [_GAE_BOOT], dtype=torch.float64)
    no = torch.zeros(3, dtype=torch.bool)
    return gae(r, v, nv, no, no, _GAMMA, lam)[t].item()


def _delta(t: int) -> float:
    return _gae(0.0, t)  # λ = 0: the advantage is the TD residual


_F = [[2.0, 0.5], [0.5, 1.0]]
_G = [1.0, 1.0]
_DELTA = 0.01


def _trpo_x(i: int) -> float:
    import torch

    return torch.linalg.solve(torch.tensor(_F, dtype=torch.float64), torch.tensor(_G, dtype=torch.float64))[i].item()


def _trpo_xfx() -> float:
    import torch

    x = torch.tensor([_trpo_x(0), _trpo_x(1)], dtype=torch.float64)
    return (x @ torch.tensor(_F, dtype=torch.float64) @ x).item()


def _trpo_beta() -> float:
    from minigrpo_course.interview.figures import trpo_step_size

    import torch

    x = torch.tensor([_trpo_x(0), _trpo_x(1)], dtype=torch.float64)
    return trpo_step_size(x, torch.tensor(_F, dtype=torch.float64) @ x, _DELTA)


def _trpo_model_kl() -> float:
    return 0.5 * _trpo_beta() ** 2 * _trpo_xfx()


def clip_gradient(ratio: float, advantage: float, epsilon: float = 0.2) -> float:
    """d/d log π of the clipped objective min(ρA, clip(ρ, 1 ± ε)A) for one sample: autograd through the
    package's ``clipped_surrogate_loss`` (which returns the negated objective)."""
    import torch

    from minigrpo.losses import clipped_surrogate_loss

    old = torch.zeros(1, dtype=torch.float64)
    logp = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_surrogate_loss(logp, old, torch.tensor([advantage], dtype=torch.float64), epsilon)
    loss.backward()
    return -logp.grad.item()


def _lone_success(G: int) -> float:
    from minigrpo_course.interview.figures import lone_success_advantages

    return lone_success_advantages(G)[0]


def _w(p: float, G: int, scale: str = "group") -> float:
    from minigrpo_course.interview.figures import group_weight

    return group_weight(p, G, scale)


def _w_ratio(p: float, G: int) -> float:
    from minigrpo_course.interview.figures import group_weight_ratio

    return group_weight_ratio(p, G)


def _w_limit(p: float) -> float:
    from minigrpo_course.interview.figures import group_weight_limit_ratio

    return group_weight_limit_ratio(p)


_PI, _REF = [0.5, 0.3, 0.2], [0.4, 0.4, 0.2]


def _k3_at(r: float) -> float:
    import torch

    from minigrpo.losses import kl_estimate

    logp = torch.zeros(1, dtype=torch.float64)
    return kl_estimate(logp, logp + math.log(r), "k3").item()


def _k3_grad_at(r: float) -> float:
    import torch

    from minigrpo.losses import kl_estimate

    logp = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    kl_estimate(logp, torch.full((1,), math.log(r), dtype=torch.float64), "k3").backward()
    return logp.grad.item()


def _k3_expectation() -> float:
    """Σ π_θ(a)·k3(a) over a 3-token vocabulary: exactly KL(π_θ ‖ π_ref)."""
    import torch

    from minigrpo.losses import kl_estimate

    pi = torch.tensor(_PI, dtype=torch.float64)
    return (pi * kl_estimate(pi.log(), torch.tensor(_REF, dtype=torch.float64).log(), "k3")).sum().item()


GiB = 2**30


def _kv(n_kv_heads: int, seq_len: int = 8192, batch: int = 16, nbytes: int = 2, layers: int = 32) -> int:
    from minigrpo.attention import kv_cache_bytes

    return kv_cache_bytes(layers, n_kv_heads, 128, seq_len, batch, nbytes)


# --------------------------------------------------------------------------------------------
# The drills
# --------------------------------------------------------------------------------------------

DRILLS: dict[str, Drill] = {d.id: d for d in (
    Drill("gae", "GAE: the recursion and its λ limits",
          "A rollout of three steps, cut by the rollout length (not terminal): rewards r = [1, 0, 2], values "
          "V(s_0..s_2) = [0.5, 1.0, 1.5], and V(s_3) = 2.0 to bootstrap from. γ = 0.9, λ = 0.8. "
          "δ_t = r_t + γV(s_{t+1}) − V(s_t), and Â_t = δ_t + γλÂ_{t+1}, computed backwards.",
          (
              Step("δ_2, the last TD residual?", lambda: _delta(2),
                   "δ_2 = 2 + 0.9·2.0 − 1.5 = 2.3: the cut rollout still bootstraps from V(s_3).",
                   "r_2 + γ·V(s_3) − V(s_2); the rollout was cut, not terminated, so V(s_3) counts."),
              Step("δ_1?", lambda: _delta(1), "δ_1 = 0 + 0.9·1.5 − 1.0 = 0.35.", "r_1 + γ·V(s_2) − V(s_1)."),
              Step("Â_1 = δ_1 + γλ·Â_2, with Â_2 = δ_2?", lambda: _gae(_LAM, 1),
                   "Â_1 = 0.35 + 0.72·2.3 = 2.006.", "γλ = 0.72; the recursion starts from Â_2 = δ_2 = 2.3."),
              Step("Â_0?", lambda: _gae(_LAM, 0),
                   "δ_0 = 1 + 0.9·1.0 − 0.5 = 1.4, so Â_0 = 1.4 + 0.72·2.006 = 2.844.",
                   "first δ_0 = r_0 + γV(s_1) − V(s_0), then add γλ·Â_1."),
              Step("With λ = 0, what is Â_0?", lambda: _gae(0.0, 0),
                   "λ = 0 keeps only the one-step residual: Â_0 = δ_0 = 1.4. Little variance, but any error in V "
                   "is bias.",
                   "with λ = 0 the sum keeps only its first term."),
              Step("With λ = 1, what is Â_0?", lambda: _gae(1.0, 0),
                   "λ = 1 sums every residual with weight γ^l; they telescope to the discounted return minus V: "
                   "1 + 0.9·0 + 0.81·2 + 0.729·2.0 − 0.5 = 3.578.",
                   "the residuals telescope: Σ γ^l r_l + γ³V(s_3) − V(s_0)."),
              Step("Which λ has the lower variance and the larger bias from an imperfect critic?", lambda: "a",
                   "λ = 0: one reward and V, so little randomness, but V's errors go straight into the advantage.",
                   "which estimate leans entirely on V?",
                   choices=("λ = 0", "λ = 1", "neither: λ only changes the scale")),
          ), bank="gae"),
    Drill("trpo-step", "TRPO: the step size √(2δ / xᵀFx)",
          "Two parameters. The policy gradient is g = [1, 1], the Fisher matrix F = [[2, 0.5], [0.5, 1]], and the "
          "trust region is δ = 0.01. TRPO maximises gᵀΔ subject to ½ΔᵀFΔ ≤ δ.",
          (
              Step("x = F⁻¹g: its first component?", lambda: _trpo_x(0),
                   "F⁻¹ = [[1, −0.5], [−0.5, 2]] / 1.75, so x = [0.5, 1.5] / 1.75 = [0.2857, 0.8571] (conjugate "
                   "gradient finds the same x from Fv products alone).",
                   "det F = 2·1 − 0.5² = 1.75; F⁻¹ = [[1, −0.5], [−0.5, 2]] / 1.75."),
              Step("… and its second component?", lambda: _trpo_x(1), "x_2 = 1.5 / 1.75 = 0.8571.",
                   "the second row of F⁻¹ times g."),
              Step("xᵀFx?", _trpo_xfx, "xᵀFx = gᵀF⁻¹g = gᵀx = 0.2857 + 0.8571 = 1.1429.",
                   "Fx = g, so xᵀFx = xᵀg."),
              Step("The step length β = √(2δ / xᵀFx)?", _trpo_beta,
                   "β = √(0.02 / 1.1429) = 0.1323. It comes from the Lagrangian: Δ = F⁻¹g/λ, and ½ΔᵀFΔ = δ fixes λ.",
                   "plug xᵀFx into √(2δ / xᵀFx)."),
              Step("The quadratic model's KL of the full step βx, ½(βx)ᵀF(βx)?", _trpo_model_kl,
                   "½β²·xᵀFx = δ = 0.01 exactly: the step lands on the boundary of the trust region (the line "
                   "search then checks the true KL).", "β was chosen to make this equal to δ."),
              Step("Why does TRPO still run a backtracking line search after this step?", lambda: "b",
                   "The step is exact for the linear objective and the quadratic KL, but the true KL and the true "
                   "surrogate differ; backtracking shrinks the step until both checks pass.",
                   "what are the two models the step was computed from?",
                   choices=("conjugate gradient returns a random direction",
                            "the KL and the objective were only approximated (quadratic, linear)",
                            "to make the step longer than the trust region allows")),
          ), bank="trpo"),
    Drill("clip-gradient", "PPO: the clip's gradient, case by case",
          "The clipped objective of one sample is L = min(ρA, clip(ρ, 1 − ε, 1 + ε)A), ε = 0.2. Give dL/d log π "
          "(note dρ/d log π = ρ): ρA where the unclipped branch is the min, 0 where the clipped branch is.",
          (
              Step("ρ = 1.1, A = +2 (inside the range)?", lambda: clip_gradient(1.1, 2.0),
                   "Inside [0.8, 1.2] both branches agree and the gradient is ρA = 2.2.",
                   "inside the range the clip does nothing: dL/d log π = ρA."),
              Step("ρ = 1.5, A = +1?", lambda: clip_gradient(1.5, 1.0),
                   "min(1.5, 1.2) = 1.2 is the clipped branch, a constant: gradient 0. A good action that already "
                   "rose by more than ε gets no further push.", "which of 1.5·A and 1.2·A is smaller?"),
              Step("ρ = 0.5, A = +1?", lambda: clip_gradient(0.5, 1.0),
                   "min(0.5, 0.8) = 0.5 is the unclipped branch: gradient ρA = 0.5. The ratio moved the wrong way, "
                   "so the min keeps the full pull back.", "compare 0.5·A with clip(0.5)·A = 0.8·A."),
              Step("ρ = 0.5, A = −1?", lambda: clip_gradient(0.5, -1.0),
                   "min(−0.5, −0.8) = −0.8 is the clipped branch: gradient 0. A bad action already pushed down by more "
                   "than ε is left alone.", "with A < 0 the clipped value is −0.8."),
              Step("ρ = 1.5, A = −1?", lambda: clip_gradient(1.5, -1.0),
                   "min(−1.5, −1.2) = −1.5 is the unclipped branch: gradient ρA = −1.5. A bad action that became "
                   "more likely is always corrected: the pessimistic side is never clipped.",
                   "compare −1.5 with clip(1.5)·A = −1.2."),
          ), bank="ppo-clip"),
    Drill("group-weight", "GRPO: w_G(p), the std's difficulty weight",
          "A 0/1 reward; a prompt the policy solves with probability p. GRPO's advantage (sample std, as "
          "torch.std and TRL) is (r − mean)/(std + 1e-4). The prompt's expected update is w_G(p)·∇p with "
          "w_G(p) = E[Â_1 | r_1 = 1] − E[Â_1 | r_1 = 0].",
          (
              Step("G = 2, rewards [1, 0]: the advantage of the success?", lambda: _lone_success(2),
                   "mean 0.5, sample std √(2·0.25/1) = 0.7071, so Â = 0.5/0.7071 = 0.7071 = 1/√2.",
                   "the sample std divides by G − 1 = 1."),
              Step("So w_2(p), for any p?", lambda: _w(0.3, 2),
                   "A success gets +1/√2 when its partner failed (probability 1 − p) and 0 otherwise; a failure gets "
                   "−1/√2 when its partner succeeded (probability p): w = (1 − p)/√2 + p/√2 = 0.7071 for every p.",
                   "E[Â | success] − E[Â | failure], each over the partner's reward."),
              Step("G = 8, exactly one success: its advantage?", lambda: _lone_success(8),
                   "mean 1/8, sample std √(8·(1/8)(7/8)/7) = 0.3536, Â = (7/8)/0.3536 = 2.474 ≈ (G − 1)/√G: the "
                   "bound on the weight as p → 0.", "mean 0.125; variance with G − 1 in the denominator."),
              Step("Mean-centring only (no std), G = 8: w_8(p)?", lambda: _w(0.3, 8, "none"),
                   "(G − 1)/G = 0.875 for every p: the true gradient shrunk by a constant, no difficulty weighting.",
                   "Â = r − mean: the own reward counts 1/G of the mean."),
              Step("With the std, G = 8: w_8(0.02) / w_8(0.5), how much more a hard prompt weighs?",
                   lambda: _w_ratio(0.02, 8),
                   "About 1.39: the std up-weights prompts at the extremes, but at G = 8 only by 1.4×.",
                   "w_8(0.5) = 1.735 and w_8(0.02) = 2.406 (lesson 05's table).", abs_tol=0.01),
              Step("And as G → ∞ (the std tends to √(p(1 − p))): the same ratio?", lambda: _w_limit(0.02),
                   "1/√(0.02·0.98) / 2 = 3.57: the often-quoted 3.5× is this limit, not a finite-G figure.",
                   "w_∞(p) = 1/√(p(1 − p)); at p = 0.5 that is 2.", abs_tol=0.01),
          ), bank="group-normalisation"),
    Drill("k3-gradient", "The k3 estimator and its gradient",
          "Tokens are sampled from π_θ; r = π_ref(a)/π_θ(a) for the sampled token. k1 = −log r, "
          "k3 = r − 1 − log r. GRPO adds β·k3 per token to the loss.",
          (
              Step("k3 at r = 0.5?", lambda: _k3_at(0.5), "0.5 − 1 − log 0.5 = 0.1931 ≥ 0, as for every r.",
                   "log 0.5 = −0.6931."),
              Step("d k3 / d log π_θ at r = 0.5?", lambda: _k3_grad_at(0.5),
                   "dr/d log π_θ = −r, so d k3 / d log π_θ = −r + 1 = 1 − r = 0.5.",
                   "r = π_ref/π_θ = exp(log π_ref − log π_θ): what is dr / d log π_θ?"),
              Step("E over a ~ π_θ of (1 − r)·∇log π_θ(a) equals the gradient of which quantity?", lambda: "b",
                   "Σ π_θ(1 − π_ref/π_θ)∇log π_θ = Σ π_θ∇log π_θ − Σ π_ref∇log π_θ = 0 − Σ π_ref∇log π_θ = "
                   "∇KL(π_ref ‖ π_θ): the reverse direction of the objective's KL.",
                   "Σ π_θ ∇log π_θ = 0; what is left is −Σ π_ref ∇log π_θ.",
                   choices=("KL(π_θ ‖ π_ref)", "KL(π_ref ‖ π_θ)", "nothing: it is 0")),
              Step("And k1 = log π_θ − log π_ref used as a loss: its expected gradient?", lambda: "c",
                   "∇k1 = ∇log π_θ, and E_π_θ[∇log π_θ] = 0: as a loss, k1 adds noise and no pull.",
                   "the score function has expectation zero.",
                   choices=("∇KL(π_θ ‖ π_ref)", "∇KL(π_ref ‖ π_θ)", "zero")),
              Step("π_θ = [0.5, 0.3, 0.2], π_ref = [0.4, 0.4, 0.2]: E_π_θ[k3]?", _k3_expectation,
                   "k3 is unbiased for KL(π_θ ‖ π_ref) = 0.5·log(1.25) + 0.3·log(0.75) = 0.0253.",
                   "E[r] = 1, so E[k3] = E[−log r] = KL(π_θ ‖ π_ref).", abs_tol=1e-4),
          ), bank="kl-placement"),
    Drill("kv-cache", "KV-cache bytes",
          "A decoder with 32 layers, 32 query heads and 8 key/value heads of dimension 128, cache in bf16 "
          "(2 bytes), serving a batch of 16 sequences of 8,192 tokens.",
          (
              Step("Bytes of K and V for one token in one layer?", lambda: _kv(8, 1, 1, 2, 1),
                   "2 (K and V) · 8 KV heads · 128 · 2 bytes = 4,096 bytes; query heads do not appear.",
                   "2 · KV heads · head dim · bytes per element."),
              Step("Per token, all layers, in KiB?", lambda: _kv(8, 1, 1) / 2**10,
                   "4,096 · 32 = 131,072 bytes = 128 KiB.", "multiply by the 32 layers; 1 KiB = 1,024 bytes."),
              Step("The whole cache (16 sequences × 8,192 tokens), in GiB?", lambda: _kv(8) / GiB,
                   "128 KiB · 8,192 · 16 = 16 GiB.", "per-token bytes × tokens × sequences; 1 GiB = 2^30 bytes."),
              Step("The same model with multi-head attention (32 KV heads), in GiB?", lambda: _kv(32) / GiB,
                   "4× the KV heads, 4× the cache: 64 GiB. GQA-8 is exactly the 4× saving.",
                   "only the KV-head count changes."),
              Step("GQA-8 with an 8-bit (int8/fp8) cache, in GiB?", lambda: _kv(8, nbytes=1) / GiB,
                   "Half the bytes per element: 8 GiB.", "bytes per element 2 → 1."),
          ), bank="kv-cache-4x"),
)}


def get_drill(name: str) -> Drill:
    try:
        return DRILLS[name]
    except KeyError:
        raise ValueError(f"no derivation drill {name!r}; drills: {', '.join(DRILLS)}") from None


def list_drills(stdout: TextIO) -> None:
    for d in DRILLS.values():
        print(f"  --drill {d.id:14s} {d.title} ({len(d.steps)} steps)", file=stdout)


class StopDrill(Exception):
    pass


def run_drill(drill: Drill, stdin: TextIO, stdout: TextIO, tries: int = 2) -> tuple[int, int]:
    """Walk through the steps; returns (steps right at the first try, steps answered). 'q' stops."""
    from minigrpo_course.interview.terminal import WIDTH, _wrap, readline

    def say(text: str = "") -> None:
        print(text, file=stdout, flush=True)

    def fill(text: str) -> str:
        return textwrap.fill(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)

    say("=" * WIDTH + f"\nDerivation drill: {drill.title}\n\n" + _wrap(drill.setup) + "\n")
    first, answered = 0, 0
    for i, step in enumerate(drill.steps, 1):
        say(f"Step {i} of {len(drill.steps)}: {step.prompt}")
        for j, letter in enumerate("abcdefgh"[:len(step.choices)]):
            say(f"   ({letter}) {step.choices[j]}")
        attempt = 0
        while attempt < tries:
            print("> ", end="", file=stdout, flush=True)
            line = readline(stdin)
            if not line or line.strip().lower() in ("q", "quit"):
                say(f"\nstopped: {first} of {answered} steps right at the first try")
                return first, answered
            try:
                right = is_correct(step, line)
            except ValueError as exc:
                say(str(exc))
                continue
            attempt += 1
            if right:
                first += attempt == 1
                say(fill("✓ " + step.explain))
                break
            if attempt < tries:
                say(fill(f"✗ not quite. Hint: {step.hint}"))
            else:
                say(fill(f"✗ the answer is {key_text(step)}. {step.explain}"))
        answered += 1
        say()
    say(f"{first} of {len(drill.steps)} steps right at the first try. The full answer: "
        f"minigrpo interview --show {drill.bank}")
    return first, answered
