"""The native CPU kernels for sparsemax, entmax-1.5 and alpha-entmax: exact against the `entmax` package, every
block and tail shape, the eager finish for rows they cannot prove exact, and the fallback without a compiler."""

from pathlib import Path

import entmax as reference
import hypothesis.extra.numpy as hnp
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adversarial import adversarial_rows
from kernel_spies import CountingKernels
from vitscope.attention import entmax, entmax15, fast_paths, native, sparsemax

pytestmark = pytest.mark.skipif(native.library() is None, reason="no working C++ compiler on this machine")

class Case:
    """One normaliser: vitscope's function, the package's, and the native kernel's kind and alpha."""

    def __init__(self, kind: str, alpha: float):
        self.kind, self.alpha = kind, alpha

    def ours(self, x: torch.Tensor) -> torch.Tensor:
        return entmax(x, self.alpha)

    def theirs(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.kind == "entmax15":
            return reference.entmax15(x, dim=dim)
        if self.kind == "sparsemax":
            return reference.sparsemax(x, dim=dim)
        return reference.entmax_bisect(x, self.alpha, dim=dim, n_iter=100)

    def native(self, x: torch.Tensor, **kwargs):
        return native.forward(self.kind, x, alpha=self.alpha, **kwargs)

    @property
    def grad_tol(self) -> float:  # alpha > 1.5: y ** (2 - alpha) amplifies float32 rounding at tiny y
        return 5e-4 if self.alpha > 1.5 and self.kind == "alpha" else 1e-5


CASES = {"entmax15": Case("entmax15", 1.5), "sparsemax": Case("sparsemax", 2.0), "entmax:1.3": Case("alpha", 1.3),
         "entmax:1.7": Case("alpha", 1.7)}
EXACT = ["entmax15", "sparsemax"]  # closed-form thresholds; alpha-entmax stops at a tolerance


@pytest.fixture
def native_calls():
    """Records the calls that reached the native kernels, as "kind direction"."""
    spy = CountingKernels()
    with fast_paths(kernels=spy):
        yield spy.calls


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("rows,n,scale", [(37, 1, 1.0), (16, 5, 3.0), (21, 16, 1.0), (53, 65, 2.0), (40, 197, 0.5),
                                          (19, 1025, 0.5), (64, 33, 20.0)])
def test_matches_package_values_and_grads(name, rows, n, scale, native_calls):
    case = CASES[name]
    x = adversarial_rows(rows, n, scale).requires_grad_()
    y = case.ours(x)
    assert native_calls == [f"{case.kind} forward"]
    finite = x.detach().masked_fill(~torch.isfinite(x.detach()), -1e9).double().requires_grad_()
    y_ref = case.theirs(finite)
    torch.testing.assert_close(y.double(), y_ref, atol=1e-5, rtol=0)
    assert torch.all(y >= 0)
    if n > 3:
        assert torch.all(y[3, ::2] == 0)  # exact zeros where the key is masked
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    assert native_calls == [f"{case.kind} forward", f"{case.kind} backward"]
    (gr,) = torch.autograd.grad(y_ref, finite, g.double())
    torch.testing.assert_close(gx.double()[4:], gr[4:], atol=case.grad_tol, rtol=0)


rows_strategy = hnp.arrays(dtype="float32", shape=st.tuples(st.integers(1, 40), st.integers(1, 90)),
                           elements=st.floats(-40, 40, width=32, allow_nan=False, allow_infinity=False))


@settings(max_examples=60, deadline=None)
@given(x=rows_strategy, name=st.sampled_from(sorted(CASES)))
def test_forward_and_backward_match_the_package(x, name):
    case = CASES[name]
    x = torch.from_numpy(x)
    y, converged = case.native(x)
    reference_input = x.double().requires_grad_()
    y_ref = case.theirs(reference_input)
    # rows with near-ties at the threshold may stay unproven; the eager solver finishes those
    torch.testing.assert_close(y.double()[converged], y_ref.detach()[converged], atol=1e-5, rtol=0)
    torch.testing.assert_close(case.ours(x).double(), y_ref.detach(), atol=1e-5, rtol=0)
    g = torch.randn_like(x)
    (g_ref,) = torch.autograd.grad(y_ref, reference_input, g.double())
    g_ours, _ = native.backward(case.kind, g, y_ref.detach().float(), case.alpha)
    torch.testing.assert_close(g_ours.double(), g_ref, atol=case.grad_tol, rtol=0)
    torch.testing.assert_close(y.sum(-1)[converged], torch.ones(x.shape[0])[converged], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("n,scale", [(65, 2.0), (197, 0.5), (1025, 0.5), (197, 30.0)])
def test_attention_like_rows_finish_within_the_pass_budget(name, n, scale):
    torch.manual_seed(0)
    _, converged = CASES[name].native(torch.randn(4096, n) * scale)
    assert bool(converged.all())


@pytest.mark.parametrize("name", CASES)
def test_unproven_rows_are_flagged_and_finished_exactly(name):
    case = CASES[name]
    x = adversarial_rows(50, 197, 0.5, seed=3)
    _, converged = case.native(x, max_passes=1)
    assert not bool(converged.all())
    with fast_paths(kernels=native.NativeKernels(max_passes=1)):
        torch.testing.assert_close(case.ours(x).double(), case.theirs(x.double()), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", CASES)
def test_nan_rows_are_left_to_the_eager_solver(name):
    case = CASES[name]
    x = torch.randn(20, 65)
    x[7, 3] = float("nan")
    x[9] = float("-inf")
    x[11, ::2] = float("-inf")  # masked keys, as attention masks write them: an ordinary row
    _, converged = case.native(x)
    assert converged.tolist() == [i not in (7, 9) for i in range(20)]
    assert float(case.ours(x)[11, ::2].abs().max()) == 0.0
    out = case.ours(x)
    with fast_paths(native=False, compiled=False):
        eager = case.ours(x)
    torch.testing.assert_close(out, eager, equal_nan=True, atol=1e-6, rtol=0)
    assert torch.isnan(out[7]).all() and torch.isnan(out[9]).all()  # NaN propagates, never a silent number


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accurate_to_their_precision(dtype, native_calls):
    x = adversarial_rows(48, 65, 2.0).to(dtype)
    y = entmax15(x)
    assert y.dtype == dtype and native_calls == ["entmax15 forward"]
    exact = reference.entmax15(x.double(), dim=-1)
    torch.testing.assert_close(y.double(), exact, atol=torch.finfo(dtype).eps, rtol=0)


@pytest.mark.parametrize("name", CASES)
def test_bfloat16_is_read_and_written_without_conversion(name, native_calls):
    # the kernels take bfloat16 logits and gradients and return bfloat16 probabilities and gradients, rounded
    # from the float32 results as PyTorch rounds (so equal to the float32 path's results converted)
    case = CASES[name]
    x = adversarial_rows(48, 65, 2.0).to(torch.bfloat16)
    g = torch.randn(x.shape).to(torch.bfloat16)
    y, converged = case.native(x)
    y_float, _ = case.native(x.float())
    assert y.dtype == torch.bfloat16 and bool(converged.all())
    assert torch.equal(y, y_float.to(torch.bfloat16))
    gx, _ = native.backward(case.kind, g, y, case.alpha)
    gx_float, _ = native.backward(case.kind, g.float(), y.float(), case.alpha)
    assert gx.dtype == torch.bfloat16 and torch.equal(gx, gx_float.to(torch.bfloat16))
    x_ref = x.double().masked_fill(torch.isinf(x), -1e9).requires_grad_()
    (g_ref,) = torch.autograd.grad(case.theirs(x_ref), x_ref, g.double())
    torch.testing.assert_close(gx.double()[4:], g_ref[4:], atol=0.05, rtol=0.02)  # bfloat16 y: 8 bits
    (ours,) = torch.autograd.grad(case.ours(x.requires_grad_()), x, g)  # the op on this path, end to end
    assert native_calls[-2:] == [f"{case.kind} forward", f"{case.kind} backward"] and torch.equal(ours, gx)


def test_bfloat16_subnormal_probabilities_round_as_pytorch_rounds():
    # alpha 1.05 (power 20): the key at z = -0.9875 gets (0.0125)**20, about 8.7e-39, a float32 subnormal that
    # bfloat16 keeps (its subnormals reach 9.2e-41); the one-instruction conversion would flush it to zero
    x = torch.tensor([[0.0, -19.75] + [-100.0] * 30] * 20, dtype=torch.bfloat16)
    y, converged = native.forward("alpha", x, 1.05)
    y_float, _ = native.forward("alpha", x.float(), 1.05)
    assert bool(converged.all()) and 0 < float(y_float[0, 1]) < torch.finfo(torch.float32).tiny
    assert float(y[0, 1]) > 0 and torch.equal(y, y_float.to(torch.bfloat16))


@pytest.mark.parametrize("kind", ["entmax15", "sparsemax", "alpha"])
def test_thread_count_does_not_change_results(kind):
    # 3000 rows of 197 keys: enough elements for two threads and three 1024-row chunks, taken in whichever order
    # the threads come; every row is computed the same way wherever it runs
    x = adversarial_rows(3000, 197, 2.0)
    g = torch.randn_like(x)
    alphas = torch.rand(3000) * 0.8 + 1.1
    y = {"entmax15": entmax15, "sparsemax": sparsemax, "alpha": lambda t: entmax(t, alphas[:, None])}[kind](x)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert native._threads(x) == threads
            results.append((*native.forward(kind, x, alphas),
                            *native.backward(kind, g, y, alphas, alpha_grad=kind == "alpha")))
    finally:
        torch.set_num_threads(before)
    (one, one_ok, *one_grad), (many, many_ok, *many_grad) = results
    assert torch.equal(one_ok, many_ok) and one_ok.float().mean() > 0.99
    assert torch.equal(one[one_ok], many[one_ok]) and torch.equal(one_grad[0], many_grad[0])
    assert kind != "alpha" or torch.equal(one_grad[1], many_grad[1])


def test_one_alpha_for_all_rows_matches_the_same_alpha_per_row():
    # a float (or a tensor expanded from one value) reaches the kernels as one value, not a per-row copy
    x = adversarial_rows(600, 197, 2.0)
    g = torch.randn_like(x)
    per_row = torch.full((600,), 1.3)
    y, converged = native.forward("alpha", x, per_row)
    finished = entmax(x, 1.3)  # every row, for the backward
    d_x_rows, d_alpha_rows = native.backward("alpha", g, finished, per_row, alpha_grad=True)
    for one in (1.3, torch.tensor(1.3).expand(600, 1)):
        assert native._row_alphas(one, x.shape[:-1]).values.numel() == 1
        y_one, converged_one = native.forward("alpha", x, one)
        assert torch.equal(y_one[converged], y[converged]) and torch.equal(converged_one, converged)
        d_x, _ = native.backward("alpha", g, finished, one)
        assert torch.equal(d_x, d_x_rows)
    # the gradient of one value is the sum over its rows; of an expanded tensor, one per element (row)
    d_one = native.backward("alpha", g, finished, 1.3, alpha_grad=True)[1]
    assert d_one.shape == () and torch.allclose(d_one, d_alpha_rows.double().sum().float(), rtol=1e-6)
    d_expanded = native.backward("alpha", g, finished, torch.tensor(1.3).expand(600, 1), alpha_grad=True)[1]
    assert d_expanded.shape == (600, 1) and torch.equal(d_expanded[:, 0], d_alpha_rows)
    assert native._row_alphas(per_row, x.shape[:-1]).values.numel() == 600


def test_per_head_alpha_is_read_per_head_and_its_gradient_summed_per_head():
    # (batch, heads, queries) rows with one alpha per head: the kernels read the heads' own values (no per-row copy)
    # and sum the gradient per head; against the same alphas expanded to one per row, summed here in float64
    # (1164 rows: a second 1024-row chunk starts inside a head, 64-row blocks start anywhere in one)
    batch, heads, queries, keys = 3, 4, 97, 65
    x = adversarial_rows(batch * heads * queries, keys, 2.0).reshape(batch, heads, queries, keys)
    g = torch.randn_like(x)
    heads_alpha = torch.tensor([1.0, 1.25, 1.5, 1.9])[None, :, None, None]  # alpha = 1 (softmax): gradient 0
    per_row = heads_alpha.expand(batch, heads, queries, 1).contiguous()
    read = native._row_alphas(heads_alpha, x.shape[:-1])
    assert (read.values.numel(), read.inner, read.period, read.per_row) == (heads, queries, heads, False)
    y_rows, ok_rows = native.forward("alpha", x, per_row)
    y_heads, ok_heads = native.forward("alpha", x, heads_alpha)
    assert torch.equal(ok_heads, ok_rows) and torch.equal(y_heads[ok_heads], y_rows[ok_rows])
    finished = entmax(x, per_row)
    d_x_rows, d_alpha_rows = native.backward("alpha", g, finished, per_row, alpha_grad=True)
    d_x_heads, d_alpha_heads = native.backward("alpha", g, finished, heads_alpha, alpha_grad=True)
    assert torch.equal(d_x_heads, d_x_rows) and d_alpha_heads.shape == heads_alpha.shape
    assert torch.all(d_alpha_rows[:, 0] == 0) and d_alpha_heads[0, 0, 0, 0] == 0
    expected = d_alpha_rows.double().sum((0, 2)).reshape(1, heads, 1, 1)
    torch.testing.assert_close(d_alpha_heads.double(), expected, rtol=1e-6, atol=1e-6)
    # alphas that vary along dims that are not one run (per batch and query) come per row, summed to their shape
    odd = torch.rand(batch, 1, queries, 1) * 0.8 + 1.1
    assert native._row_alphas(odd, x.shape[:-1]).per_row
    d_odd = native.backward("alpha", g, finished, odd, alpha_grad=True)[1]
    expected = native.backward("alpha", g, finished, odd.expand(batch, heads, queries, 1).contiguous(),
                               alpha_grad=True)[1].double().sum(1, keepdim=True)
    assert d_odd.shape == odd.shape
    torch.testing.assert_close(d_odd.double(), expected, rtol=1e-6, atol=1e-6)


def test_non_contiguous_and_batched_inputs(native_calls):
    x = torch.randn(3, 4, 65, 65).transpose(-1, -2)
    y = sparsemax(x)
    torch.testing.assert_close(y.double(), reference.sparsemax(x.double(), dim=-1), atol=1e-5, rtol=0)
    y_dim = entmax15(x, dim=1)
    torch.testing.assert_close(y_dim.double(), reference.entmax15(x.double(), dim=1), atol=1e-5, rtol=0)


def test_built_once_then_reused_from_the_cache(monkeypatch):
    built = Path(native.library()._name)
    stamp = built.stat().st_mtime_ns
    monkeypatch.setenv("VITSCOPE_CACHE", str(built.parents[1]))
    assert native.build(native.find_compiler()) == built
    assert built.stat().st_mtime_ns == stamp


def test_without_a_compiler_falls_back_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    kernels = native.NativeKernels()
    x = adversarial_rows(600, 65, 2.0)
    with pytest.warns(UserWarning, match="native CPU kernels unavailable"), fast_paths(kernels=kernels):
        y = entmax15(x)
    assert kernels.library() is None and "no-such-compiler" in kernels.error
    torch.testing.assert_close(y.double(), reference.entmax15(x.double(), dim=-1), atol=1e-5, rtol=0)


def test_a_failed_build_is_not_sticky(monkeypatch, tmp_path):
    # a broken compiler fails every flag set and leaves nothing on disk; once fixed, the same object builds
    # (here: finds the library this process built, in the cache it came from)
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'internal compiler error' >&2\nexit 1\n")
    broken.chmod(0o755)
    built = Path(native.library()._name)
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(broken))
    kernels = native.NativeKernels()
    with pytest.warns(UserWarning, match="internal compiler error"):
        assert kernels.library() is None
    assert kernels.error.count("broken-c++") == len(native.FLAG_SETS)  # each flag set tried and named
    assert not (tmp_path / "cache" / "native").exists() or not list((tmp_path / "cache" / "native").iterdir())
    monkeypatch.undo()
    kernels.reset()
    assert kernels.library() is not None and kernels.error is None
    assert Path(kernels.library()._name) == built


def test_the_build_without_openmp_threads_gives_the_same_results(monkeypatch, tmp_path):
    # compilers without OpenMP (Apple's clang, say) get the std::thread build
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path))
    # (and, built for any x86-64, the portable lane loops and bit deposits instead of AVX-512's and BMI2's)
    threaded = native.NativeKernels(flag_sets=(("-fopenmp-simd",),))
    assert threaded.library() is not None and Path(threaded.library()._name).parent == tmp_path / "native"
    for rows, n in ((1000, 65), (300, 1025)):  # 1025 keys: supports spanning many 64-key words
        x = adversarial_rows(rows, n, 2.0 if n < 100 else 0.5)
        g = torch.randn_like(x)
        alphas = torch.rand(rows) * 0.9 + 1.1  # near 1 the alpha gradient is ill-conditioned in float32
        kinds = ("entmax15", "sparsemax", "alpha")
        expected = [native.forward(kind, x, alphas)[0] for kind in kinds]
        expected_grad = native.backward("alpha", g, expected[2], alphas, alpha_grad=True)
        for kind, before in zip(kinds, expected, strict=True):  # the same arithmetic, other threads (and FMAs)
            torch.testing.assert_close(threaded.forward(kind, x, alphas)[0], before, atol=1e-6, rtol=0)
        ours = threaded.backward("alpha", g, expected[2], alphas, alpha_grad=True)
        torch.testing.assert_close(ours[0], expected_grad[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(ours[1], expected_grad[1], atol=1e-4, rtol=1e-4)  # 1 / (alpha - 1)**2 amplifies
