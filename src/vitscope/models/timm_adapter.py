"""timm architectures inside vitscope: building them without any download."""

from __future__ import annotations

from typing import Any

import timm
from torch import nn


def create_timm(name: str, **overrides: Any) -> nn.Module:
    """A timm model ``name`` with random weights (``pretrained`` is never fetched)."""
    if overrides.pop("pretrained", False):
        raise ValueError(
            f"timm:{name} pretrained weights are not fetched; download them yourself and pass --weights PATH"
        )
    try:
        return timm.create_model(name, pretrained=False, **overrides)
    except RuntimeError as err:  # timm raises RuntimeError for unknown names
        raise ValueError(f"timm does not know the model {name!r} ({err}); see timm.list_models()") from None
