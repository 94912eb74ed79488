"""Lesson 06, section 7: what gradient a KL penalty gives, depending on *where* it is put and *which* estimator.

PPO-RLHF puts ``−β·k(π, π_ref)`` per token into the **reward**: it reaches θ only through the score function,
``k · ∇log π`` with ``k`` a constant. GRPO adds ``β·k`` to the **loss** and differentiates it. The two routes give
different expected gradients from the same estimator. Everything here is exact, in float64: a small policy whose
expectations are sums over every outcome, so each placement's expected gradient is compared with the true gradient
``∇_θ KL(π_θ ‖ π_ref)`` computed by autograd on the exact KL.

- A **categorical policy** ``π_θ = softmax(θ)`` (:func:`categorical_placements`, :func:`distance_sweep`,
  :func:`monte_carlo`): one token, so "per token" and "per sequence" coincide.
- A **tabular autoregressive policy** (:class:`TabularLM`, :func:`sequence_placements`): a few tokens, one logit
  vector per prefix, every sequence enumerated. Here a per-token loss term misses that earlier tokens choose which
  later contexts are visited; only the score function with the return (reward-to-go) carries that.

Each placement is a *surrogate*: a per-sample scalar whose gradient is that sample's gradient estimate, and whose
expectation under (a detached) π is the expected gradient. Sign: the gradient of a loss to minimise, so the exact
target is ``+∇KL`` (a reward ``−k`` gives the loss ``k · log π``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from minigrpo.losses import kl_estimate

#: name -> (estimator, where): "loss" differentiates k; "loss·ρ" differentiates k·π_θ/sg(π_θ) (TRL 1.16's
#: ``use_bias_correction_kl``); "reward" is the score function k·∇log π.
PLACEMENTS = {
    "k1 in loss": ("k1", "loss"),
    "k2 in loss": ("k2", "loss"),
    "k3 in loss (GRPO)": ("k3", "loss"),
    "k3·ρ in loss (TRL 1.16)": ("k3", "loss·ρ"),
    "k1 as reward (PPO-RLHF)": ("k1", "reward"),
    "k2 as reward": ("k2", "reward"),
    "k3 as reward": ("k3", "reward"),
}


def surrogate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, where: str) -> torch.Tensor:
    """Per-sample scalars whose gradients are the per-sample gradient estimates of one placement."""
    if where == "loss":
        return kl_estimate(logp, ref_logp, estimator)
    if where == "loss·ρ":  # ρ = π_θ / π_old has value 1 on-policy, but its gradient is ∇log π
        return kl_estimate(logp, ref_logp, estimator) * torch.exp(logp - logp.detach())
    if where == "reward":  # a reward −k: the loss −(−k)·log π with k a constant
        return kl_estimate(logp.detach(), ref_logp, estimator) * logp
    raise ValueError(f"where must be 'loss', 'loss·ρ' or 'reward', got {where!r}")


def _check_logits(theta: torch.Tensor, ref_logits: torch.Tensor) -> None:
    if not (isinstance(theta, torch.Tensor) and isinstance(ref_logits, torch.Tensor)):
        raise TypeError("theta and ref_logits must be torch tensors")
    if theta.shape != ref_logits.shape or theta.ndim != 1 or theta.numel() < 2:
        raise ValueError(f"theta and ref_logits must be 1-D of one length ≥ 2, got {tuple(theta.shape)} and "
                         f"{tuple(ref_logits.shape)}")
    if theta.dtype != torch.float64 or ref_logits.dtype != torch.float64:
        raise TypeError(f"theta and ref_logits must be float64 (exact identities), got {theta.dtype}, {ref_logits.dtype}")


def exact_kl_gradients(theta: torch.Tensor, ref_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """``∇_θ KL(π_θ‖π_ref)`` and ``∇_θ KL(π_ref‖π_θ)`` by autograd on the exact sums (float64)."""
    _check_logits(theta, ref_logits)
    ref = torch.log_softmax(ref_logits, -1)

    def grad(f):
        t = theta.detach().clone().requires_grad_(True)
        return torch.autograd.grad(f(torch.log_softmax(t, -1)), t)[0]
    return {"KL(π‖ref)": grad(lambda lp: (lp.exp() * (lp - ref)).sum()),
            "KL(ref‖π)": grad(lambda lp: (ref.exp() * (ref - lp)).sum())}


def per_sample_gradients(theta: torch.Tensor, ref_logits: torch.Tensor, name: str) -> torch.Tensor:
    """``[V, V]``: row x is the gradient estimate of placement ``name`` when the sampled token is x."""
    _check_logits(theta, ref_logits)
    estimator, where = PLACEMENTS[name]
    ref = torch.log_softmax(ref_logits, -1)

    def s(t):
        lp = torch.log_softmax(t, -1)
        return surrogate(lp, ref, estimator, where)
    return torch.autograd.functional.jacobian(s, theta.detach().clone())


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two vectors; NaN when either is zero (to float64 rounding: a zero mean is not a direction)."""
    na, nb = a.norm(), b.norm()
    return float("nan") if na <= 1e-12 * nb or nb == 0 else float(a @ b / (na * nb))


