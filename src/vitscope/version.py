"""vitscope's version, importable from the lowest floor (provenance records it)."""

__version__ = "0.1.0"
