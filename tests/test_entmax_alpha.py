"""alpha-entmax with tensor alpha and its closed-form alpha gradient, learnable per-head alpha, and the custom ops
that torch.compile traces through."""

import math
from pathlib import Path

import entmax as reference
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.attention import LearnedEntmax, entmax, fast_paths, fused, learned_alphas, make_normalizer, native
from vitscope.attention.solvers import alpha_backward_with_alpha
from vitscope.models import create


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 12), alpha=st.floats(0.3, 3.0).filter(lambda a: abs(a - 1) > 0.05))
def test_alpha_gradient_matches_finite_differences_in_float64(seed, n, alpha):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, n, dtype=torch.float64, generator=gen) * 2
    g = torch.randn(3, n, dtype=torch.float64, generator=gen)
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad((entmax(x, a) * g).sum(), a)
    h = 1e-6
    numeric = ((entmax(x, alpha + h) - entmax(x, alpha - h)) * g).sum() / (2 * h)
    torch.testing.assert_close(grad, numeric, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("path", [{"native": True, "compiled": False}, {"native": False, "compiled": True}])
def test_fast_paths_give_the_float64_alpha_gradient(path):
    if path["native"] and native.library() is None:
        pytest.skip("no working C++ compiler")
    torch.manual_seed(0)
    rows = fused.MIN_ELEMENTS // 65 + 1  # enough for the compiled path, in the shape the other tests compile
    x = torch.randn(rows, 65) * 2
    alpha = (1.1 + 0.8 * torch.rand(rows // 5, 1, 1)).requires_grad_()  # one alpha per 5 rows
    x = x[: rows // 5 * 5].view(rows // 5, 5, 65).requires_grad_()
    g = torch.randn_like(x)
    with fast_paths(**path):
        y = entmax(x, alpha)
        dx, da = torch.autograd.grad(y, (x, alpha), g)
    rows_alpha = alpha.detach().double().expand(-1, 5, 1)
    exact = reference.entmax_bisect(x.detach().double(), rows_alpha, n_iter=200)
    torch.testing.assert_close(y.double(), exact, atol=1e-5, rtol=0)
    dx_ref, da_rows = alpha_backward_with_alpha(g.double(), exact, rows_alpha)
    torch.testing.assert_close(dx.double(), dx_ref, atol=5e-4, rtol=0)
    torch.testing.assert_close(da.double(), da_rows.sum(dim=1, keepdim=True), rtol=1e-3, atol=1e-3)


def test_tensor_alpha_broadcasts_along_any_dim_like_per_row_calls():
    torch.manual_seed(1)
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    alpha = torch.tensor([[[1.2]], [[1.5]], [[2.6]]], dtype=torch.float64)  # (3, 1, 1): one per leading index
    y = entmax(x, alpha, dim=1)
    for i in range(3):
        for k in range(4):
            torch.testing.assert_close(y[i, :, k], entmax(x[i, :, k], float(alpha[i, 0, 0])), atol=1e-10, rtol=0)
    torch.testing.assert_close(entmax(x, torch.tensor(1.0, dtype=torch.float64)), torch.softmax(x, -1))


def test_bad_alphas_name_the_fix():
    x = torch.randn(4, 6)
    with pytest.raises(ValueError, match="does not broadcast"):
        entmax(x, torch.full((4, 6), 1.5))  # not size 1 along dim
    with pytest.raises(TypeError, match="floating-point"):
        entmax(x, torch.tensor([2]))
    with pytest.raises(ValueError, match="above 0"):
        entmax(x, -0.5)
    assert torch.isnan(entmax(x, torch.tensor([[1.5], [0.0], [1.3], [2.5]]))[1]).all()  # alpha <= 0: NaN


def test_the_ops_trace_under_torch_compile_without_graph_breaks():
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    alpha = (1.0 + torch.rand(3, 1, 1)).requires_grad_()

    def loss(x, alpha):
        return (entmax(x, alpha) * torch.arange(9.0)).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)  # fullgraph: a break would raise
    torch.testing.assert_close(compiled(x, alpha), loss(x, alpha))
    grads = torch.autograd.grad(compiled(x, alpha), (x, alpha))
    expected = torch.autograd.grad(loss(x, alpha), (x, alpha))
    for ours, theirs in zip(grads, expected, strict=True):
        torch.testing.assert_close(ours, theirs)


def test_opcheck_the_custom_op():
    x = torch.randn(4, 7, requires_grad=True)
    alpha = torch.full((4, 1), 1.3, requires_grad=True)
    torch.library.opcheck(torch.ops.vitscope.sparse_normalize.default, (x, alpha, "alpha", True, True))
    torch.library.opcheck(torch.ops.vitscope.sparse_normalize.default, (x, None, "entmax15", False, False))
    half = x.detach().to(torch.bfloat16).requires_grad_()  # bfloat16 out of every path, the fake kernel's too
    for native_path in (True, False):
        torch.library.opcheck(torch.ops.vitscope.sparse_normalize.default, (half, alpha, "alpha", native_path, False))


def test_learned_alpha_stays_in_range_and_is_a_parameter():
    normalizer = make_normalizer("entmax:learned:1.3", num_heads=4)
    assert isinstance(normalizer, LearnedEntmax) and normalizer.name == "entmax:learned:1.3"
    torch.testing.assert_close(normalizer.alpha(), torch.full((4,), 1.3))
    with torch.no_grad():
        normalizer.alpha_logit.copy_(torch.tensor([-50.0, -3.0, 3.0, 50.0]))
    alpha = normalizer.alpha()
    assert torch.all(alpha >= 1.0) and torch.all(alpha <= 2.0)  # float32 reaches the ends only in the limit
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    y = normalizer(x)
    torch.testing.assert_close(y[:, 0], torch.softmax(x[:, 0], -1))  # alpha = 1 exactly: softmax, its limit
    torch.testing.assert_close(y[:, 3], entmax(x[:, 3], 2.0))
    y.sum().backward()
    assert torch.isfinite(normalizer.alpha_logit.grad).all() and torch.isfinite(x.grad).all()
    assert [name for name, _ in normalizer.named_parameters()] == ["alpha_logit"]
    with pytest.raises(ValueError, match="heads"):
        normalizer(torch.randn(2, 3, 5, 5))


def test_a_learned_alpha_model_trains_and_its_alphas_move(tmp_path):
    torch.manual_seed(0)
    model = create("vit-micro", attention="entmax:learned", num_classes=4)
    before = learned_alphas(model)
    assert list(before) == [f"blocks.{i}.attn" for i in range(len(model.blocks))]
    assert all(torch.allclose(a, torch.full_like(a, 1.5)) for a in before.values())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,))
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        assert all(b.attn.normalizer.alpha_logit.grad.abs().sum() > 0 for b in model.blocks)
        optimizer.step()
    after = learned_alphas(model)
    assert all((after[k] - before[k]).abs().max() > 1e-3 for k in before)
    # saved with the checkpoint: a fresh model loads them back
    torch.save(model.state_dict(), tmp_path / "model.pt")
    fresh = create("vit-micro", attention="entmax:learned", num_classes=4)
    fresh.load_state_dict(torch.load(tmp_path / "model.pt"))
    assert all(torch.equal(learned_alphas(fresh)[k], after[k]) for k in after)
    assert Path(tmp_path / "model.pt").stat().st_size > 0


def test_analyze_reports_each_heads_learned_alpha(tmp_path):
    from vitscope.analyze.locality import measure_locality, write_locality
    from vitscope.data import load_dataset

    torch.manual_seed(0)
    model = create("vit-micro", attention="entmax:learned:1.3")
    with torch.no_grad():
        model.blocks[1].attn.normalizer.alpha_logit[0] = 2.0  # one head moved away from 1.3
    result = measure_locality(model, load_dataset("synthetic", None, "eval", num_images=4), batch_size=4,
                              progress=False)
    write_locality(tmp_path, result, {"schema_version": 1})
    rows = __import__("json").loads((tmp_path / "locality.json").read_text())["heads"]
    alphas = learned_alphas(model)
    for row in rows:
        expected = float(alphas[f"blocks.{row['layer'] - 1}.attn"][row["head"] - 1])
        assert row["alpha"] == pytest.approx(expected)
    assert {round(row["alpha"], 4) for row in rows} == {1.3, round(1 + 1 / (1 + math.exp(-2.0)), 4)}


def test_a_timm_vit_takes_learned_alphas():
    from vitscope.models import load

    model = load("timm:vit_tiny_patch16_224", attention="entmax:learned:1.2", img_size=32, depth=2)
    alphas = learned_alphas(model)
    assert len(alphas) == 2 and all(torch.allclose(a, torch.full((3,), 1.2)) for a in alphas.values())
    model(torch.randn(1, 3, 32, 32)).sum().backward()
    assert all(b.attn.normalizer.alpha_logit.grad is not None for b in model.blocks)
