"""The compiled fast paths: exact against the `entmax` package, including rows that need the eager finish.

The native CPU kernels (tests/test_native.py) are switched off here so that the compiled kernels run."""

import entmax as reference
import pytest
import torch

from adversarial import adversarial_rows
from vitscope.attention import entmax, entmax15, fast_paths, fused, sparsemax
from vitscope.compiled import kernel_cache


@pytest.fixture(autouse=True)
def compiled_path_only():
    with fast_paths(native=False, compiled=True):
        yield


def compiled_runs(kind: str) -> int:
    """Calls the compiled code of ``kind``'s forward kernel has answered so far in this process."""
    return sum(kernel.runs for kernel in kernel_cache().kernels(fused.FORWARDS[kind]))

CASES = [(entmax15, lambda x: reference.entmax15(x), 1.5, "entmax15"),
         (sparsemax, lambda x: reference.sparsemax(x), 2.0, "sparsemax"),
         (lambda x: entmax(x, 1.3), lambda x: reference.entmax_bisect(x, 1.3, n_iter=100), 1.3, "alpha"),
         (lambda x: entmax(x, 1.7), lambda x: reference.entmax_bisect(x, 1.7, n_iter=100), 1.7, "alpha")]


def big_batch(n: int, scale: float, seed: int = 0) -> torch.Tensor:
    """Adversarial rows, enough of them for the compiled path (at least MIN_ELEMENTS elements)."""
    return adversarial_rows(max(fused.MIN_ELEMENTS // n + 1, 64), n, scale, seed)


@pytest.mark.parametrize("ours,theirs,alpha,kernel", CASES)
@pytest.mark.parametrize("n,scale", [(65, 2.0), (197, 0.5), (1025, 0.5)])
def test_fused_matches_package(ours, theirs, alpha, kernel, n, scale):
    x = big_batch(n, scale).requires_grad_()
    assert fused.takes(x)
    runs = compiled_runs(kernel)
    y = ours(x)
    finite = x.detach().masked_fill(~torch.isfinite(x.detach()), -1e9).double().requires_grad_()
    y_ref = theirs(finite)
    torch.testing.assert_close(y.double(), y_ref, atol=1e-5, rtol=0)
    assert torch.all(y[3, ::2] == 0) and torch.all(y >= 0)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    (gr,) = torch.autograd.grad(y_ref, finite, g.double())
    tol = 1e-5 if alpha in (1.5, 2.0, 1.3) else 5e-4  # alpha > 1.5: y**(2-alpha) amplifies fp32 rounding at tiny y
    torch.testing.assert_close(gx.double()[4:], gr[4:], atol=tol, rtol=0)
    assert compiled_runs(kernel) == runs + 1  # the compiled path really ran


def test_fused_equals_eager_and_can_be_switched_off():
    x = big_batch(65, 1.0)
    fast = entmax15(x)
    runs = compiled_runs("entmax15")
    with fast_paths(compiled=False):
        slow = entmax15(x)
    assert compiled_runs("entmax15") == runs
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=0)


def test_rows_the_kernel_cannot_prove_are_finished_exactly():
    # near-uniform long rows need more iterations than the kernel runs: the eager finish must take over
    x = big_batch(1025, 0.5, seed=3)
    y, converged = fused.forward("entmax15", x)
    assert not bool(converged.all())
    exact = entmax15(x)
    torch.testing.assert_close(exact.double(), reference.entmax15(x.double()), atol=1e-6, rtol=0)