def _which(g: torch.Tensor, candidates: dict[str, torch.Tensor], tol: float = 1e-9) -> str:
    """The name of the candidate that ``g`` equals (relative to the largest norm), or ``"none"``."""
    scale = max([g.norm().item()] + [c.norm().item() for c in candidates.values()] + [1e-300])
    for label, c in candidates.items():
        if (g - c).norm().item() <= tol * scale:
            return label
    return "none"


def categorical_placements(theta: torch.Tensor, ref_logits: torch.Tensor) -> list[dict]:
    """One row per placement: its expected gradient against ``∇KL(π‖ref)`` (cosine, norm ratio), which exact
    gradient it equals (``"KL(π‖ref)"``, ``"KL(ref‖π)"``, ``"0"`` or ``"none"``) and its per-sample variance
    (trace of the covariance: the mean of N samples has that over N)."""
    exact = exact_kl_gradients(theta, ref_logits)
    pi = torch.softmax(theta, -1).detach()
    true = exact["KL(π‖ref)"]
    rows = []
    for name in PLACEMENTS:
        g = per_sample_gradients(theta, ref_logits, name)
        mean = pi @ g
        var = float((pi * ((g - mean) ** 2).sum(-1)).sum())
        rows.append({"placement": name, "cos": _cos(mean, true), "norm_ratio": float(mean.norm() / true.norm()),
                     "equals": _which(mean, {**exact, "0": torch.zeros_like(mean)}), "variance": var,
                     "mean": mean})
    return rows


def kl_value(theta: torch.Tensor, ref_logits: torch.Tensor) -> float:
    """Exact ``KL(softmax(θ) ‖ softmax(ref_logits))`` in nats."""
    lp, ref = torch.log_softmax(theta, -1), torch.log_softmax(ref_logits, -1)
    return float((lp.exp() * (lp - ref)).sum())


def distance_sweep(ref_logits: torch.Tensor, direction: torch.Tensor, scales, names=None) -> dict[str, np.ndarray]:
    """Move ``θ = ref_logits + s · direction`` for each ``s`` in ``scales``; arrays of the exact KL and, per
    placement, the cosine and norm ratio of its expected gradient to ``∇KL(π‖ref)``."""
    names = list(names or PLACEMENTS)
    out = {"scale": np.asarray(scales, dtype=float), "kl": []}
    out.update({f"{n}/{k}": [] for n in names for k in ("cos", "norm_ratio")})
    for s in scales:
        theta = ref_logits + float(s) * direction
        out["kl"].append(kl_value(theta, ref_logits))
        by_name = {r["placement"]: r for r in categorical_placements(theta, ref_logits)}
        for n in names:
            out[f"{n}/cos"].append(by_name[n]["cos"])
            out[f"{n}/norm_ratio"].append(by_name[n]["norm_ratio"])
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def monte_carlo(theta: torch.Tensor, ref_logits: torch.Tensor, sample_counts=(1, 4, 16, 64, 256),
                repeats: int = 2000, names=None, seed: int = 0) -> list[dict]:
    """For each placement and sample count N: the mean squared error ``‖ĝ_N − ∇KL(π‖ref)‖²`` of the average of
    N per-sample gradients, measured over ``repeats`` draws, next to its prediction ``bias² + variance / N``."""
    if repeats < 2 or any(int(n) < 1 for n in sample_counts):
        raise ValueError(f"repeats must be ≥ 2 and every sample count ≥ 1, got {repeats} and {tuple(sample_counts)}")
    true = exact_kl_gradients(theta, ref_logits)["KL(π‖ref)"]
    pi = torch.softmax(theta, -1).detach()
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for name in names or PLACEMENTS:
        g = per_sample_gradients(theta, ref_logits, name)
        mean = pi @ g
        bias2 = float(((mean - true) ** 2).sum())
        var = float((pi * ((g - mean) ** 2).sum(-1)).sum())
        for n in sample_counts:
            idx = torch.multinomial(pi, repeats * int(n), replacement=True, generator=gen).view(repeats, int(n))
            est = g[idx].mean(1)  # [repeats, V]
            rows.append({"placement": name, "N": int(n), "mse": float(((est - true) ** 2).sum(-1).mean()),
                         "predicted": bias2 + var / int(n), "bias2": bias2, "variance": var})
    return rows


