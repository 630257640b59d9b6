"""Attention normalisers: softmax, sparsemax, entmax-1.5 and alpha-entmax.

Every mapping turns logits ``x`` of shape (..., n) into probabilities along ``dim``. The alpha-entmax
family (Peters et al., 2019) is

    p_i = [(alpha - 1) * x_i - tau]_+ ** (1 / (alpha - 1)),   with tau chosen so that sum_i p_i = 1.

alpha = 2 is sparsemax and alpha = 1.5 is entmax-1.5. The threshold ``tau`` is found without sorting:

* sparsemax: Michelot's support iteration from the lower bound ``max - 1``; it is exact once the support
  stops shrinking (finite, usually 3-6 passes);
* entmax-1.5: Newton steps from the same lower bound (they never overshoot, since the residual is convex
  and decreasing in tau), finished by the closed-form root on the support, accepted only when that root
  keeps the support it was computed on; so the result is exact, with exact zeros;
* other alpha: Newton on the p-norm form ``||[z - tau]_+||_p - 1`` (convex and nearly linear, so it
  converges in a handful of steps for any alpha), then the output is renormalised.

``-inf`` logits get probability 0. Half-precision inputs are computed in float32 and returned in their
own dtype; float64 stays float64 (used by gradcheck). The backward passes are closed-form and save only
the output, as in the ``entmax`` package.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitscope.attention import fused

_MAX_ITER = 64


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _shifted(x: Tensor, scale: float) -> Tensor:
    """``scale * x`` in the compute dtype, shifted so that each row's maximum is 0."""
    z = x.to(_compute_dtype(x)) * scale
    return z - z.amax(dim=-1, keepdim=True)


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
    """Exact entmax-1.5 threshold tau (..., 1) for rows z (..., n) whose maximum is 0.

    Solves sum_i [z_i - tau]_+^2 = 1.
    """
    tau = torch.full_like(z[..., :1], -1.0)
    tol = 4 * torch.finfo(z.dtype).eps
    exact = tau
    for _ in range(_MAX_ITER):
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


def entmax_threshold(z: Tensor, alpha: float) -> Tensor:
    """Threshold tau (..., 1) of alpha-entmax for rows z = (alpha - 1) x with maximum 0.

    Newton's method on phi(tau) = ||[z - tau]_+||_p - 1 with p = 1 / (alpha - 1), from below.
    """
    power = 1.0 / (alpha - 1.0)
    tau = torch.full_like(z[..., :1], -1.0)
    tol = 16 * torch.finfo(z.dtype).eps
    for _ in range(_MAX_ITER):
        gap = (z - tau).clamp_(min=0.0)
        gap_pm1 = gap.pow(power - 1.0) if power != 1.0 else (gap > 0).to(gap.dtype)
        total = (gap_pm1 * gap).sum(dim=-1, keepdim=True)
        slope = gap_pm1.sum(dim=-1, keepdim=True)
        step = (total - total.pow(1.0 - 1.0 / power)) / slope
        tau = tau + step
        if bool((step.abs() <= tol).all()):
            break
    return tau


def _eager_sparsemax(x: Tensor) -> Tensor:
    z = _shifted(x, 1.0)
    return (z - sparsemax_threshold(z)).clamp_(min=0.0)


def _eager_entmax15(x: Tensor) -> Tensor:
    z = _shifted(x, 0.5)
    return (z - entmax15_threshold(z)).clamp_(min=0.0).square_()


def _eager_alpha(x: Tensor, alpha: float) -> Tensor:
    z = _shifted(x, alpha - 1.0)
    y = (z - entmax_threshold(z, alpha)).clamp_(min=0.0).pow_(1.0 / (alpha - 1.0))
    return y / y.sum(dim=-1, keepdim=True)


def _solve(x: Tensor, kind: str, eager, **constants: float) -> Tensor:
    """Probabilities in the compute dtype: a fast kernel (native or compiled) where one applies, rows it could
    not prove converged (and every row otherwise) from the exact eager solver."""
    fast = fused.fast_forward(kind, x, **constants)
    if fast is None:
        return eager(x, **constants)
    y, converged = fast
    redo = ~converged.reshape(-1)
    if bool(redo.any()):
        flat = y.view(-1, y.shape[-1])
        flat[redo] = eager(x.reshape(-1, x.shape[-1])[redo], **constants).to(y.dtype)
    return y


