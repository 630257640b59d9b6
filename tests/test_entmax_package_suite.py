"""The `entmax` package's own tests (``entmax/test_root_finding.py`` and ``entmax/test_mask.py`` from the installed
package) run against vitscope: entmax_bisect, sparsemax_bisect, entmax15, sparsemax, Entmax15 and Sparsemax are
routed to vitscope's functions; normmax, budget and top-k (``k=``) stay with the package."""

import importlib.util
from pathlib import Path

import entmax
import entmax.activations
import entmax.root_finding
import pytest
from torch import Tensor, nn

import vitscope.attention as vs

PACKAGE_TESTS = ("test_root_finding", "test_mask")
# tests of the package's own normmax and budget, which vitscope does not replace, are left out (one of them,
# test_budget_grad_multiple_k, gradchecks normmax at a random alpha and fails for some global RNG states)
PACKAGE_ONLY = ("normmax", "budget")


def entmax_bisect(X: Tensor, alpha=1.5, dim: int = -1, n_iter: int = 50, ensure_sum_one: bool = True) -> Tensor:
    return vs.entmax(X, alpha, dim)


def sparsemax_bisect(X: Tensor, dim: int = -1, n_iter: int = 50, ensure_sum_one: bool = True) -> Tensor:
    return vs.sparsemax(X, dim)


def sparsemax(X: Tensor, dim: int = -1, k: int | None = None) -> Tensor:
    return vs.sparsemax(X, dim) if k is None else entmax.activations.sparsemax(X, dim, k)


def entmax15(X: Tensor, dim: int = -1, k: int | None = None) -> Tensor:
    return vs.entmax15(X, dim) if k is None else entmax.activations.entmax15(X, dim, k)


class Sparsemax(nn.Module):
    def __init__(self, dim: int = -1, k: int | None = None):
        super().__init__()
        self.dim, self.k = dim, k

    def forward(self, X: Tensor) -> Tensor:
        return sparsemax(X, self.dim, self.k)


class Entmax15(nn.Module):
    def __init__(self, dim: int = -1, k: int | None = None):
        super().__init__()
        self.dim, self.k = dim, k

    def forward(self, X: Tensor) -> Tensor:
        return entmax15(X, self.dim, self.k)


ROUTES = {entmax.root_finding: {"entmax_bisect": entmax_bisect, "sparsemax_bisect": sparsemax_bisect},
          entmax.activations: {"sparsemax": sparsemax, "entmax15": entmax15, "Sparsemax": Sparsemax,
                               "Entmax15": Entmax15}}


def load_routed(name: str):
    """Import the package's test module ``name`` while its ``from entmax... import`` lines see vitscope's
    functions (the package modules are restored right after)."""
    path = Path(entmax.__file__).with_name(f"{name}.py")
    if not path.exists():
        pytest.skip(f"the installed entmax has no {path.name}", allow_module_level=True)
    saved = {module: {attr: getattr(module, attr) for attr in routes} for module, routes in ROUTES.items()}
    try:
        for module, routes in ROUTES.items():
            for attr, fn in routes.items():
                setattr(module, attr, fn)
        spec = importlib.util.spec_from_file_location(f"entmax_package_{name}", path)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
    finally:
        for module, attrs in saved.items():
            for attr, value in attrs.items():
                setattr(module, attr, value)
    return loaded


for _name in PACKAGE_TESTS:
    _module = load_routed(_name)
    for _test, _fn in vars(_module).items():
        if _test.startswith("test_") and not any(word in _test for word in PACKAGE_ONLY):
            globals()[f"{_test}__{_name}"] = _fn


def test_the_routed_functions_are_vitscopes():
    routed = load_routed("test_root_finding")
    assert routed.entmax_bisect is entmax_bisect and routed.entmax15 is entmax15
    assert routed.normmax_bisect is entmax.root_finding.normmax_bisect  # left to the package
    masks = load_routed("test_mask")
    assert isinstance(masks.funcs[0], Sparsemax) and masks.funcs[4] is sparsemax_bisect
