"""Settings of the probes on a frozen backbone, one object per probe family (as timm's and DINOv2's configs):
``ProbeSettings`` holds what every probe shares (how features are read, the seed, the random-init twin), and each
family adds its own (``ImageProbeSettings`` here, ``vitscope.probes.dense.settings.DenseProbeSettings``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

FEATURE_FIELDS = ("norm", "batch_size", "device", "img_size", "cache", "progress")


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """What every probe shares.

    - ``norm``: intermediate token layers are read after the model's final norm (as DINOv2's probes do);
    - ``batch_size``: images per forward pass of the backbone;
    - ``device``: where the backbone and the heads run;
    - ``img_size``: the backbone's input side in pixels (None: the model's own);
    - ``cache``: features kept on disk (True: vitscope's cache; a folder; False: none), keyed by model and data;
    - ``progress``: progress bars (rate, ETA) on stderr;
    - ``seed``: fitting and the random-init twin;
    - ``baseline``: also probe the randomly initialised twin of the backbone, the floor beside every number;
    - ``label``: the model's name in the result rows.
    """

    norm: bool = True
    batch_size: int = 64
    device: torch.device | str = "cpu"
    img_size: int | None = None
    cache: Any = True
    progress: bool = True
    seed: int = 0
    baseline: bool = True
    label: str = "model"

    def feature_options(self) -> dict[str, Any]:
        """The keyword arguments of ``vitscope.probes.features.extract_features``."""
        return {name: getattr(self, name) for name in FEATURE_FIELDS}

    def replace(self, **changes: Any) -> ProbeSettings:
        """A copy with ``changes``; an unknown name is a TypeError naming it."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class ImageProbeSettings(ProbeSettings):
    """Image-level probes (``vitscope.probes.image``): ``pool`` ('cls', 'mean' or 'both') picks the image feature;
    ``dino_last4`` adds DINO's linear protocol (the last four blocks' CLS tokens concatenated); ``fit_options`` go to
    the linear probe's ``fit_classifier``; ``k`` and ``temperature`` are the kNN vote's."""

    pool: str = "cls"
    dino_last4: bool = False
    fit_options: Mapping[str, Any] | None = None
    k: int = 20
    temperature: float = 0.07
