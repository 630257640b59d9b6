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
  the upper tail of one distribution): the ``auto`` (Otsu) split of the patch-token norms leaves at most
  ``MAX_FRACTION`` of patches above a threshold at least ``MIN_RATIO`` times the median patch norm
  (``separate_mode``). A percentile threshold marks its share of tokens whatever the norms look like, so a
  high-norm fraction is a finding only beside this test.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from vitscope.metrics.norms import high_norm_threshold

MAX_FRACTION = 0.10  # at most this share of patches above the auto split ...
MIN_RATIO = 2.0  # ... whose threshold is at least this many times the median patch norm


def is_separate_mode(fraction: float, threshold: float, median: float) -> bool:
    """The test on an ``auto`` split already measured: ``fraction`` of patches above ``threshold`` (a norm), against
    the ``median`` patch norm."""
    return bool(median) and 0 < fraction <= MAX_FRACTION and threshold >= MIN_RATIO * median


@dataclass(frozen=True)
class ModeCheck:
    """The ``auto`` split of one layer's patch-token norms: its ``threshold`` (a norm), the ``fraction`` of
    patches above it, the ``median`` norm, ``ratio`` = threshold / median, and ``separate``: the test's answer."""

    threshold: float
    fraction: float
    median: float
    ratio: float
    separate: bool

    def describe(self) -> str:
        """One sentence: whether the layer has a separate high-norm mode, and the numbers that say so."""
        numbers = (f"the auto split puts {self.fraction:.1%} of patches above {self.ratio:.2g}x the median norm; "
                   f"a separate mode needs <= {MAX_FRACTION:.0%} above >= {MIN_RATIO:g}x")
        if self.separate:
            return f"a separate high-norm mode ({numbers})"
        return f"no separate high-norm mode: the flagged tokens are the tail of one distribution ({numbers})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"max_fraction": MAX_FRACTION, "min_ratio": MIN_RATIO}


def separate_mode(patch_norms: Tensor) -> ModeCheck:
    """The separate-high-norm-mode test (module docstring) on one layer's patch-token norms (any shape)."""
    norms = patch_norms.flatten().float()
    threshold = high_norm_threshold(norms, "auto").value
    fraction = float((norms > threshold).float().mean())
    median = float(norms.median())
    ratio = threshold / median if median > 0 else float("inf")
    return ModeCheck(threshold, fraction, median, ratio, is_separate_mode(fraction, threshold, median))


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
