"""Figures shared by the reports and ``vitscope analyze``: ``common`` (matplotlib, saving, reference style),
``locality`` (MAD and entropy), ``norms`` (token norms), ``probes`` (probe scores, PCA maps), ``analysis`` (the
figures of ``vitscope analyze``). Each study's own figures live in its report subpackage."""
