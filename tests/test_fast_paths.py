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


def test_a_cpu_kernel_runs_eagerly_until_its_compile_can_pay():
    """The first ``cpu_eager_calls`` CPU calls never reach the compiler; the next one does, and stays compiled."""
    kernel = CompiledKernel(double, {}, False, 904, cpu_eager_calls=3)
    compiled_calls = []
    kernel.fast = lambda x: compiled_calls.append(1) or x * 2
    for _ in range(3):
        assert torch.equal(kernel(torch.ones(2)), torch.full((2,), 2.0))
    assert compiled_calls == [] and kernel.eager_runs == 3
    kernel(torch.ones(2))
    kernel(torch.ones(2))
    assert len(compiled_calls) == 2 and kernel.runs == 2 and kernel.eager_runs == 3


def test_the_readme_snippet_compiles_nothing_on_the_cpu(monkeypatch):
    """The README's Python snippet (4 batches of a recorded entmax-1.5 model, here at test size) takes no
    torch.compile warm-up on the CPU: every streamed-metric call is answered eagerly."""
    import vitscope
    from vitscope.compiled import kernel_cache
    from vitscope.data import eval_batches, load_dataset
    from vitscope.metrics.locality import patch_map_sums
    from vitscope.models import create

    kernel = kernel_cache().get(patch_map_sums, cpu_eager_calls=256)
    reached = []
    monkeypatch.setattr(kernel, "fast", lambda *tensors: reached.append(1) or kernel.eager(*tensors))
    monkeypatch.setattr(kernel, "runs", 0)
    monkeypatch.setattr(kernel, "eager_runs", 0)
    model = create("vit-micro", attention="entmax15").eval()
    data = load_dataset("synthetic", None, "eval", num_images=16)
    with torch.no_grad(), vitscope.attention.fast_paths(compiled=True), \
            vitscope.record_attention(model, keep="stats") as rec:
        for images, _ in eval_batches(data, 4):
            model(images)
    assert rec.stats.mad.shape[0] == len(model.blocks)
    assert reached == [] and kernel.eager_runs == 4 * len(model.blocks)


def test_the_first_compile_keeps_torch_s_cuda_notice_out(caplog):
    import logging

    kernel = CompiledKernel(double, {}, False, 905)
    kernel.fast = lambda x: x * 2
    logging.getLogger("torch.utils.cpp_extension").filters.clear()
    kernel(torch.ones(2))
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torch.utils.cpp_extension").warning("No CUDA runtime is found, using CUDA_HOME='/x'")
        logging.getLogger("torch.utils.cpp_extension").warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