# --------------------------------------------------------------------------- a few tokens, autoregressive

class TabularLM:
    """An autoregressive policy over sequences of ``length`` tokens from ``vocab``: one logit vector per prefix
    (``theta[context]``), so every sequence and every expectation can be enumerated exactly."""

    def __init__(self, vocab: int = 3, length: int = 3):
        if vocab < 2 or length < 1 or vocab**length > 100_000:
            raise ValueError(f"vocab must be ≥ 2 and length ≥ 1 with vocab**length ≤ 100000, got {vocab}, {length}")
        self.vocab, self.length = vocab, length
        self.seqs = torch.tensor(list(itertools.product(range(vocab), repeat=length)))  # [S, L]
        offsets = [sum(vocab**i for i in range(t)) for t in range(length)]  # contexts before depth t
        ctx = torch.zeros_like(self.seqs)
        for t in range(1, length):  # a prefix's index within its depth, in base `vocab`
            ctx[:, t] = ctx[:, t - 1] * vocab + self.seqs[:, t - 1]
        self.contexts = ctx + torch.tensor(offsets)  # [S, L]: the row of theta that predicts token t
        self.num_contexts = offsets[-1] + vocab ** (length - 1)

    def token_logprobs(self, theta: torch.Tensor) -> torch.Tensor:
        """``[S, L]``: log π(token t | prefix) of every sequence."""
        if theta.shape != (self.num_contexts, self.vocab):
            raise ValueError(f"theta must be [{self.num_contexts}, {self.vocab}] (contexts, vocab), got {tuple(theta.shape)}")
        return torch.log_softmax(theta, -1)[self.contexts, self.seqs]

    def sequence_kl(self, theta: torch.Tensor, ref_theta: torch.Tensor) -> float:
        """The exact ``KL(π_θ‖π_ref)`` between the two distributions over whole sequences, in nats."""
        lp, ref = self.token_logprobs(theta).sum(-1), self.token_logprobs(ref_theta).sum(-1)
        return float((lp.exp() * (lp - ref)).sum())

    def per_position_kl(self, theta: torch.Tensor, ref_theta: torch.Tensor, reverse: bool = False) -> torch.Tensor:
        """``[S, L]``: the exact KL between the next-token distributions at each sequence's prefix."""
        lp, ref = torch.log_softmax(theta, -1), torch.log_softmax(ref_theta, -1)
        a, b = (ref, lp) if reverse else (lp, ref)
        return (a.exp() * (a - b)).sum(-1)[self.contexts]


def _grad(f, theta: torch.Tensor) -> torch.Tensor:
    t = theta.detach().clone().requires_grad_(True)
    return torch.autograd.grad(f(t), t)[0].flatten()


#: sequence-level placements: name -> (estimator, where); "reward-to-go" credits token t with the k1 of tokens ≥ t
#: (PPO with GAE at γ = λ = 1), "sequence reward" credits every token with the sequence's summed k1 (TRL's RLOO),
#: "own token" credits token t with its own k1 only.
SEQUENCE_PLACEMENTS = {
    "k1 in loss": ("k1", "loss"),
    "k2 in loss": ("k2", "loss"),
    "k3 in loss (GRPO)": ("k3", "loss"),
    "k3·ρ in loss (TRL 1.16)": ("k3", "loss·ρ"),
    "k1 as reward, reward-to-go (PPO)": ("k1", "to-go"),
    "k1 as reward, sequence sum (RLOO)": ("k1", "sum"),
    "k1 as reward, own token only": ("k1", "own"),
}


