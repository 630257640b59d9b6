"""The locality study (arXiv 2605.16390): the runner (``study``), each run's typed record (``records``), the readings
the seed leaves open (``readings``), the registry's claims judged on the runs (``verdicts``, with ``scope``) and the
typed results file (``results``)."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
