"""Fast paths as objects: the fast_paths() context and the environment read in one place, per-kernel fallback of
the compiled kernels (one failure switches nothing else off), and the kinds table shared with C++."""

import re

import pytest
import torch

from kernel_spies import CountingKernels
from vitscope.attention import FastPaths, entmax15, fast_paths, native
from vitscope.attention.kinds import DEFINITIONS, kinds
from vitscope.attention.paths import current
from vitscope.compiled import CompiledKernel


def test_environment_then_context_then_back(monkeypatch):
    monkeypatch.setenv("VITSCOPE_NATIVE", "0")
    monkeypatch.delenv("VITSCOPE_FUSED", raising=False)
    assert current() == FastPaths(native=False, compiled=True)
    with fast_paths(native=True) as inner:
        assert inner == current() == FastPaths(native=True, compiled=True)
        with fast_paths(compiled=False):
            assert current() == FastPaths(native=True, compiled=False)
        assert current() == inner
    assert current() == FastPaths(native=False, compiled=True)
    monkeypatch.setenv("VITSCOPE_FUSED", "0")  # every fast path off
    assert current() == FastPaths(native=False, compiled=False)


def test_the_context_chooses_the_path():
    spy = CountingKernels()
    x = torch.randn(8, 33)
    with fast_paths(native=False, compiled=False, kernels=spy):
        eager = entmax15(x)
    assert spy.calls == []
    if native.library() is not None:
        with fast_paths(native=True, kernels=spy):
            fast = entmax15(x)
        assert spy.calls == ["entmax15 forward"]
        torch.testing.assert_close(fast, eager, atol=1e-6, rtol=0)


def double(x):
    return x * 2


def test_one_failure_of_a_compiled_kernel_is_one_eager_call():
    kernel, other = CompiledKernel(double, {}, False, 900), CompiledKernel(double, {}, False, 901)
    failures = iter([None, RuntimeError("transient out of memory"), None])

    def flaky(x):
        err = next(failures)
        if err:
            raise err
        return x * 2

    kernel.fast = other.fast = flaky
    x = torch.ones(3)
    assert torch.equal(kernel(x), x * 2) and kernel.runs == 1
    with pytest.warns(UserWarning, match="ran this call eagerly"):
        assert torch.equal(kernel(x), x * 2)  # the eager twin answered
    assert not kernel.off and kernel.failures == 1
    assert torch.equal(kernel(x), x * 2) and kernel.runs == 2  # compiled again at the next call
    assert other.failures == 0 and not other.off


def test_a_kernel_that_never_compiles_stays_eager_until_reset():
    kernel = CompiledKernel(double, {}, False, 902)

    def broken(x):
        raise RuntimeError("no C++ compiler")

    kernel.fast = broken
    with pytest.warns(UserWarning, match="running it eagerly from now on"):
        assert torch.equal(kernel(torch.ones(2)), torch.full((2,), 2.0))
    assert kernel.off
    assert torch.equal(kernel(torch.ones(2)), torch.full((2,), 2.0))  # no second warning, no second try
    kernel.fast = lambda x: x * 2
    kernel.reset()
    kernel(torch.ones(2))
    assert kernel.runs == 1 and not kernel.off


def test_errors_of_the_function_itself_are_raised():
    kernel = CompiledKernel(double, {}, False, 903)
    with pytest.raises(TypeError):
        kernel("not a tensor", "too many")


def test_one_kinds_table_for_cpp_and_python():
    table = kinds()
    assert {name: kind.code for name, kind in table.items()} == {"sparsemax": 0, "entmax15": 1, "alpha": 2}
    assert table["entmax15"].alpha == 1.5 and table["alpha"].alpha is None
    source = (DEFINITIONS.parent / "sparse_rows.cpp").read_text()
    assert '#include "kinds.def"' in source and not re.search(r"SPARSEMAX = 0", source)
