"""Figures shared by the reports and ``vitscope analyze``: ``common`` (matplotlib, saving, reference style),
``locality`` (MAD and entropy), ``norms`` (token norms), ``probes`` (probe scores, PCA maps), ``analysis`` (the
figures of ``vitscope analyze``). Each study's own figures live in its report subpackage."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
