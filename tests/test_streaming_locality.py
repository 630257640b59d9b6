"""Streaming MAD and entropy from queries and keys: the native kernel against the float64 map sums of the
probabilities (strided views, rectangular geometry, prefix tokens, every tail shape), and each fast path used only
where ``fast_paths`` allows it, with the same statistics on every path."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import vitscope
from kernel_spies import CountingKernels
from vitscope.attention import fast_paths, native
from vitscope.compiled import kernel_cache
from vitscope.metrics.locality import locality_row_sums, map_sums, patch_map_sums, softmax_map_sums
from vitscope.models import create

needs_native = pytest.mark.skipif(native.library() is None, reason="no working C++ compiler on this machine")


def qkv_views(batch, heads, tq, tk, dim, scale=2.0, seed=0):
    """q and k as attention takes them from a qkv projection: strided views, the head dim contiguous."""
    torch.manual_seed(seed)
    q = (torch.randn(batch, tq, 3, heads, dim) * scale).permute(2, 0, 3, 1, 4)[0]
    k = (torch.randn(batch, tk, 3, heads, dim) * scale).permute(2, 0, 3, 1, 4)[1]
    return q, k


def float64_row_sums(q, k, scale, distances, prefix):
    probs = ((q.double() * scale) @ k.double().transpose(-2, -1)).softmax(-1)[..., prefix:, prefix:]
    return locality_row_sums(probs, distances.double())


def float64_map_sums(mass, weighted, plogp):
    held = mass >= 1e-30  # a row whose patch mass float32 cannot hold (it underflows beside a prefix key) has none
    return map_sums(mass * held, weighted * held, plogp * held)


def assert_map_sums_close(got, want, rtol=1e-5):
    assert got.shape == want.shape == (*want.shape[:2], 4) and got.dtype == torch.float64
    assert torch.equal(got[..., 0], want[..., 0])  # the rows with patch mass
    rows = float(want[..., 0].max())
    torch.testing.assert_close(got, want, atol=3e-6 * max(rows, 1.0), rtol=rtol)


def float32_logit_rtol(q, k, scale):
    """Relative error a float32 kernel may show: its dot products are off by up to dim x float32's epsilon x
    sum |q_i k_i| x scale in the logit, which is that relative error in each probability (seed 87, dim 20,
    spread 10: logits near 400, 1.1e-4 measured)."""
    magnitude = float((q.abs().double() @ k.abs().double().transpose(-2, -1)).max()) * scale
    return max(1e-5, magnitude * q.shape[-1] * 2.0**-24)


@needs_native
@pytest.mark.parametrize("batch,heads,tq,tk,dim,prefix", [
    (2, 3, 65, 65, 24, 1),   # vit-compact
    (1, 2, 69, 69, 64, 5),   # CLS + 4 registers
    (2, 1, 40, 40, 7, 17),   # prefix keys spill into a second vector
    (1, 2, 256, 4, 16, 0),   # PVT-v2: reduced keys, fewer than a vector
    (3, 1, 3, 3, 1, 2),      # one patch
    (1, 1, 19, 33, 5, 0),    # more keys than queries, odd sizes
])
def test_kernel_equals_row_sums_of_the_float64_probabilities(batch, heads, tq, tk, dim, prefix):
    q, k = qkv_views(batch, heads, tq, tk, dim)
    assert q.stride(-1) == 1 and not q.is_contiguous()  # read in place
    distances = torch.rand(tq - prefix, tk - prefix) * 7
    scale = dim**-0.5
    assert_map_sums_close(native.softmax_locality(q, k, scale, distances, prefix),
                          float64_map_sums(*float64_row_sums(q, k, scale, distances, prefix)))


@needs_native
@settings(max_examples=25, deadline=None)
@given(tq=st.integers(1, 40), tk=st.integers(1, 40), dim=st.integers(1, 20), prefix=st.integers(0, 3),
       spread=st.sampled_from([0.1, 3.0, 10.0]), seed=st.integers(0, 99))
def test_kernel_on_any_shape_and_logit_spread(tq, tk, dim, prefix, spread, seed):
    prefix = min(prefix, tq - 1, tk - 1)
    if prefix < 0:
        return
    # spread 10: logits in the hundreds, most e underflow to exact 0 (larger logits lose float32 digits before
    # any kernel sees them)
    q, k = qkv_views(2, 2, tq, tk, dim, scale=spread, seed=seed)
    distances = torch.rand(tq - prefix, tk - prefix) * 5
    rows = float64_row_sums(q, k, 0.5, distances, prefix)
    assume(not bool(((rows[0] > 1e-45) & (rows[0] < 1e-30)).any()))  # where exp underflows decides these
    assert_map_sums_close(native.softmax_locality(q, k, 0.5, distances, prefix), float64_map_sums(*rows),
                          rtol=float32_logit_rtol(q, k, 0.5))


@needs_native
def test_kernel_rejects_mismatched_shapes():
    q, k = qkv_views(1, 2, 65, 65, 8)
    with pytest.raises(ValueError, match="do not match distances"):
        native.softmax_locality(q, k, 1.0, torch.zeros(65, 65), prefix=1)
    with pytest.raises(ValueError, match="equal batch, heads and head_dim"):
        native.softmax_locality(q, k[..., :4], 1.0, torch.zeros(64, 64), prefix=1)


def record_stats(model, images, attention_paths):
    with torch.no_grad(), fast_paths(**attention_paths), vitscope.record_attention(model, keep="stats") as rec:
        model(images)
    return rec.stats


def spy_on_compiled(fn, monkeypatch, **constants):
    """The calls that reach ``fn``'s compiled kernel (its compiled code stood in for by the eager function, so
    that no compiler runs)."""
    kernel, calls = kernel_cache().get(fn, **constants), []
    monkeypatch.setattr(kernel, "fast", lambda *tensors: calls.append(fn.__name__) or kernel.eager(*tensors))
    monkeypatch.setattr(kernel, "cpu_eager_calls", 0)  # no eager warm-up: the first call takes the kernel
    return calls


@pytest.mark.parametrize("attention,compiled_fn", [("softmax", softmax_map_sums), ("sparsemax", patch_map_sums)])
def test_each_fast_path_runs_only_where_allowed_with_the_same_statistics(attention, compiled_fn, monkeypatch):
    torch.manual_seed(0)
    # one image: small enough that a sparse normaliser itself takes no compiled kernel
    model, images = create("vit-micro", attention=attention).eval(), torch.randn(1, 3, 32, 32)
    compiled_calls = spy_on_compiled(compiled_fn, monkeypatch, **({"prefix": 1} if attention == "softmax" else {}))
    spy = CountingKernels()
    eager = record_stats(model, images, {"native": False, "compiled": False, "kernels": spy})
    assert spy.calls == [] and compiled_calls == []  # both switched off: neither is called
    compiled = record_stats(model, images, {"native": False, "compiled": True, "kernels": spy})
    assert spy.calls == [] and compiled_calls == [compiled_fn.__name__] * 4
    for stats in (compiled, *([record_stats(model, images, {"kernels": spy})] if native.library() else [])):
        torch.testing.assert_close(stats.mad, eager.mad, atol=2e-6, rtol=0)
        torch.testing.assert_close(stats.entropy, eager.entropy, atol=2e-6, rtol=0)
    if native.library() is not None and attention == "softmax":
        assert spy.calls == ["softmax_locality"] * 4 and len(compiled_calls) == 4  # native first
