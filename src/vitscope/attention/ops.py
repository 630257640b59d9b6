"""The sparse normalisers as ``torch.library`` custom ops (``vitscope::sparse_normalize`` and its backward),
with fake (meta) implementations and registered autograd, so that ``torch.compile`` traces through them.

Each op takes its path explicitly (``native``, ``compiled``; the callers pass ``paths.current()``) and picks, per
call: the native CPU kernel, else the compiled kernel for large tensors, else the exact eager solver; rows a
fast kernel could not prove exact are finished by the eager solver. A fast kernel that raises (a stale build,
a transient out-of-memory) hands that call to the next path with a warning and switches nothing else off.
Rows run along the last dim; probabilities come back in the compute dtype (float32, or float64), or in bfloat16
for bfloat16 logits (the native kernels read and write it without a conversion pass).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from vitscope.attention import exactness, fused, native, solvers


def _fast_forward(x: Tensor, alpha: Tensor | None, kind: str, use_native: bool,
                  use_compiled: bool, deferred: bool) -> tuple[Tensor, Tensor, str] | None:
    """(probabilities, per-row converged flags, the path that answered: "native" or "compiled") or None."""
    if x.dtype == torch.float64:
        return None
    if use_native and native.kernels().runs_on(x):
        try:
            return *native.forward(kind, x, alpha), "native"
        except RuntimeError as err:
            warnings.warn(f"vitscope: native {kind} failed ({err}); this call takes the next path", stacklevel=3)
    if use_compiled and fused.takes(x, any_size=deferred):
        return *fused.forward(kind, x, alpha, deferred=deferred), "compiled"
    return None


def output_dtype(x: Tensor) -> torch.dtype:
    """The op's output dtype: bfloat16 for bfloat16 logits (the native kernels write it directly), else the
    compute dtype."""
    return torch.bfloat16 if x.dtype == torch.bfloat16 else solvers.compute_dtype(x)


@torch.library.custom_op("vitscope::sparse_normalize", mutates_args=())
def sparse_normalize(x: Tensor, alpha: Tensor | None, kind: str, native_path: bool, compiled_path: bool,
                     deferred_check: bool = False) -> Tensor:
    """Probabilities of normaliser ``kind`` (a name of ``kinds.def``) along the last dim of ``x``, in
    ``output_dtype(x)``; ``alpha`` (broadcastable to x.shape[:-1] + (1,): one value, one per head, one per row)
    for kind "alpha"."""
    fast = _fast_forward(x, alpha, kind, native_path, compiled_path, deferred_check)
    if fast is None:
        return solvers.forward(kind, x, alpha).to(output_dtype(x))
    y, converged, path = fast
    y = y.to(output_dtype(x))
    if deferred_check and path == "compiled":  # the native kernels run on the CPU, where a host read is free
        exactness.count_unproven(converged)
        return y
    # one reduction on the common, all-proven path; the native kernels' flags are read by numpy on this thread
    # (torch's all() starts the thread pool for it, about 0.15 ms at ViT-S)
    if not bool(converged.numpy().all() if path == "native" else converged.all()):
        redo = ~converged.reshape(-1)
        n = x.shape[-1]
        y = y.contiguous()
        rows = None if alpha is None else alpha.expand(*x.shape[:-1], 1).reshape(-1, 1)[redo]
        y.view(-1, n)[redo] = solvers.forward(kind, x.reshape(-1, n)[redo], rows).to(y.dtype)
    return y


@sparse_normalize.register_fake
def _(x: Tensor, alpha: Tensor | None, kind: str, native_path: bool, compiled_path: bool,
      deferred_check: bool = False) -> Tensor:
    return x.new_empty(x.shape, dtype=output_dtype(x))


@torch.library.custom_op("vitscope::sparse_normalize_backward", mutates_args=())
def sparse_normalize_backward(grad: Tensor, y: Tensor, alpha: Tensor | None, kind: str, alpha_grad: bool,
                              native_path: bool, compiled_path: bool) -> tuple[Tensor, Tensor]:
    """The closed-form VJP with respect to x (y's dtype) and, with ``alpha_grad``, to alpha (alpha's shape,
    summed over the rows that share a value; an empty tensor otherwise). The native kernels read and write
    bfloat16 directly, and sum a per-head alpha's gradient themselves; the other paths compute in the compute
    dtype."""
    d_alpha = None
    if y.dtype in (torch.float32, torch.bfloat16) and use_native_backward(y, native_path):
        try:
            d_x, d_alpha = native.backward(kind, grad, y, alpha, alpha_grad)  # d_alpha 0 where alpha is 1
            return d_x, d_alpha.to(alpha.dtype) if d_alpha is not None else y.new_zeros(0)
        except RuntimeError as err:
            warnings.warn(f"vitscope: native {kind} backward failed ({err}); this call takes the next path",
                          stacklevel=2)
    probs = y.to(solvers.compute_dtype(y))
    if compiled_path and probs.dtype == torch.float32 and fused.takes(probs):
        d_x, d_alpha = fused.backward(kind, grad, probs, alpha, alpha_grad)
    else:
        d_x, d_alpha = solvers.backward(kind, grad, probs, alpha, alpha_grad)
    if d_alpha is None:
        return d_x.to(y.dtype), y.new_zeros(0)
    return d_x.to(y.dtype), d_alpha.sum_to_size(alpha.shape).to(alpha.dtype)  # per row, to alpha's shape


def use_native_backward(y: Tensor, native_path: bool) -> bool:
    return native_path and native.kernels().runs_on(y)


@sparse_normalize_backward.register_fake
def _(grad: Tensor, y: Tensor, alpha: Tensor | None, kind: str, alpha_grad: bool, native_path: bool,
      compiled_path: bool) -> tuple[Tensor, Tensor]:
    return torch.empty_like(y), (torch.empty_like(alpha) if alpha_grad else y.new_empty(0))


def _setup_context(ctx, inputs, output) -> None:
    x, alpha, kind, native_path, compiled_path, *_ = inputs
    ctx.save_for_backward(output, alpha)
    ctx.kind, ctx.paths, ctx.x_dtype = kind, (native_path, compiled_path), x.dtype


def _backward(ctx, grad: Tensor):
    y, alpha = ctx.saved_tensors
    alpha_grad = alpha is not None and ctx.needs_input_grad[1]
    d_x, d_alpha = sparse_normalize_backward(grad.contiguous(), y, alpha, ctx.kind, alpha_grad, *ctx.paths)
    return d_x.to(ctx.x_dtype), (d_alpha if alpha_grad else None), None, None, None, None


sparse_normalize.register_autograd(_backward, setup_context=_setup_context)