_EAGER = {"sparsemax": _eager_sparsemax, "entmax15": _eager_entmax15, "alpha": _eager_alpha}


class _SparseNormalizerFunction(torch.autograd.Function):
    """sparsemax, entmax-1.5 or alpha-entmax with the closed-form backward; saves only the output."""

    @staticmethod
    def forward(ctx, x: Tensor, kind: str, alpha: float) -> Tensor:
        constants = {"alpha": alpha} if kind == "alpha" else {}
        y = _solve(x, kind, _EAGER[kind], **constants)
        ctx.kind, ctx.alpha = kind, alpha
        ctx.save_for_backward(y)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (y,) = ctx.saved_tensors
        return fused.backward(ctx.kind, grad, y, ctx.alpha).to(grad.dtype), None, None


def _along_last(fn, x: Tensor, dim: int, *args) -> Tensor:
    if dim in (-1, x.dim() - 1):
        return fn(x, *args)
    return fn(x.transpose(dim, -1), *args).transpose(dim, -1)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim`` (computed in float32 for half inputs)."""
    return torch.softmax(x, dim=dim, dtype=_compute_dtype(x)).to(x.dtype)


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    """Sparsemax (Martins & Astudillo, 2016): the Euclidean projection of x onto the simplex."""
    return _along_last(_SparseNormalizerFunction.apply, x, dim, "sparsemax", 2.0)


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    """Entmax with alpha = 1.5 (Peters et al., 2019), computed exactly."""
    return _along_last(_SparseNormalizerFunction.apply, x, dim, "entmax15", 1.5)


def check_alpha(alpha: float) -> float:
    """Return alpha as a float, or raise ValueError when it lies outside (1, 2]."""
    alpha = float(alpha)
    if not 1.0 < alpha <= 2.0:
        raise ValueError(
            f"entmax alpha={alpha:g} is outside (1, 2]; use 'softmax' for alpha=1 or pick 1 < alpha <= 2"
        )
    return alpha


def entmax(x: Tensor, alpha: float, dim: int = -1) -> Tensor:
    """alpha-entmax for alpha in (1, 2]; alpha = 1.5 and 2 use the exact closed-form solvers."""
    alpha = check_alpha(alpha)
    if alpha == 2.0:
        return sparsemax(x, dim)
    if alpha == 1.5:
        return entmax15(x, dim)
    return _along_last(_SparseNormalizerFunction.apply, x, dim, "alpha", alpha)


class Normalizer(nn.Module):
    """Maps attention logits (..., n) to probabilities along the last dim; ``name`` is its spec."""

    name: str = ""
    is_softmax: bool = False

    def extra_repr(self) -> str:
        return repr(self.name)


class Softmax(Normalizer):
    name, is_softmax = "softmax", True

    def forward(self, x: Tensor) -> Tensor:
        return softmax(x)


class Sparsemax(Normalizer):
    name = "sparsemax"

    def forward(self, x: Tensor) -> Tensor:
        return sparsemax(x)


class Entmax15(Normalizer):
    name = "entmax15"

    def forward(self, x: Tensor) -> Tensor:
        return entmax15(x)


class EntmaxAlpha(Normalizer):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = check_alpha(alpha)
        self.name = f"entmax:{self.alpha:g}"

    def forward(self, x: Tensor) -> Tensor:
        return entmax(x, self.alpha)


NORMALIZER_NAMES = ("softmax", "sparsemax", "entmax15", "entmax:ALPHA")


def make_normalizer(spec: str) -> Normalizer:
    """Build a normaliser from its spec: 'softmax', 'sparsemax', 'entmax15' or 'entmax:ALPHA'."""
    key = str(spec).strip().lower()
    simple = {"softmax": Softmax, "sparsemax": Sparsemax, "entmax15": Entmax15, "entmax1.5": Entmax15}
    if key in simple:
        return simple[key]()
    if key.startswith("entmax:"):
        try:
            alpha = float(key.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"attention normaliser {spec!r}: alpha must be a number, e.g. 'entmax:1.3'") from None
        alpha = check_alpha(alpha)
        if alpha == 1.5:
            return Entmax15()
        if alpha == 2.0:
            return Sparsemax()
        return EntmaxAlpha(alpha)
    raise ValueError(f"unknown attention normaliser {spec!r}; choose one of {', '.join(NORMALIZER_NAMES)}")
