"""Fast paths for the sparse normalisers: native kernels (``native.py``) on CPUs, and elsewhere (GPUs, or
where no C++ compiler works) fused kernels compiled with ``torch.compile`` (Triton on GPU, C++ on CPU).

Each compiled forward runs a fixed number of threshold iterations inside one fused kernel, so a row stays in
cache across iterations, then returns a per-row ``converged`` flag. Exactness does not depend on the
iteration count: rows that have not provably converged are finished by the exact eager solvers in
``normalizers.py``. Every iteration starts from the lower bound ``max(-1, mean(z) - n**(-1/p))`` (power-mean
inequality), which is close to the root for the near-uniform rows of freshly initialised models.

Disable with ``VITSCOPE_FUSED=0`` or ``set_fused(False)`` to use the eager solvers alone (this switches the
native kernels off too); where compilation fails (no C++ compiler, say) the same kernels run eagerly
(``vitscope.compiled``).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from vitscope.attention import native
from vitscope.compiled import compiled

# below this many elements a fused kernel does not pay for its launch and compile cost
MIN_ELEMENTS = 1 << 15
ENTMAX15_ITERS = 3
SPARSEMAX_ITERS = 3
ALPHA_ITERS = 6

_enabled = os.environ.get("VITSCOPE_FUSED", "1") != "0"


def set_fused(enabled: bool) -> None:
    """Turn the compiled fast paths on or off for this process."""
    global _enabled
    _enabled = enabled


def use_fused(x: Tensor) -> bool:
    return _enabled and x.numel() >= MIN_ELEMENTS and x.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _lower_bound(z: Tensor, power: float) -> Tensor:
    """max(-1, mean(z) - n**(-1/power)): below the threshold for every row whose maximum is 0 (a row with
    -inf entries has mean -inf and falls back to -1)."""
    return (z.mean(dim=-1, keepdim=True) - z.shape[-1] ** (-1.0 / power)).clamp(min=-1.0)


def _entmax15_forward(x: Tensor) -> tuple[Tensor, Tensor]:
    z = x.float() * 0.5
    z = z - z.amax(dim=-1, keepdim=True)
    tau = _lower_bound(z, 2.0)
    for _ in range(ENTMAX15_ITERS):  # Newton on ||[z - tau]_+||_2 - 1, from below
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


def _sparsemax_forward(x: Tensor) -> tuple[Tensor, Tensor]:
    z = x.float()
    z = z - z.amax(dim=-1, keepdim=True)
    tau = _lower_bound(z, 1.0)
    for _ in range(SPARSEMAX_ITERS):  # Michelot: the closed form on the current support, as a Newton step
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


def _alpha_forward(x: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
    power = 1.0 / (alpha - 1.0)
    z = x.float() * (alpha - 1.0)
    z = z - z.amax(dim=-1, keepdim=True)
    tau = _lower_bound(z, power)
    step = torch.zeros_like(tau)
    for _ in range(ALPHA_ITERS):  # Newton on ||[z - tau]_+||_p - 1, from below
        gap = (z - tau).clamp(min=0.0)
        gap_pm1 = gap.pow(power - 1.0)
        total = (gap_pm1 * gap).sum(dim=-1, keepdim=True)
        step = (total - total.pow(1.0 - 1.0 / power)) / gap_pm1.sum(dim=-1, keepdim=True)
        tau = tau + step
    y = (z - tau).clamp(min=0.0).pow(power)
    converged = step.abs() <= 16 * torch.finfo(torch.float32).eps
    return y / y.sum(dim=-1, keepdim=True), converged


def _entmax_backward(grad: Tensor, y: Tensor, exponent: float) -> Tensor:
    """Closed-form VJP of alpha-entmax, w = y**(2 - alpha) on the support: w g - w sum(w g) / sum(w)."""
    weight = torch.where(y > 0, y.pow(exponent), 0.0) if exponent != 0.5 else y.sqrt()
    wg = weight * grad.to(y.dtype)
    return wg - weight * (wg.sum(dim=-1, keepdim=True) / weight.sum(dim=-1, keepdim=True))


def _sparsemax_backward(grad: Tensor, y: Tensor) -> Tensor:
    """Closed-form VJP of sparsemax: g minus its mean over the support, zero outside."""
    inside = y > 0
    g = torch.where(inside, grad.to(y.dtype), 0.0)
    mean = g.sum(dim=-1, keepdim=True) / inside.sum(dim=-1, keepdim=True)
    return torch.where(inside, g - mean, 0.0)


KERNELS = {"entmax15": _entmax15_forward, "sparsemax": _sparsemax_forward, "alpha": _alpha_forward,
            "entmax_backward": _entmax_backward, "sparsemax_backward": _sparsemax_backward}


def run_kernel(name: str, *tensors: Tensor, **constants: float):
    """Run kernel ``name`` of ``KERNELS`` compiled, with ``constants`` baked in (eagerly where compiling fails)."""
    return compiled(KERNELS[name], dynamic=False, **constants)(*tensors)


def backward(kind: str, grad: Tensor, y: Tensor, alpha: float) -> Tensor:
    """Closed-form VJP of a sparse normaliser with output ``y`` (compute dtype): native where it applies, the
    compiled kernel for tensors of at least MIN_ELEMENTS, else the same kernel eagerly."""
    if _enabled and native.applies(y, kind):
        return native.backward(kind, grad, y, alpha)
    if kind == "sparsemax":
        name, constants = "sparsemax_backward", {}
    else:  # w = y ** (2 - alpha) on the support: w * g - w * sum(w * g) / sum(w)
        name, constants = "entmax_backward", {"exponent": 2.0 - alpha}
    if use_fused(y):
        return run_kernel(name, grad, y, **constants)
    return KERNELS[name](grad, y, **constants)


def fast_forward(kind: str, x: Tensor, **constants: float) -> tuple[Tensor, Tensor] | None:
    """Probabilities and per-row ``converged`` flags from the fastest path that takes ``x``: the native CPU
    kernel (any size), else the compiled kernel for tensors of at least MIN_ELEMENTS;
    None where neither applies (fast paths off, float64, small tensors), for the caller's eager solver."""
    if not _enabled:
        return None
    if native.applies(x, kind):
        return native.forward(kind, x, **constants)
    if use_fused(x):
        return run_kernel(kind, x, **constants)
    return None
