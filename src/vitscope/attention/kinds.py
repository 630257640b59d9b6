"""The normaliser kinds shared with the native kernels, read from ``kinds.def`` (the one table C++ includes)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DEFINITIONS = Path(__file__).with_name("kinds.def")
_LINE = re.compile(r"^VITSCOPE_KIND\((\w+),\s*(\d+),\s*([0-9.]+)\)\s*$")


@dataclass(frozen=True)
class Kind:
    """One normaliser kind: its ``name``, the integer ``code`` the kernels switch on, and its fixed ``alpha``
    (None where alpha is given per row)."""

    name: str
    code: int
    alpha: float | None


@cache
def kinds() -> dict[str, Kind]:
    """Every kind of ``kinds.def`` by name."""
    found = {}
    for line in DEFINITIONS.read_text().splitlines():
        match = _LINE.match(line.strip())
        if match:
            name, code, alpha = match.group(1), int(match.group(2)), float(match.group(3))
            found[name] = Kind(name, code, alpha or None)
    if not found:
        raise RuntimeError(f"{DEFINITIONS} lists no VITSCOPE_KIND lines")
    return found


def kind(name: str) -> Kind:
    """The kind called ``name``; ValueError naming the known ones otherwise."""
    table = kinds()
    if name not in table:
        raise ValueError(f"unknown normaliser kind {name!r}; the kernels know {', '.join(table)}")
    return table[name]
