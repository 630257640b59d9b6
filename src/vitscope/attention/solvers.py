"""The exact eager solvers of the sparse normalisers and their closed-form backward passes, on the last dim.

The alpha-entmax family (Peters et al., 2019) maps logits x (..., n) to

    p_i = [z_i - tau]_+ ** (1 / (alpha - 1)),   z = (alpha - 1) * (x - max(x)),   tau such that sum_i p_i = 1.

Every solver shifts by the row maximum before scaling, so a common offset (a masked row of -1e9, say) costs
no digits. alpha = 2 is sparsemax and alpha = 1.5 entmax-1.5; the threshold is found without sorting:

* sparsemax: Michelot's support iteration from the lower bound ``-1``; exact once the support stops shrinking;
* entmax-1.5: Newton steps from below (the residual is convex and decreasing in tau), finished by the
  closed-form root on the support, accepted only when that root keeps the support it was computed on;
* alpha in (1, 2): Newton on the p-norm form ``||[z - tau]_+||_p - 1`` with p = 1 / (alpha - 1) (convex, so
  monotone from below, a handful of steps), then the output is renormalised;
* any other alpha > 0 (as the ``entmax`` package accepts): bisection on tau as the package does it (for alpha < 1
  every key keeps some mass), renormalised; alpha = 1 is softmax.

``-inf`` logits get probability 0; NaN in a row makes that row NaN. Inputs here are in the compute dtype
(float32, or float64). The backward passes save only the output, as in the ``entmax`` package.
"""

from __future__ import annotations

import torch
from torch import Tensor

MAX_ITER = 64


def compute_dtype(x: Tensor) -> torch.dtype:
    """float64 stays float64 (gradcheck); every other floating dtype is computed in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def shifted(x: Tensor, scale: float | Tensor) -> Tensor:
    """``scale * (x - max(x))`` along the last dim, in the compute dtype."""
    x = x.to(compute_dtype(x))
    return (x - x.amax(dim=-1, keepdim=True)) * scale


def sparsemax_threshold(z: Tensor) -> Tensor:
    """Exact sparsemax threshold tau (..., 1) for rows z (..., n) whose maximum is 0."""
    tau = torch.full_like(z[..., :1], -1.0)
    support = None
    for _ in range(z.shape[-1] + 1):
        inside = z > tau
        size = inside.sum(dim=-1, keepdim=True)
        if support is not None and torch.equal(size, support):
            break
        total = torch.where(inside, z, 0.0).sum(dim=-1, keepdim=True)
        tau = (total - 1.0) / size
        support = size
    return tau


def entmax15_threshold(z: Tensor) -> Tensor:
    """Exact entmax-1.5 threshold tau (..., 1) for rows z (..., n) whose maximum is 0:
    sum_i [z_i - tau]_+^2 = 1."""
    tau = torch.full_like(z[..., :1], -1.0)
    tol = 4 * torch.finfo(z.dtype).eps
    exact = tau
    for _ in range(MAX_ITER):
        gap = (z - tau).clamp_(min=0.0)
        size = (gap > 0).sum(dim=-1, keepdim=True)
        s1 = gap.sum(dim=-1, keepdim=True)
        s2 = (gap * gap).sum(dim=-1, keepdim=True)
        # closed-form root of sum_{support} (gap_i - u)^2 = 1, the smaller one
        disc = (s1 * s1 - size * (s2 - 1.0)).clamp(min=0.0)
        exact = tau + (s1 - disc.sqrt()) / size
        kept = (z > exact).sum(dim=-1, keepdim=True) == size
        if bool((kept | (exact - tau <= tol)).all()):
            break
        # Newton step on f(tau) = s2 - 1, f'(tau) = -2 s1: stays below the root
        tau = tau + (s2 - 1.0) / (2.0 * s1)
    return exact


def newton_threshold(z: Tensor, power: Tensor) -> Tensor:
    """Threshold tau (..., 1) of alpha-entmax for rows z = (alpha - 1)(x - max), power = 1 / (alpha - 1) >= 1
    (..., 1): Newton's method on ||[z - tau]_+||_p - 1, from below."""
    tau = torch.full_like(z[..., :1], -1.0)
    tol = 16 * torch.finfo(z.dtype).eps
    for _ in range(MAX_ITER):
        gap = (z - tau).clamp_(min=0.0)
        gap_pm1 = torch.where(gap > 0, gap.pow(power - 1.0), 0.0)
        total = (gap_pm1 * gap).sum(dim=-1, keepdim=True)
        step = (total - total.pow(1.0 - 1.0 / power)) / gap_pm1.sum(dim=-1, keepdim=True)
        tau = tau + step
        if bool((step.abs() <= tol).all()):
            break
    return tau


def bisection(x: Tensor, alpha: Tensor) -> Tensor:
    """alpha-entmax by bisection on tau, as the ``entmax`` package computes it, for any alpha > 0 but 1
    (..., 1); renormalised. Enough steps for the dtype's precision; it stops early once the half-interval no
    longer moves any row's tau (tau + step rounds to tau), after which further steps could change nothing."""
    scale = alpha - 1.0
    z = shifted(x, scale)
    power = 1.0 / scale
    tau_lo = torch.full_like(z[..., :1], -1.0).expand_as(scale).clone()
    dm = -(z.new_tensor(1.0 / z.shape[-1]) ** scale) - tau_lo
    p = torch.zeros_like(z)
    for step in range(100 if z.dtype == torch.float64 else 50):
        dm = dm / 2
        middle = tau_lo + dm
        p = (z - middle).clamp(min=0.0).pow(power)
        if step % 8 == 7 and torch.equal(middle, tau_lo):
            break
        tau_lo = torch.where(p.sum(dim=-1, keepdim=True) >= 1.0, middle, tau_lo)
    return p / p.sum(dim=-1, keepdim=True)


