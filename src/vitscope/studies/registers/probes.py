"""Token probes of the registers study: what high-norm, normal, CLS, register and mean-patch tokens carry.

Per token layer, the census's high-norm patches (first threshold mode) form the ``high-norm`` group and the
other patches of the same images the ``normal`` group (the probes draw the same number from each); a layer
with fewer than ``min_group`` high-norm patches is probed without these two groups (its table reads N/A).
Probes: position, pixels and pixels through a small MLP (patch groups only) and image class, with the randomly
initialised backbone and chance rows (``vitscope.probes.tokens``). Hierarchical models (Swin, PVT-v2) are probed
per stage, at each stage's last block (where its threshold is fixed), on that stage's grid and stride; the
``layers`` setting applies to plain ViTs only. Plain ViTs with CLS also get the image classifier on CLS alone and on
CLS with the mean high-norm token (``vitscope.probes.cls_with_tokens``; ``cls_probe``), at the same layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.data import ImageDataset
from vitscope.probes.cls_with_tokens import cls_with_tokens
from vitscope.probes.features import depth_of, extract_features, parse_layers
from vitscope.probes.results import CHANCE
from vitscope.probes.stage_features import is_hierarchical, stage_last_layers
from vitscope.probes.tokens import PROBES, probe_tokens


@dataclass
class ProbeSettings:
    """``layers``: token layers (``"0,2,last"``, ``all``); ``fit_options`` go to the logistic fits (None: the
    probes' own lr/weight-decay sweep); ``max_tokens`` caps each group's tokens per split."""

    enabled: bool = True
    layers: str = "last"
    probes: list[str] = field(default_factory=lambda: list(PROBES))  # position, pixels, pixels-mlp, class
    max_tokens: int = 1024
    min_group: int = 16
    fit_options: dict[str, Any] | None = None
    batch_size: int = 64
    cls_probe: bool = True  # CLS alone against CLS + the mean high-norm token, per image (claims R7, R9)


def high_norm_groups(high: Tensor, min_group: int) -> dict[str, Tensor]:
    """``high-norm`` and matched ``normal`` patch masks (images, patches), or {} with too few high-norm ones."""
    if int(high.sum()) < min_group:
        return {}
    with_high = high.any(dim=1, keepdim=True)
    return {"high-norm": high, "normal": ~high & with_high}


def probe_model(model: nn.Module, dataset: ImageDataset, label: str, high_norm: dict[int, Tensor],
                settings: ProbeSettings, *, device: torch.device | str = "cpu", img_size: int | None = None,
                baseline: bool = True, progress: bool = False) -> list[dict[str, Any]]:
    """Rows of every token probe at every chosen layer (see the module docstring)."""
    if not settings.enabled:
        return []
    layers = stage_last_layers(model) if is_hierarchical(model) else parse_layers(settings.layers, depth_of(model))
    found = {layer: high_norm_groups(high_norm[layer], settings.min_group) if layer in high_norm else {}
             for layer in layers}
    groups = {name: {layer: g.get(name) for layer, g in found.items()} for name in ("high-norm", "normal")}
    result = probe_tokens(model, dataset, layers, probes=settings.probes, patch_groups=groups,
                          max_tokens=settings.max_tokens, baseline=baseline, label=label,
                          batch_size=settings.batch_size, device=device, img_size=img_size, cache=False,
                          progress=progress, fit_options=settings.fit_options)  # one backbone pass for every layer
    # chance levels depend on the model's grid and stride: each names the model it belongs to
    rows = [row | {"layer_kind": "token"} | ({"chance_for": label} if row["model"] == CHANCE else {})
            for row in result.rows]
    if settings.cls_probe and not is_hierarchical(model):
        features = extract_features(model, dataset, layers, batch_size=settings.batch_size, device=device,
                                    img_size=img_size, cache=False, progress=progress)
        for layer in layers:
            rows += cls_with_tokens(features[layer], dataset.labels, {"high-norm": groups["high-norm"][layer]},
                                    label=label, fit_options=settings.fit_options)
    return rows

