"""The settings of a dense probe (segmentation or depth), one object (``DenseProbeSettings``)."""

from __future__ import annotations

from dataclasses import dataclass

from vitscope.probes.dense.depth_grid import DEFAULT_BIN_RESOLUTION
from vitscope.probes.dense.tiles import TILE_VALUES
from vitscope.probes.settings import ProbeSettings

DEFAULT_LOSS_POINTS = 4096
DEFAULT_LRS = (1e-3, 1e-2, 1e-1)
DEFAULT_WEIGHT_DECAYS = (1e-4, 1e-1)
DEFAULT_HELD_FRACTION = 0.2


@dataclass(frozen=True, kw_only=True)
class DenseProbeSettings(ProbeSettings):
    """A dense probe's settings beside the shared ones (``ProbeSettings``: ``batch_size`` images per backbone pass).

    - ``with_cls``: the heads to fit, without (False) and with (True) the CLS token concatenated to every patch;
    - ``steps``: optimiser steps of every head (AdamW, cosine schedule); None: ``epochs`` passes over the training
      images when given, else ``vitscope.probes.dense.training.DEFAULT_STEPS``; ``head_batch_size`` images a step;
    - ``lrs``, ``weight_decays``: the heads' grid, as DINOv2's linear evaluation sweeps it: with more than one
      pair, every pair is trained on the training split less its last ``held_fraction`` (in file order: for the
      frames of a video, a contiguous stretch, so no near-duplicate of a held-out frame is fitted) and scored on
      that held-out part (mIoU; depth: RMSE); each head (backbone, layer, with or without CLS) keeps its best pair
      and is refitted on the whole training split. The evaluation images are never used to choose;
    - ``head_seeds``: heads refitted with seeds ``seed``, ``seed + 1``, ...: scores are their mean and intervals add
      their spread (``vitscope.probes.dense.intervals``); ``blocks``: jackknife groups of consecutive evaluation
      images (None: one image a group);
    - ``eigen_crop``: score depth in NYU's Eigen crop (None: as the dataset says); ``min_depth``, ``max_depth``:
      the depth range in metres (bins and scored pixels);
    - ``size``: None resizes every image whole to the backbone's input side; S resizes to short side S, trains on
      ``crops_per_image`` random crops and evaluates by sliding window (``vitscope.probes.dense.windows``);
    - ``loss_points``: label pixels per image in each training step's loss, or ``"full"`` for every pixel;
    - ``tile_values``: logits per evaluation tile (the same predictions at any value; larger holds more memory);
    - ``bin_resolution`` (depth): ``"x4"`` normalises the bins on the patch grid upsampled x4 and resizes the depth
      (DINOv2's linear head), ``"label"`` at every label pixel (``vitscope.probes.dense.depth_grid``).
    """

    with_cls: tuple[bool, ...] = (False, True)
    steps: int | None = None
    epochs: float | None = None
    head_batch_size: int = 16
    lrs: tuple[float, ...] = DEFAULT_LRS
    weight_decays: tuple[float, ...] = DEFAULT_WEIGHT_DECAYS
    held_fraction: float = DEFAULT_HELD_FRACTION
    head_seeds: int = 1
    blocks: int | None = None
    eigen_crop: bool | None = None
    min_depth: float = 1e-3
    max_depth: float = 10.0
    size: int | None = None
    crops_per_image: int = 1
    loss_points: int | str | None = DEFAULT_LOSS_POINTS
    tile_values: int = TILE_VALUES
    bin_resolution: str = DEFAULT_BIN_RESOLUTION

    def __post_init__(self) -> None:
        if not self.lrs or not self.weight_decays:
            raise ValueError("give at least one learning rate and one weight decay")
        if any(not lr > 0 for lr in self.lrs) or any(wd < 0 for wd in self.weight_decays):
            raise ValueError(f"learning rates must be > 0 and weight decays >= 0; got {self.lrs} and "
                             f"{self.weight_decays}")
        if self.steps is not None and self.epochs is not None:
            raise ValueError(f"give dense heads steps ({self.steps}) or epochs ({self.epochs}), not both")
        if not 0 < self.held_fraction < 1:
            raise ValueError(f"held_fraction={self.held_fraction} must lie in (0, 1)")
        if self.head_seeds < 1 or self.head_batch_size < 1:
            raise ValueError(f"head_seeds ({self.head_seeds}) and head_batch_size ({self.head_batch_size}) must be "
                             "at least 1")

    def grid(self) -> list[tuple[float, float]]:
        """Every (learning rate, weight decay) pair of the sweep."""
        return [(float(lr), float(wd)) for lr in self.lrs for wd in self.weight_decays]
