"""Which layers count as "early": the first quarter, unless the user names them."""

from __future__ import annotations

from collections.abc import Sequence


def early_layers(layers: Sequence[int] | int, named: Sequence[int] | None = None) -> list[int]:
    """0-based early layers: ``named`` when given, else the first quarter (at least one) of ``layers``
    (a sequence of 0-based layer indices, or a layer count)."""
    if named:
        return list(named)
    layers = range(layers) if isinstance(layers, int) else layers
    return list(layers[: max(1, len(layers) // 4)])
