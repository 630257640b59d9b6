"""Where high-norm tokens sit and what attends to them: pure tensor functions (no models).

Definitions (docs/definitions.md, high-norm tokens):

* A patch token is high-norm when its norm exceeds a threshold fixed on the detection layer; prefix
  tokens (CLS and registers) are never candidates: ``high_norm_mask`` drops the first ``prefix`` tokens.
* A patch is *object* when at least half of its pixels are object pixels (mask > 0), or, with boxes, when
  its centre lies inside a box; otherwise it is *background*.
* Local image statistics of a patch: its mean intensity (mean over channels and pixels) and its local
  variance (variance of the channel-mean intensity over the patch's pixels).
* Attention mass on a token set: the sum of a query row's probabilities over the set's keys; its share is
  the set's fraction of all keys (what uniform attention would give).
* A *separate high-norm mode* (the registers study's test of whether high-norm tokens exist at all, rather than
  the upper tail of one distribution; ``separate_mode``, per layer): the split at the largest gap in the upper
  tail of the log patch-token norms (``vitscope.metrics.norms.largest_gap_split``, the ``auto`` threshold) leaves
  between ``max(MIN_COUNT, MIN_FRACTION n)`` and ``MAX_FRACTION n`` of the n patches above an empty gap at least
  ``MIN_GAP`` times as wide as the interquartile range of the log norms, and its threshold is at least ``MIN_RATIO``
  times the median patch norm. Validated on planted modes of 0.5-5 % and on unimodal samples (lognormal, gamma,
  Weibull, half-Cauchy, |t3|, Pareto) in ``tests/test_separate_mode.py``, which states the miss and
  false-positive rates. A mode whose tokens touch the bulk (no empty gap) is missed by design. A percentile
  threshold marks its share of tokens whatever the norms look like, so a high-norm fraction is a finding only
  beside this test. All of these constants are vitscope's: the seeds name no test.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vitscope.metrics.norms import MAX_FRACTION, MIN_COUNT, MIN_FRACTION, largest_gap_split

MIN_GAP = 1.0  # the empty gap, in interquartile ranges of the log norms (the bulk's spread) ...
MIN_RATIO = 2.0  # ... and the split at least this many times the median patch norm


@dataclass(frozen=True)
class ModeCheck:
    """The largest-gap split of one layer's patch-token norms and the test's answer: ``threshold`` (a norm), the
    ``fraction`` and ``count`` of patches above it, the ``median`` norm, ``ratio`` = threshold / median,
    ``gap_iqr`` = the empty gap's width in interquartile ranges of the log norms, and ``separate``."""

    threshold: float
    fraction: float
    count: int
    median: float
    ratio: float
    gap_iqr: float
    separate: bool

    def describe(self) -> str:
        """One sentence: whether the layer has a separate high-norm mode, and the numbers that say so."""
        numbers = (f"the largest gap in the upper tail puts {self.fraction:.2%} of patches ({self.count}) above "
                   f"{self.ratio:.3g}x the median norm, across an empty gap of {self.gap_iqr:.3g} interquartile "
                   f"ranges of the log norms; a separate mode needs {MIN_GAP:g} or more, at most {MAX_FRACTION:.0%} "
                   f"and at least {MIN_COUNT} tokens above, at {MIN_RATIO:g}x the median or more")
        if self.separate:
            return f"a separate high-norm mode ({numbers})"
        return f"no separate high-norm mode: the flagged tokens are the tail of one distribution ({numbers})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"max_fraction": MAX_FRACTION, "min_fraction": MIN_FRACTION, "min_count": MIN_COUNT,
                               "min_gap_iqr": MIN_GAP, "min_ratio": MIN_RATIO}


def separate_mode(patch_norms: Tensor | np.ndarray) -> ModeCheck:
    """The separate-high-norm-mode test (module docstring) on one layer's patch-token norms (any shape)."""
    split = largest_gap_split(patch_norms)
    ratio = split.threshold / split.median if split.median > 0 else math.inf
    gap_iqr = split.gap / split.iqr if split.iqr > 0 else (math.inf if split.gap > 0 else 0.0)
    fewest = max(MIN_COUNT, math.ceil(MIN_FRACTION * split.n))
    separate = fewest <= split.above <= MAX_FRACTION * split.n and gap_iqr >= MIN_GAP and ratio >= MIN_RATIO
    return ModeCheck(split.threshold, split.above / split.n, split.above, split.median, ratio, gap_iqr, separate)


def no_mode_possible(max_norm: float, median: float) -> bool:
    """Whether stored summaries alone rule a separate mode out: the largest norm lies below ``MIN_RATIO`` times
    the median, so no split (the midpoint of a gap below the largest norm) can reach ``MIN_RATIO`` x the median."""
    return max_norm < MIN_RATIO * median


def mode_units(norms: Tensor, check: ModeCheck) -> dict[str, list]:
    """Per image, the count of patches in the separate mode (0 for every image when there is none): ``norms``
    (images, patches); ``{"images", "sums", "counts"}`` as ``vitscope.metrics.units.per_image`` (sums: patches
    in the mode, counts: patches), so that a comparison of mode fractions resamples images."""
    inside = (norms > check.threshold) if check.separate else torch.zeros_like(norms, dtype=torch.bool)
    images = list(range(norms.shape[0]))
    return {"images": images, "sums": inside.sum(dim=1).double().tolist(), "counts": [norms.shape[1]] * len(images)}


