"""Analyses of a trained (or loaded) model over a dataset."""

from vitscope.analyze.locality import LocalityResult, measure_locality, write_locality
from vitscope.lazy_import import submodule_getattr

__all__ = ["LocalityResult", "measure_locality", "write_locality"]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
