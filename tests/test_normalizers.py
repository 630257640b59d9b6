"""Normalisers against the `entmax` package, analytic properties and gradcheck."""

import entmax as reference
import hypothesis.extra.numpy as hnp
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.attention import entmax, entmax15, make_normalizer, softmax, sparsemax

ALPHAS = [1.1, 1.3, 1.5, 1.7, 2.0]


def ours(x, alpha):
    return entmax(x, alpha)


def theirs(x, alpha):
    if alpha == 1.5:
        return reference.entmax15(x, dim=-1)
    if alpha == 2.0:
        return reference.sparsemax(x, dim=-1)
    return reference.entmax_bisect(x, alpha, dim=-1, n_iter=200)


def adversarial_rows() -> list[torch.Tensor]:
    rows = [
        torch.zeros(7),                                  # all equal
        torch.tensor([3.0, 3.0, 3.0, -1.0, 0.5]),        # ties at the top
        torch.tensor([1e4, 0.0, -1.0, 2.0]),             # one huge logit
        torch.tensor([2.0, float("-inf"), 1.0, float("-inf")]),  # -inf masks
        torch.tensor([0.7]),                             # a single key
        torch.tensor([1.0, 1.0 - 1e-7, 0.0, -5.0]),      # near-ties
        torch.linspace(-3, 3, 65),
    ]
    return [r.double() for r in rows]


rows_strategy = hnp.arrays(
    dtype="float64",
    shape=st.tuples(st.integers(1, 4), st.integers(1, 70)),
    elements=st.floats(-30, 30, allow_nan=False, allow_infinity=False),
)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_matches_entmax_package_on_random_rows(alpha):
    torch.manual_seed(0)
    for scale in (0.1, 1.0, 4.0, 20.0):
        x = (torch.randn(64, 65, dtype=torch.float64) * scale).requires_grad_()
        x_ref = x.detach().clone().requires_grad_()
        y, y_ref = ours(x, alpha), theirs(x_ref, alpha)
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)
        g = torch.randn_like(y)
        (y * g).sum().backward()
        (y_ref * g).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_matches_entmax_package_on_adversarial_rows(alpha):
    for row in adversarial_rows():
        x = row[None]
        y = ours(x, alpha)
        finite = torch.isfinite(x)
        y_ref = theirs(x.masked_fill(~finite, -1e9), alpha)  # the package cannot take -inf
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)
        assert torch.all(y[~finite] == 0)


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
def test_exact_zeros_and_exact_support(fn):
    x = torch.tensor([[3.0, 2.9, 0.0, -4.0, -8.0]], dtype=torch.float64)
    y = fn(x)
    assert y[0, 3] == 0 and y[0, 4] == 0  # exact zeros, not tiny values
    assert y[0, 0] > y[0, 1] > 0


@pytest.mark.parametrize("alpha", ALPHAS)
@settings(max_examples=40, deadline=None)
@given(values=rows_strategy)
def test_probability_simplex(alpha, values):
    y = ours(torch.from_numpy(values), alpha)
    assert torch.all(y >= 0)
    torch.testing.assert_close(y.sum(-1), torch.ones(y.shape[0], dtype=y.dtype), atol=1e-6, rtol=0)
    # the largest logit always keeps the largest probability
    assert torch.all(y.gather(-1, torch.from_numpy(values).argmax(-1, keepdim=True)) >= y.amax(-1, keepdim=True) - 1e-9)


@settings(max_examples=60, deadline=None)
@given(values=rows_strategy)
def test_support_shrinks_as_alpha_grows(values):
    x = torch.from_numpy(values)
    supports = [(ours(x, a) > 1e-9).sum(-1) for a in ALPHAS]
    for wider, narrower in zip(supports, supports[1:], strict=False):
        assert torch.all(narrower <= wider)


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0])
def test_gradcheck_float64(alpha):
    torch.manual_seed(1)
    x = (torch.randn(3, 9, dtype=torch.float64) * 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ours(t, alpha), (x,), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0])
def test_half_precision_is_computed_in_float32(dtype, alpha):
    torch.manual_seed(2)
    x = torch.randn(16, 65) * 3
    y = ours(x.to(dtype), alpha)
    assert y.dtype == dtype
    expected = ours(x.to(dtype).float(), alpha)
    torch.testing.assert_close(y.float(), expected, atol=torch.finfo(dtype).eps * 2, rtol=0)


def test_dim_argument_and_softmax():
    x = torch.randn(4, 6, 5)
    torch.testing.assert_close(entmax15(x, dim=1), entmax15(x.transpose(1, -1)).transpose(1, -1))
    torch.testing.assert_close(softmax(x), torch.softmax(x, -1))
    assert softmax(x.half()).dtype == torch.float16


@pytest.mark.parametrize("spec,alpha", [("entmax:1.3", 1.3), ("entmax:1.5", 1.5), ("sparsemax", 2.0)])
def test_module_specs(spec, alpha):
    x = torch.randn(3, 10)
    torch.testing.assert_close(make_normalizer(spec)(x), ours(x, alpha))


@pytest.mark.parametrize("spec,fragment", [("entmax:0", "above 0"), ("entmax:-1", "above 0"),
                                           ("entmax:nan", "above 0"), ("entmax:abc", "alpha must be a number"),
                                           ("entmax:learned:2.5", "inside (1, 2)"), ("entmax:learnedx", "write"),
                                           ("entmax:learned", "pass num_heads"), ("gumbel", "choose one of")])
def test_bad_specs_name_the_fix(spec, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        make_normalizer(spec)


@pytest.mark.parametrize("spec,name", [("entmax:1", "softmax"), ("entmax:2.5", "entmax:2.5"),
                                       ("entmax:0.5", "entmax:0.5"), ("entmax:2", "sparsemax")])
def test_any_positive_alpha_is_a_spec(spec, name):
    normalizer = make_normalizer(spec)
    assert normalizer.name == name
    x = torch.randn(3, 10, dtype=torch.float64)
    alpha = float(spec.split(":")[1])
    expected = torch.softmax(x, -1) if alpha == 1 else reference.entmax_bisect(x, alpha, n_iter=200)
    torch.testing.assert_close(normalizer(x), expected, atol=1e-7, rtol=0)
