"""The locality study (arXiv 2605.16390): the study runner, its results files and its verdicts."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
