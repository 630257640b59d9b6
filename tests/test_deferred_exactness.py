"""The deferred exactness check of the GPU training step: under ``deferred_check`` the compiled kernels' unproven
rows are counted on the device instead of finished by the exact solver, so a call makes no host read; the
training loops log the count. Run here on the CPU with the native kernels off (the compiled kernels are what
CUDA runs)."""

import functools
import json
import warnings

import entmax as reference
import pytest
import torch

from adversarial import adversarial_rows
from test_train import config
from vitscope.attention import deferred_exactness, entmax, entmax15, fast_paths, fused, take_unproven
from vitscope.attention.paths import current
from vitscope.train import train

HOST_READS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__")


@pytest.fixture
def no_host_reads(monkeypatch):
    """Inside ``with no_host_reads():`` every way of reading a tensor's value on the host raises."""
    def forbid(name):
        def read(*args, **kwargs):
            raise AssertionError(f"host read of a tensor value: Tensor.{name}")
        return read

    def block():
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, forbid(name))
        return monkeypatch.context()
    yield block
    monkeypatch.undo()


def test_deferred_call_counts_unproven_rows_and_reads_nothing(monkeypatch, no_host_reads):
    # near-uniform 1025-wide rows: 3 passes leave some unproven (tests/test_fused.py shows the eager finish)
    monkeypatch.setitem(fused.DEFERRED_PASSES, "entmax15", fused.PASSES["entmax15"])
    x = adversarial_rows(fused.MIN_ELEMENTS // 1025 + 1, 1025, 0.5, seed=3)
    y_kernel, converged = fused.forward("entmax15", x, deferred=True)
    unproven = int((~converged).sum())
    assert unproven > 0
    take_unproven()
    with fast_paths(native=False, deferred_check=True):
        entmax15(x)  # warm-up: compiles
        take_unproven()
        no_host_reads()
        y = entmax15(x)
        monkeypatch.undo()
    assert torch.equal(y, y_kernel)  # not finished: the kernel's rows as they came
    assert take_unproven() == unproven and take_unproven() == 0  # counted, then reset
    exact = reference.entmax15(x.double())
    torch.testing.assert_close(y[converged].double(), exact[converged], atol=1e-6, rtol=0)
    assert (y[~converged].double() - exact[~converged]).abs().max() > 1e-6  # the count names real misses
    with fast_paths(native=False):  # without the deferred check the same call is exact
        torch.testing.assert_close(entmax15(x).double(), exact, atol=1e-6, rtol=0)


def test_deferred_passes_prove_more_rows():
    x = adversarial_rows(fused.MIN_ELEMENTS // 1025 + 1, 1025, 0.5, seed=3)
    _, few = fused.forward("entmax15", x)
    _, more = fused.forward("entmax15", x, deferred=True)
    assert int((~more).sum()) < int((~few).sum())


def test_alpha_the_kernels_cannot_solve_stays_exact_when_deferred():
    x = adversarial_rows(64, 65, 2.0, seed=1)
    with fast_paths(native=False, deferred_check=True):
        y = entmax(x, 0.75)  # outside (1, 2]: straight to the exact solver, never an unproven kernel row
    torch.testing.assert_close(y.double(), reference.entmax_bisect(x.double().masked_fill(x.isinf(), -1e9), 0.75,
                                                                   n_iter=100), atol=1e-5, rtol=0)
    assert take_unproven() == 0


def test_the_environment_chooses_where_to_defer(monkeypatch):
    monkeypatch.delenv("VITSCOPE_DEFERRED_CHECK", raising=False)
    with deferred_exactness("cpu"):
        assert not current().deferred_check  # CPU: the native kernels finish rows, a host read is free
    monkeypatch.setenv("VITSCOPE_DEFERRED_CHECK", "1")
    with deferred_exactness("cpu"):
        assert current().deferred_check
    assert not current().deferred_check
    monkeypatch.setenv("VITSCOPE_DEFERRED_CHECK", "0")
    with deferred_exactness("cuda"):
        assert not current().deferred_check
    monkeypatch.setenv("VITSCOPE_DEFERRED_CHECK", "yes")
    with pytest.raises(ValueError, match="VITSCOPE_DEFERRED_CHECK='yes'"):
        deferred_exactness("cpu")


def test_training_logs_unproven_rows(tmp_path, monkeypatch):
    """The engine runs its steps deferred and writes the count into the train log lines (the eager twin of the
    compiled kernel stands in for torch.compile here, and reports its first row of each call unproven)."""
    def first_row_unproven(x, passes):
        y, converged = kernel(x, passes)
        converged = converged.clone()
        converged.view(-1)[0] = False
        return y, converged
    kernel = fused.FORWARDS["entmax15"]
    monkeypatch.setenv("VITSCOPE_DEFERRED_CHECK", "1")
    monkeypatch.setenv("VITSCOPE_NATIVE", "0")
    monkeypatch.setattr(fused, "compiled", lambda fn, dynamic=None, **constants: functools.partial(fn, **constants))
    monkeypatch.setitem(fused.FORWARDS, "entmax15", first_row_unproven)
    monkeypatch.setattr("vitscope.attention.exactness._warned", False)
    take_unproven()
    cfg = config(tmp_path, "deferred", epochs=1, log_every_steps=2,
                 model_options={"depth": 1, "embed_dim": 32, "num_heads": 2, "attention": "entmax15"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(cfg)
    lines = [json.loads(line) for line in (tmp_path / "deferred" / "metrics.jsonl").read_text().splitlines()]
    train_lines = [line for line in lines if line["kind"] == "train"]
    # one attention layer: one unproven row per training step, each counted in its window's log line
    assert sum(line.get("unproven_rows", 0) for line in train_lines) == train_lines[-1]["step"] > 2
    assert any("not proven exact" in str(w.message) for w in caught)
