"""Compiled fast paths for the sparse normalisers: fused kernels made with ``torch.compile`` (Triton on GPU, C++
on CPU), used on GPUs and where the native CPU kernels (``native.py``) cannot be built.

Each compiled forward runs a fixed number of threshold iterations inside one fused kernel, so a row stays in
cache across iterations, then returns a per-row ``converged`` flag. Exactness does not depend on the iteration
count: rows that have not provably converged (and alpha-entmax rows whose alpha lies outside (1, 2]) are finished
by the exact eager solvers (``solvers.py``). Every iteration starts from the lower bound
``max(-1, mean(z) - n**(-1/p))`` (power-mean inequality), close to the root for the near-uniform rows of freshly
initialised models. The backward kernels are the eager closed forms of ``solvers.py``, compiled.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vitscope.attention import solvers
from vitscope.compiled import compiled

# below this many elements a fused kernel does not pay for its launch and compile cost
MIN_ELEMENTS = 1 << 15
# threshold passes per kernel; under a deferred exactness check (``exactness.py``: no eager finish) more, since
# unproven rows then stay approximate, and on a GPU a pass over a row held on chip costs little
PASSES = {"entmax15": 3, "sparsemax": 3, "alpha": 6}
DEFERRED_PASSES = {"entmax15": 8, "sparsemax": 8, "alpha": 12}


def takes(x: Tensor, any_size: bool = False) -> bool:
    """Whether the compiled kernels should run on ``x``: float32/16 or bfloat16, and large enough to pay for a
    launch unless ``any_size`` (a deferred check, where the eager solver's host reads are what must go)."""
    return (any_size or x.numel() >= MIN_ELEMENTS) and x.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _lower_bound(z: Tensor, power: float | Tensor) -> Tensor:
    """max(-1, mean(z) - n**(-1/power)): below the threshold for every row whose maximum is 0 (a row with
    -inf entries has mean -inf and falls back to -1)."""
    return (z.mean(dim=-1, keepdim=True) - z.shape[-1] ** (-1.0 / power)).clamp(min=-1.0)


def _entmax15_forward(x: Tensor, passes: int) -> tuple[Tensor, Tensor]:
    x = x.float()
    z = (x - x.amax(dim=-1, keepdim=True)) * 0.5
    tau = _lower_bound(z, 2.0)
    for _ in range(passes):  # Newton on ||[z - tau]_+||_2 - 1, from below
        gap = (z - tau).clamp(min=0.0)
        s1 = gap.sum(dim=-1, keepdim=True)
        s2 = (gap * gap).sum(dim=-1, keepdim=True)
        tau = tau + (s2 - s2.sqrt()) / s1
    gap = (z - tau).clamp(min=0.0)
    inside = gap > 0
    size = inside.sum(dim=-1, keepdim=True).to(z.dtype)
    s1 = gap.sum(dim=-1, keepdim=True)
    s2 = (gap * gap).sum(dim=-1, keepdim=True)
    smallest = torch.where(inside, z, torch.inf).amin(dim=-1, keepdim=True)  # same pass as the sums
    exact = tau + (s1 - (s1 * s1 - size * (s2 - 1.0)).clamp(min=0.0).sqrt()) / size
    # exact is the root on the support of tau (a superset of the true one), hence >= the true threshold;
    # it is the true threshold iff it keeps that whole support, i.e. the support's smallest entry stays above it
    converged = smallest > exact
    return (z - exact).clamp(min=0.0).square(), converged


def _sparsemax_forward(x: Tensor, passes: int) -> tuple[Tensor, Tensor]:
    x = x.float()
    z = x - x.amax(dim=-1, keepdim=True)
    tau = _lower_bound(z, 1.0)
    for _ in range(passes):  # Michelot: the closed form on the current support, as a Newton step
        gap = (z - tau).clamp(min=0.0)
        tau = tau + (gap.sum(dim=-1, keepdim=True) - 1.0) / (gap > 0).sum(dim=-1, keepdim=True).to(z.dtype)
    gap = (z - tau).clamp(min=0.0)
    inside = gap > 0
    size = inside.sum(dim=-1, keepdim=True).to(z.dtype)
    exact = tau + (gap.sum(dim=-1, keepdim=True) - 1.0) / size
    smallest = torch.where(inside, z, torch.inf).amin(dim=-1, keepdim=True)  # same pass as the sums
    # Michelot's iterates only rise, so entries outside the support of tau lie below exact; exact is the
    # true threshold iff it keeps the whole support of tau
    converged = smallest > exact
    return (z - exact).clamp(min=0.0), converged


def _alpha_forward(x: Tensor, alpha: Tensor, passes: int) -> tuple[Tensor, Tensor]:
    """alpha (..., 1) float32, one per row; rows with alpha outside (1, 2] come back unconverged."""
    valid = (alpha > 1.0) & (alpha <= 2.0)
    scale = torch.where(valid, alpha - 1.0, 0.5)
    power = 1.0 / scale
    x = x.float()
    z = (x - x.amax(dim=-1, keepdim=True)) * scale
    tau = _lower_bound(z, power)
    step = torch.zeros_like(tau)
    for _ in range(passes):  # Newton on ||[z - tau]_+||_p - 1, from below
        gap = (z - tau).clamp(min=0.0)
        gap_pm1 = torch.where(gap > 0, gap.pow(power - 1.0), 0.0)
        total = (gap_pm1 * gap).sum(dim=-1, keepdim=True)
        step = (total - total.pow(1.0 - 1.0 / power)) / gap_pm1.sum(dim=-1, keepdim=True)
        tau = tau + step
    y = (z - tau).clamp(min=0.0).pow(power)
    converged = (step.abs() <= 16 * torch.finfo(torch.float32).eps) & valid
    return y / y.sum(dim=-1, keepdim=True), converged


FORWARDS = {"entmax15": _entmax15_forward, "sparsemax": _sparsemax_forward, "alpha": _alpha_forward}


def forward(kind: str, x: Tensor, alpha: Tensor | None = None, deferred: bool = False) -> tuple[Tensor, Tensor]:
    """Compiled probabilities (float32) along the last dim and per-row ``converged`` flags (x.shape[:-1]);
    ``alpha`` (..., 1) float32 for kind "alpha"; ``deferred``: the pass count of a deferred exactness check."""
    args = (x,) if kind != "alpha" else (x, alpha.to(torch.float32).expand(*x.shape[:-1], 1).contiguous())
    passes = (DEFERRED_PASSES if deferred else PASSES)[kind]
    y, converged = compiled(FORWARDS[kind], dynamic=False, passes=passes)(*args)
    return y, converged[..., 0]


def backward(kind: str, grad: Tensor, y: Tensor, alpha: Tensor | None = None,
             alpha_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """The closed-form VJPs of ``solvers.py``, compiled (y float32)."""
    if kind == "sparsemax":
        return compiled(solvers.sparsemax_backward, dynamic=False)(grad, y), None
    if kind == "entmax15":
        return compiled(solvers.entmax15_backward, dynamic=False)(grad, y), None
    alpha = alpha.to(y.dtype).expand(*y.shape[:-1], 1).contiguous()
    if alpha_grad:
        return compiled(solvers.alpha_backward_with_alpha, dynamic=False)(grad, y, alpha)
    return compiled(solvers.alpha_backward, dynamic=False)(grad, y, alpha), None
