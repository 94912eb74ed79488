"""The machinery of TRPO (Schulman et al. 2015, arXiv:1502.05477, appendix C).

TRPO maximises the surrogate g·Δθ subject to ½ Δθᵀ F Δθ ≤ δ, F being the Fisher information
(the Hessian of the mean KL between the old and new policy at Δθ = 0). The solution is along the
natural gradient F⁻¹g, found without ever forming F:

- ``fisher_vector_product``: v ↦ (F + damping·I) v by differentiating (∇KL · v) once more;
- ``conjugate_gradient``: solves F x = g from such products alone, in a few iterations, stopping
  on a residual relative to ‖g‖ (so the direction does not depend on the gradient's scale);
- ``backtracking_line_search``: shrinks the step until the surrogate really improves and the
  measured mean KL stays within δ (the quadratic model can be wrong).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def flat_params(params: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def set_flat_params(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Write a flat vector back into the parameters (in place, no autograd history)."""
    i = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[i: i + n].view_as(p))
            i += n
    if i != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} entries, parameters have {i}")


def flat_grad(output: torch.Tensor, params: Sequence[torch.Tensor], create_graph: bool = False,
              retain_graph: bool | None = None) -> torch.Tensor:
    grads = torch.autograd.grad(output, list(params), create_graph=create_graph, retain_graph=retain_graph,
                                allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)])


def conjugate_gradient(
    Avp: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iters: int = 10,
    tol: float = 1e-5,
) -> torch.Tensor:
    """Solve ``A x = b`` for symmetric positive-definite A, given only ``Avp(v) = A v``.

    Each iteration costs one product; in exact arithmetic it converges in at most ``len(b)``
    iterations, and TRPO stops after ~10 because a rough natural-gradient direction is enough.
    Stops early, at the top of an iteration, once the residual is small *relative to b*:
    ‖b − A x‖ ≤ ``tol``·‖b‖ (tested as rᵀr ≤ tol²·bᵀb, so b = 0 returns x = 0 at once). The rule
    does not depend on the scale of b (in exact arithmetic c·b gives c·x for any c > 0), so a tiny
    policy gradient still gets its natural-gradient direction, where an absolute threshold would
    return x = 0 for it.
    """
    if b.ndim != 1:
        raise ValueError(f"conjugate_gradient expects a flat vector b, got shape {tuple(b.shape)}")
    if not tol >= 0:
        raise ValueError(f"conjugate_gradient: tol must be >= 0 (a relative residual), got {tol}")
    if not bool(torch.isfinite(b).all()):
        raise ValueError("conjugate_gradient: b contains NaN or inf")
    x = torch.zeros_like(b)
    r = b.clone()  # residual b - A x with x = 0
    p = b.clone()  # search direction
    rr = r @ r
    stop = tol * tol * rr  # ‖r‖² ≤ tol²·‖b‖²
    for _ in range(iters):
        if rr <= stop:
            break
        Ap = Avp(p)
        pAp = p @ Ap
        if pAp <= 0:
            raise ValueError("conjugate_gradient: A is not positive definite along a search direction "
                             "(add damping to the Fisher-vector product)")
        alpha = rr / pAp
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = r @ r
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def trust_region_step(Avp: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, max_kl: float) -> torch.Tensor:
    """TRPO's full step ``sqrt(2δ / xᵀAx) · x`` along a direction ``x ≈ A⁻¹g`` (from conjugate gradient).

    Under the quadratic model ½ sᵀAs of the KL, the step lands exactly on the trust-region boundary δ,
    whatever the scale of ``x`` (no floor on xᵀAx, which would shrink the step of a tiny gradient).
    A zero direction gives a zero step.
    """
    xAx = x @ Avp(x)
    return torch.sqrt(2 * max_kl / xAx) * x if xAx > 0 else torch.zeros_like(x)


def fisher_vector_product(
    mean_kl: Callable[[], torch.Tensor],
    params: Sequence[torch.Tensor],
    damping: float = 0.1,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return ``v ↦ (F + damping·I) v``, F being the Hessian of ``mean_kl()`` w.r.t. ``params``.

    ``mean_kl()`` must compute the mean KL(π_old ‖ π_θ) with π_old held fixed (detached), so that
    at θ = θ_old its value and gradient are 0 and its Hessian is the Fisher information. The
    product is "double backprop": g(θ) = ∇KL (kept differentiable), then ∇(g · v).
    """
    params = list(params)
    kl = mean_kl()
    grad = flat_grad(kl, params, create_graph=True)

    def fvp(v: torch.Tensor) -> torch.Tensor:
        return flat_grad(grad @ v.detach(), params, retain_graph=True) + damping * v

    return fvp


def backtracking_line_search(
    surrogate: Callable[[], float],
    mean_kl: Callable[[], float],
    params: Sequence[torch.Tensor],
    full_step: torch.Tensor,
    expected_improvement: float,
    max_kl: float,
    max_backtracks: int = 10,
    shrink: float = 0.5,
    accept_ratio: float = 0.1,
) -> tuple[bool, float]:
    """Try θ_old + shrink^k · full_step for k = 0, 1, ...; keep the first step whose surrogate
    improvement is positive (and at least ``accept_ratio`` of the linear prediction) and whose
    measured mean KL is ≤ ``max_kl``. If none qualifies, restore θ_old.

    ``surrogate()`` and ``mean_kl()`` evaluate the current parameters (no gradient needed);
    ``expected_improvement`` is g·full_step. Returns (accepted, step fraction used; 0 if rejected).
    """
    params = list(params)
    old = flat_params(params)
    base = surrogate()
    fraction = 1.0
    for _ in range(max_backtracks):
        set_flat_params(params, old + fraction * full_step)
        improvement = surrogate() - base
        kl = mean_kl()
        if kl <= max_kl and improvement > 0 and improvement >= accept_ratio * fraction * expected_improvement:
            return True, fraction
        fraction *= shrink
    set_flat_params(params, old)
    return False, 0.0
