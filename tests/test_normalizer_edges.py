"""Every normaliser on every path (native, compiled, eager) and input dtype, on extreme rows, against the
`entmax` package in float64: masked (constant) rows, large common offsets, -inf masks, huge spreads, denormals
and NaN (which must come out NaN, never a silent number)."""

import entmax as reference
import pytest
import torch

from vitscope.attention import entmax, entmax15, fast_paths, fused, native, sparsemax
from vitscope.compiled import kernel_cache

N = 65
ROWS = fused.MIN_ELEMENTS // N + 1  # enough for the compiled path; the same shape as tests/test_fused.py
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PATHS = {"native": {"native": True, "compiled": False}, "compiled": {"native": False, "compiled": True},
         "eager": {"native": False, "compiled": False}}


def extreme_rows() -> torch.Tensor:
    """(ROWS, N) float32: the extreme rows first, Gaussian rows after them."""
    torch.manual_seed(0)
    rows = [torch.full((N,), sign * 10.0**e) for sign in (1, -1) for e in (4, 6, 8, 10)]  # masked-like rows
    rows += [1e9 + 100 * torch.randn(N), -1e9 + 100 * torch.randn(N), 1e4 + torch.randn(N)]  # common offsets
    one = torch.full((N,), float("-inf"))
    one[17] = 3.0
    rows.append(one)  # one finite value among -inf
    half_masked = torch.randn(N)
    half_masked[::2] = float("-inf")
    rows.append(half_masked)
    rows += [torch.randn(N) * 1e6, torch.randn(N) * 1e30, torch.randn(N) * 1e-40, torch.randn(N) * 1e-3]
    nan = torch.randn(N)
    nan[5] = float("nan")
    rows.append(nan)
    rows.append(torch.tensor([1e38, -1e38] * (N // 2) + [0.0]))  # a spread beyond float32's range
    x = torch.randn(ROWS, N) * 2
    x[: len(rows)] = torch.stack(rows)
    return x


CASES = {
    "sparsemax": (sparsemax, lambda x: reference.sparsemax(x, dim=-1), None),
    "entmax15": (entmax15, lambda x: reference.entmax15(x, dim=-1), None),
    "entmax:1.3": (lambda x: entmax(x, 1.3), lambda x: reference.entmax_bisect(x, 1.3, n_iter=200), 1.3),
    "entmax:1.7": (lambda x: entmax(x, 1.7), lambda x: reference.entmax_bisect(x, 1.7, n_iter=200), 1.7),
    "entmax:0.6": (lambda x: entmax(x, 0.6), lambda x: reference.entmax_bisect(x, 0.6, n_iter=200), 0.6),
    "entmax:2.4": (lambda x: entmax(x, 2.4), lambda x: reference.entmax_bisect(x, 2.4, n_iter=200), 2.4),
}


def row_alphas() -> torch.Tensor:
    torch.manual_seed(1)
    return 1.05 + 0.95 * torch.rand(ROWS, 1)


def tensor_reference(x: torch.Tensor) -> torch.Tensor:
    """The package with the per-row alphas, for ``x`` made of consecutive 64-row chunks of the fuzz batch."""
    chunk = torch.cat([reference.entmax_bisect(part, a, n_iter=200) for part, a in
                       zip(x.split(64), row_alphas()[: len(x)].double().split(64), strict=True)])
    return chunk


CASES["entmax:tensor"] = (lambda x: entmax(x, row_alphas()[: len(x)]), None, 1.7)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", PATHS)
def test_extreme_rows_match_the_package_in_float64(path, dtype, name):
    if path == "compiled" and dtype != "fp32":
        pytest.skip("compiled kernels are fuzzed in fp32 only on the CPU (compile time)")
    if path == "native" and native.library() is None:
        pytest.skip("no working C++ compiler")
    ours, theirs, alpha = CASES[name]
    x = extreme_rows()
    x = (x if path == "compiled" else x[:48]).to(DTYPES[dtype]).requires_grad_()  # the compiled path needs many
    exact_in = x.detach().double().requires_grad_()
    # The package fails on rows with NaN, +inf or nothing but -inf (sparsemax indexes out of bounds): those must
    # come out NaN. It gets the other rows shifted to a maximum of 0 (the mapping is shift-invariant; its bisection
    # is not, and loses a 1e30 spread even in float64), with -inf as -1e300.
    data = exact_in.detach()
    bad = (torch.isnan(data) | torch.isposinf(data)).any(-1, keepdim=True) | torch.isneginf(data).all(-1, keepdim=True)
    safe = torch.where(bad, 0.0, exact_in.clamp(min=-1e300))
    safe = safe - safe.detach().amax(-1, keepdim=True)
    # in chunks: the package's float64 pow slows down tenfold on the whole batch at once (denormals, it seems)
    if theirs is None:  # the per-row alphas of the tensor case follow the chunks
        exact = torch.where(bad, float("nan"), tensor_reference(safe))
    else:
        exact = torch.where(bad, float("nan"), torch.cat([theirs(part) for part in safe.split(64)]))
    with fast_paths(**PATHS[path]):
        y = ours(x)
        g = torch.randn(x.shape).to(x.dtype)
        (grad,) = torch.autograd.grad(y, x, g)
    (exact_grad,) = torch.autograd.grad(exact, exact_in, g.double())
    assert y.dtype == x.dtype
    nan_rows = torch.isnan(exact).any(-1)
    assert nan_rows.sum() >= 1  # the NaN row at least
    assert torch.isnan(y[nan_rows]).all(), "a row the reference cannot compute came out as numbers"
    ok = ~nan_rows
    eps = 1e-5 if dtype == "fp32" else torch.finfo(x.dtype).eps
    torch.testing.assert_close(y[ok].double(), exact[ok].detach(), atol=eps, rtol=0)
    torch.testing.assert_close(y[ok].double().sum(-1), torch.ones(int(ok.sum()), dtype=torch.float64),
                               atol=2 * eps, rtol=0)
    finite = torch.isfinite(exact_grad).all(-1) & ok
    assert torch.isfinite(grad[finite]).all()
    if dtype == "fp32":
        tol = 5e-4 if alpha is not None and alpha > 1.5 else 2e-5
        torch.testing.assert_close(grad[finite].double(), exact_grad[finite], atol=tol, rtol=1e-4)


def test_the_compiled_path_really_runs_in_the_fuzz():
    with fast_paths(native=False, compiled=True):
        before = sum(k.runs for k in kernel_cache().kernels(fused.FORWARDS["sparsemax"]))
        sparsemax(extreme_rows())
    assert sum(k.runs for k in kernel_cache().kernels(fused.FORWARDS["sparsemax"])) == before + 1


@pytest.mark.parametrize("fn", [sparsemax, entmax15, lambda x: entmax(x, 1.3)])
def test_a_fully_masked_row_is_uniform(fn):
    x = torch.full((2, 197), -1e9, requires_grad=True)
    y = fn(x)
    torch.testing.assert_close(y, torch.full_like(y, 1 / 197))
    (grad,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("alpha", [1.3, 1.5, 1.7, 2.0])
def test_shift_invariance_at_a_large_offset(alpha):
    torch.manual_seed(0)
    spread = 100 * torch.randn(8, 65)
    expected = reference.entmax_bisect(spread.double(), alpha, n_iter=200)
    shifted = (spread.double() + 1e9).float()  # exactly representable shift of the rounded values
    truth = reference.entmax_bisect(shifted.double() - 1e9, alpha, n_iter=200)
    assert (truth - expected).abs().max() < 1.0  # the shifted input is the same row up to float32 rounding
    torch.testing.assert_close(entmax(shifted, alpha).double(), truth, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fn", [sparsemax, entmax15, lambda x: entmax(x, 1.3), lambda x: entmax(x, 1.0)])
def test_integer_logits_are_refused(fn):
    with pytest.raises(TypeError, match=r"floating point: pass x.float\(\)"):
        fn(torch.tensor([[3, 1, 0, 2]]))