def sparsemax_forward(x: Tensor) -> Tensor:
    z = shifted(x, 1.0)
    return (z - sparsemax_threshold(z)).clamp_(min=0.0)


def entmax15_forward(x: Tensor) -> Tensor:
    z = shifted(x, 0.5)
    return (z - entmax15_threshold(z)).clamp_(min=0.0).square_()


def newton_forward(x: Tensor, alpha: Tensor) -> Tensor:
    """alpha-entmax for alpha (..., 1) in (1, 2]."""
    z = shifted(x, alpha - 1.0)
    power = 1.0 / (alpha - 1.0)
    y = (z - newton_threshold(z, power)).clamp_(min=0.0).pow_(power)
    return y / y.sum(dim=-1, keepdim=True)


def alpha_forward(x: Tensor, alpha: Tensor) -> Tensor:
    """alpha-entmax with one alpha per row (..., 1) in the compute dtype: Newton where alpha is in (1, 2],
    softmax where it is 1, bisection elsewhere above 0, NaN where alpha is not positive."""
    alpha = alpha.to(compute_dtype(x)).expand(*x.shape[:-1], 1)
    newton = (alpha > 1.0) & (alpha <= 2.0)
    if bool(newton.all()):
        return newton_forward(x, alpha)
    rows, a = x.reshape(-1, x.shape[-1]), alpha.reshape(-1, 1)
    y = torch.full(rows.shape, float("nan"), dtype=compute_dtype(x), device=x.device)
    soft, fast = (a == 1.0)[:, 0], newton[..., 0].reshape(-1)
    other = ~(soft | fast) & (a[:, 0] > 0)
    for chosen, solve in ((fast, newton_forward), (other, bisection)):
        if bool(chosen.any()):
            y[chosen] = solve(rows[chosen], a[chosen])
    if bool(soft.any()):
        y[soft] = torch.softmax(rows[soft].to(y.dtype), dim=-1)
    return y.view(x.shape)


def forward(kind: str, x: Tensor, alpha: Tensor | None = None) -> Tensor:
    """Probabilities in the compute dtype, along the last dim; ``alpha`` (..., 1) for kind "alpha"."""
    if kind == "sparsemax":
        return sparsemax_forward(x)
    if kind == "entmax15":
        return entmax15_forward(x)
    return alpha_forward(x, alpha)


def sparsemax_backward(grad: Tensor, y: Tensor) -> Tensor:
    """Closed-form VJP of sparsemax: g minus its mean over the support, zero outside."""
    inside = y > 0
    g = torch.where(inside, grad.to(y.dtype), 0.0)
    return torch.where(inside, g - g.sum(dim=-1, keepdim=True) / inside.sum(dim=-1, keepdim=True), 0.0)


def entmax15_backward(grad: Tensor, y: Tensor) -> Tensor:
    """Closed-form VJP of entmax-1.5: w g - w sum(w g) / sum(w) with w = sqrt(y)."""
    weight = y.sqrt()
    wg = weight * grad.to(y.dtype)
    return wg - weight * (wg.sum(dim=-1, keepdim=True) / weight.sum(dim=-1, keepdim=True))


def alpha_backward(grad: Tensor, y: Tensor, alpha: Tensor) -> Tensor:
    """Closed-form VJP of alpha-entmax with respect to x: w g - w sum(w g) / sum(w), w = y ** (2 - alpha) on the
    support."""
    weight = torch.where(y > 0, y.pow(2.0 - alpha.to(y.dtype)), 0.0)
    wg = weight * grad.to(y.dtype)
    return wg - weight * (wg.sum(dim=-1, keepdim=True) / weight.sum(dim=-1, keepdim=True))


def alpha_backward_with_alpha(grad: Tensor, y: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
    """The VJP with respect to x and to each row's alpha (..., 1), in closed form (Correia et al., 2019; the
    ``entmax`` package's formula): with m = sum(w g) / sum(w) and S = sum(y log y),
    d alpha = (sum(g y) - m) / (alpha - 1)**2 - (sum(g y log y) - m S) / (alpha - 1); 0 where alpha = 1."""
    alpha = alpha.to(y.dtype)
    g = grad.to(y.dtype)
    inside = y > 0
    weight = torch.where(inside, y.pow(2.0 - alpha), 0.0)
    mean = (weight * g).sum(dim=-1, keepdim=True) / weight.sum(dim=-1, keepdim=True)
    ylogy = torch.where(inside, y * torch.where(inside, y, 1.0).log(), 0.0)
    am1 = alpha - 1.0
    safe = torch.where(am1 == 0, 1.0, am1)
    d_alpha = ((g * y).sum(dim=-1, keepdim=True) - mean) / (safe * safe) \
        - ((g * ylogy).sum(dim=-1, keepdim=True) - mean * ylogy.sum(dim=-1, keepdim=True)) / safe
    return weight * (g - mean), torch.where(am1 == 0, 0.0, d_alpha)


def backward(kind: str, grad: Tensor, y: Tensor, alpha: Tensor | None = None,
             alpha_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """The VJP with respect to x (y's dtype) and, with ``alpha_grad`` (kind "alpha"), to alpha (..., 1)."""
    if kind == "sparsemax":
        return sparsemax_backward(grad, y), None
    if kind == "entmax15":
        return entmax15_backward(grad, y), None
    if alpha_grad:
        return alpha_backward_with_alpha(grad, y, alpha)
    return alpha_backward(grad, y, alpha), None
