"""The settings of a dense probe (segmentation or depth), one object (``DenseProbeSettings``)."""

from __future__ import annotations

from dataclasses import dataclass

from vitscope.probes.dense.depth_grid import DEFAULT_BIN_RESOLUTION
from vitscope.probes.dense.tiles import TILE_VALUES
from vitscope.probes.settings import ProbeSettings

DEFAULT_LOSS_POINTS = 4096


@dataclass(frozen=True, kw_only=True)
class DenseProbeSettings(ProbeSettings):
    """A dense probe's settings beside the shared ones (``ProbeSettings``; batches of 16 images here).

    - ``with_cls``: the heads to fit, without (False) and with (True) the CLS token concatenated to every patch;
    - ``epochs``, ``lr``: the heads' training (AdamW over the cached features);
    - ``eigen_crop``: score depth in NYU's Eigen crop (None: as the dataset says); ``min_depth``, ``max_depth``:
      the depth range in metres (bins and scored pixels);
    - ``size``: None resizes every image whole to the backbone's input side; S resizes to short side S, trains on
      ``crops_per_image`` random crops and evaluates by sliding window (``vitscope.probes.dense.windows``);
    - ``loss_points``: label pixels per image in each training step's loss, or ``"full"`` for every pixel;
    - ``tile_values``: logits per evaluation tile (the same predictions at any value; larger holds more memory);
    - ``bin_resolution`` (depth): ``"x4"`` normalises the bins on the patch grid upsampled x4 and resizes the depth
      (DINOv2's linear head), ``"label"`` at every label pixel (``vitscope.probes.dense.depth_grid``).
    """

    batch_size: int = 16
    with_cls: tuple[bool, ...] = (False, True)
    epochs: int = 20
    lr: float = 1e-2
    eigen_crop: bool | None = None
    min_depth: float = 1e-3
    max_depth: float = 10.0
    size: int | None = None
    crops_per_image: int = 1
    loss_points: int | str | None = DEFAULT_LOSS_POINTS
    tile_values: int = TILE_VALUES
    bin_resolution: str = DEFAULT_BIN_RESOLUTION