def high_norm_mask(norms: Tensor, threshold: float, prefix: int = 0) -> Tensor:
    """(B, N) boolean: patch tokens of ``norms`` (B, T) whose norm exceeds ``threshold``; the first
    ``prefix`` tokens (CLS, registers) are excluded."""
    if norms.ndim != 2:
        raise ValueError(f"norms must be (batch, tokens), got shape {tuple(norms.shape)}")
    if not 0 <= prefix < norms.shape[1]:
        raise ValueError(f"prefix={prefix} must lie in [0, {norms.shape[1]}) for {norms.shape[1]} tokens")
    return norms[:, prefix:] > threshold


def patch_object_fraction(masks: Tensor, grid: tuple[int, int]) -> Tensor:
    """(B, N) fraction of object pixels (mask > 0) in each patch of a ``grid`` over masks (B, H, W)
    whose sides are multiples of the grid (row-major patch order)."""
    b, h, w = masks.shape
    gh, gw = grid
    if h % gh or w % gw:
        raise ValueError(f"mask size {h}x{w} is not a multiple of the patch grid {gh}x{gw}")
    fg = (masks > 0).float().view(b, gh, h // gh, gw, w // gw)
    return fg.mean(dim=(2, 4)).reshape(b, gh * gw)


def patch_in_boxes(boxes: Tensor, grid: tuple[int, int], image_size: tuple[int, int]) -> Tensor:
    """(B, N) boolean: patch centres inside a box; ``boxes`` (B, 4) or (B, K, 4) pixels x0, y0, x1, y1."""
    boxes = boxes[:, None] if boxes.ndim == 2 else boxes
    (gh, gw), (h, w) = grid, image_size
    cy = (torch.arange(gh, dtype=torch.float32) + 0.5) * h / gh
    cx = (torch.arange(gw, dtype=torch.float32) + 0.5) * w / gw
    yy, xx = (c.reshape(1, 1, -1) for c in torch.meshgrid(cy, cx, indexing="ij"))
    b = boxes.float()[..., None]  # (B, K, 4, 1)
    inside = (xx >= b[:, :, 0]) & (xx < b[:, :, 2]) & (yy >= b[:, :, 1]) & (yy < b[:, :, 3])
    return inside.any(dim=1)


def patch_statistics(images: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Mean intensity and local variance (B, N) of each patch of images (B, C, H, W) on ``grid``.

    Intensity is the channel mean of each pixel (in the images' own units); the variance is the
    population variance of that intensity over the patch's pixels."""
    b, _, h, w = images.shape
    gh, gw = grid
    if h % gh or w % gw:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch grid {gh}x{gw}")
    gray = images.float().mean(dim=1).view(b, gh, h // gh, gw, w // gw).permute(0, 1, 3, 2, 4)
    pixels = gray.reshape(b, gh * gw, -1)
    return pixels.mean(dim=-1), pixels.var(dim=-1, unbiased=False)


def region_share(high: Tensor, on_object: Tensor) -> dict[str, float]:
    """Where high-norm patches sit: ``background_share_high`` is the fraction of high-norm patches on the
    background, ``background_share_all`` the fraction of all patches on the background (its chance level),
    ``count_high`` the number of high-norm patches. ``high`` and ``on_object`` are (B, N) booleans."""
    if high.shape != on_object.shape:
        raise ValueError(f"high-norm map {tuple(high.shape)} and object map {tuple(on_object.shape)} differ")
    background = ~on_object.bool()
    count = int(high.sum())
    return {
        "background_share_high": int((background & high).sum()) / count if count else float("nan"),
        "background_share_all": float(background.float().mean()),
        "count_high": count,
    }


def attention_mass(probs: Tensor, key_set: Tensor) -> Tensor:
    """Attention mass (B, heads, Tq) each query puts on a set of keys: ``probs`` (B, heads, Tq, Tk) and
    ``key_set`` (B, Tk) boolean."""
    if key_set.shape != (probs.shape[0], probs.shape[-1]):
        raise ValueError(f"key set {tuple(key_set.shape)} must be (batch, keys) = "
                         f"{(probs.shape[0], probs.shape[-1])}")
    return (probs.float() * key_set[:, None, None, :].float()).sum(dim=-1)


def mass_on_high_norm(probs: Tensor, high: Tensor, prefix: int) -> dict[str, Tensor]:
    """Mass that CLS and patch queries put on high-norm patch keys, per image (B,), averaged over heads
    (and over patch queries), with the high-norm keys' share of all keys (B,) beside it.

    ``probs`` (B, heads, T, T) over all tokens; ``high`` (B, N) the high-norm patches; ``prefix`` the
    number of prefix tokens (CLS first when present). ``cls`` is NaN without a prefix token."""
    b, _, t, _ = probs.shape
    key_set = torch.cat([high.new_zeros(b, prefix), high.bool()], dim=1)
    mass = attention_mass(probs, key_set)  # (B, heads, T)
    return {
        "cls": mass[:, :, 0].mean(dim=1) if prefix else torch.full((b,), float("nan")),
        "patch": mass[:, :, prefix:].mean(dim=(1, 2)),
        "share": key_set.float().sum(dim=1) / t,
    }
