"""Attention normalisers: softmax, sparsemax, entmax-1.5 and alpha-entmax (any alpha > 0, float or tensor,
learnable), as functions and modules.

Every mapping turns logits ``x`` into probabilities along ``dim``; the algorithms are in ``solvers.py`` (exact
eager solvers, the readable twins), ``native.py`` and ``fused.py`` (fast paths, chosen per call as ``paths.py``
says, through the custom ops of ``ops.py``). Half-precision inputs are computed in float32 and returned in their
own dtype; float64 stays float64 (used by gradcheck). Integer inputs are refused. NaN in a row makes the row NaN.
The backward passes are closed-form and save only the output, as in the ``entmax`` package; alpha-entmax also
has the closed-form gradient with respect to alpha.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from vitscope.attention import ops  # noqa: F401  (registers the vitscope:: custom ops)
from vitscope.attention.paths import current
from vitscope.attention.solvers import compute_dtype


def _check_input(x: Tensor, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} takes a torch.Tensor of logits, not {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} got a {x.dtype} tensor; logits must be floating point: pass x.float()")


def _to_last(x: Tensor, dim: int) -> Tensor:
    return x if dim in (-1, x.dim() - 1) else x.transpose(dim, -1)


def _normalize(x: Tensor, dim: int, kind: str, alpha: Tensor | None = None, compiled_path: bool = True) -> Tensor:
    """Run ``kind`` along ``dim``; ``alpha`` already broadcasts to (x moved to the last dim).shape[:-1] + (1,).
    ``compiled_path=False`` keeps the call off the compiled kernels (which cannot solve it)."""
    last = _to_last(x, dim)
    if last.numel() == 0:
        return x.clone()
    paths = current()
    y = torch.ops.vitscope.sparse_normalize(last, alpha, kind, paths.native, paths.compiled and compiled_path,
                                            paths.deferred_check)
    return _to_last(y.to(x.dtype), dim)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim`` (computed in float32 for half inputs)."""
    _check_input(x, "softmax")
    return torch.softmax(x, dim=dim, dtype=compute_dtype(x)).to(x.dtype)


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    """Sparsemax (Martins & Astudillo, 2016): the Euclidean projection of x onto the simplex."""
    _check_input(x, "sparsemax")
    return _normalize(x, dim, "sparsemax")


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    """Entmax with alpha = 1.5 (Peters et al., 2019), computed exactly."""
    _check_input(x, "entmax15")
    return _normalize(x, dim, "entmax15")


def check_alpha(alpha: float) -> float:
    """Return alpha as a float, or raise ValueError when it is not a finite number above 0."""
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"entmax alpha={alpha!r} is not a number; pick alpha > 0 (1.5, say)") from None
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"entmax alpha={value:g} must be a finite number above 0 (1 is softmax, 2 sparsemax)")
    return value


def _row_alpha(alpha: Tensor, x: Tensor, dim: int) -> Tensor:
    """alpha with x's rank and size 1 along ``dim``, moved to the last dim, in the compute dtype: not expanded to
    the rows (the kernels read a per-head alpha as it is, and return its gradient per head)."""
    if not alpha.is_floating_point():
        raise TypeError(f"entmax alpha is a {alpha.dtype} tensor; pass a floating-point tensor")
    target = list(x.shape)
    target[dim] = 1
    try:
        alpha.expand(target)  # a view, only to check that alpha broadcasts
    except RuntimeError:
        raise ValueError(f"entmax alpha of shape {tuple(alpha.shape)} does not broadcast to {tuple(target)} "
                         f"(x {tuple(x.shape)} with size 1 along dim {dim})") from None
    alpha = alpha[(None,) * (len(target) - alpha.dim())]
    return _to_last(alpha.to(device=x.device, dtype=compute_dtype(x)), dim)


def entmax(x: Tensor, alpha: float | Tensor = 1.5, dim: int = -1) -> Tensor:
    """alpha-entmax along ``dim`` for any alpha > 0: a float, or a tensor broadcastable to ``x`` with size 1
    along ``dim`` (one alpha per row; differentiable). alpha = 1 is softmax, 1.5 entmax-1.5, 2 sparsemax."""
    _check_input(x, "entmax")
    if isinstance(alpha, Tensor):
        return _normalize(x, dim, "alpha", _row_alpha(alpha, x, dim))
    alpha = check_alpha(alpha)
    if alpha == 1.0:
        return softmax(x, dim)
    if alpha == 1.5:
        return entmax15(x, dim)
    if alpha == 2.0:
        return sparsemax(x, dim)
    one_value = torch.full([1] * x.dim(), alpha, dtype=compute_dtype(x), device=x.device)  # broadcast, not copied
    # the compiled kernels solve alpha in (1, 2] only: other alphas go to the exact solvers without a try
    return _normalize(x, dim, "alpha", one_value, compiled_path=1.0 < alpha <= 2.0)


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
    """alpha-entmax with a fixed alpha > 0."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = check_alpha(alpha)
        self.name = f"entmax:{self.alpha:g}"

    def forward(self, x: Tensor) -> Tensor:
        return entmax(x, self.alpha)