def _sequence_surrogate(lm: TabularLM, t: torch.Tensor, ref_theta: torch.Tensor, estimator: str, where: str):
    lp, ref = lm.token_logprobs(t), lm.token_logprobs(ref_theta)  # [S, L]
    if where in ("loss", "loss·ρ"):
        return surrogate(lp, ref, estimator, where).sum(-1)
    k = kl_estimate(lp.detach(), ref, estimator)
    credit = {"to-go": k.flip(-1).cumsum(-1).flip(-1), "sum": k.sum(-1, keepdim=True).expand_as(k), "own": k}[where]
    return (credit * lp).sum(-1)


def sequence_placements(lm: TabularLM, theta: torch.Tensor, ref_theta: torch.Tensor) -> list[dict]:
    """One row per :data:`SEQUENCE_PLACEMENTS` entry: its exact expected gradient against the true gradient of the
    sequence-level ``KL(π_θ‖π_ref)`` (over whole sequences), and which exact gradient it equals: the sequence KL
    in either direction, or the per-position KL with the prefixes' distribution held fixed (``sg``) in either
    direction — the gradient a per-token loss term can reach — and the per-sequence variance (trace)."""
    if theta.dtype != torch.float64 or ref_theta.dtype != torch.float64:
        raise TypeError("theta and ref_theta must be float64 (exact identities)")
    pi = lm.token_logprobs(theta).sum(-1).exp().detach()  # [S]: π(sequence)

    def seq_kl(reverse):
        def f(t):
            lp, ref = lm.token_logprobs(t).sum(-1), lm.token_logprobs(ref_theta).sum(-1)
            return (ref.exp() * (ref - lp)).sum() if reverse else (lp.exp() * (lp - ref)).sum()
        return f
    candidates = {"seq KL(π‖ref)": _grad(seq_kl(False), theta), "seq KL(ref‖π)": _grad(seq_kl(True), theta),
                  "per-position KL(π‖ref), sg(prefix)": _grad(
                      lambda t: (pi[:, None] * lm.per_position_kl(t, ref_theta)).sum(), theta),
                  "per-position KL(ref‖π), sg(prefix)": _grad(
                      lambda t: (pi[:, None] * lm.per_position_kl(t, ref_theta, reverse=True)).sum(), theta)}
    true = candidates["seq KL(π‖ref)"]
    rows = []
    for name, (estimator, where) in SEQUENCE_PLACEMENTS.items():
        g = torch.autograd.functional.jacobian(  # [S, contexts · vocab]: one gradient estimate per sequence
            lambda t: _sequence_surrogate(lm, t, ref_theta, estimator, where), theta.detach().clone()).flatten(1)
        mean = pi @ g
        rows.append({"placement": name, "cos": _cos(mean, true), "norm_ratio": float(mean.norm() / true.norm()),
                     "equals": _which(mean, {**candidates, "0": torch.zeros_like(mean)}),
                     "variance": float((pi * ((g - mean) ** 2).sum(-1)).sum()), "mean": mean})
    return rows


def placement_table(rows: list[dict], variance: bool = True) -> str:
    """The rows of :func:`categorical_placements` or :func:`sequence_placements` as aligned text."""
    width = max(len(r["placement"]) for r in rows) + 2
    head = f"{'placement':{width}s}{'cos':>7s}{'|E g|/|∇KL|':>13s}" + (f"{'var/sample':>12s}" if variance else "")
    lines = [head + "   expected gradient equals ∇ of"]
    for r in rows:
        cos = "  n/a" if math.isnan(r["cos"]) else f"{r['cos']:7.3f}"
        v = f"{r['variance']:12.4f}" if variance and "variance" in r else ""
        lines.append(f"{r['placement']:{width}s}{cos:>7s}{r['norm_ratio']:13.3f}{v}   {r['equals']}")
    return "\n".join(lines)


__all__ = ["PLACEMENTS", "SEQUENCE_PLACEMENTS", "TabularLM", "categorical_placements", "distance_sweep",
           "exact_kl_gradients", "kl_value", "monte_carlo", "per_sample_gradients", "placement_table",
           "sequence_placements", "surrogate"]
