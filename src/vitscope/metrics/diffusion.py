"""Semantic diffusion, the geometric and cosine parts: which patches show background, and how close their
tokens are to the CLS token.

Semantic diffusion (our measure, after arXiv 2605.23868): per token layer, (a) the top-1 of an image-class
linear probe trained on single *background* patch tokens and (b) the mean cosine similarity between
background patch tokens and the CLS token. A background patch is one whose centre lies outside every object
box, or on a mask pixel labelled background. Higher values mean more global semantics leaked into tokens
that locally show no object. The probe part (a) lives in ``vitscope.probes.diffusion``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def patch_centres(grid: tuple[int, int], image_hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Centres (y, x) of a ``grid`` (rows, cols) of patches spread over an image of ``image_hw`` pixels, in
    that image's pixel coordinates (float32, each (rows * cols,), row-major like the tokens).

    The model's input is the image resized to the grid's side, so a patch centre maps back linearly."""
    rows, cols = grid
    height, width = image_hw
    ys = (torch.arange(rows, dtype=torch.float32) + 0.5) * height / rows
    xs = (torch.arange(cols, dtype=torch.float32) + 0.5) * width / cols
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return yy.flatten(), xx.flatten()


def background_patches(grid: tuple[int, int], image_hw: tuple[int, int], *, masks: Tensor | None = None,
                       boxes: Tensor | None = None, background_value: int = 0) -> Tensor:
    """(N, rows * cols) bool: True where the patch centre shows background.

    ``masks`` (N, H, W): the centre pixel's label equals ``background_value`` (other values, ignore labels
    included, are not background). ``boxes`` (N, 4) or (N, K, 4) pixels x0, y0, x1, y1 (rows of NaN pad
    images with fewer boxes): the centre lies outside every box. Masks win when both are given."""
    yy, xx = patch_centres(grid, image_hw)
    if masks is not None:
        masks = torch.as_tensor(masks)
        if tuple(masks.shape[-2:]) != tuple(image_hw):
            raise ValueError(f"masks are {tuple(masks.shape[-2:])} pixels but the images {tuple(image_hw)}")
        rows = yy.long().clamp(max=image_hw[0] - 1)
        cols = xx.long().clamp(max=image_hw[1] - 1)
        return masks[:, rows, cols] == background_value
    if boxes is None:
        raise ValueError("background patches need object masks or boxes; this dataset has neither (use "
                         "synthetic scenes, or a dataset with masks or boxes)")
    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    boxes = boxes[:, None] if boxes.ndim == 2 else boxes  # (N, K, 4)
    x0, y0, x1, y1 = (boxes[..., i, None] for i in range(4))  # (N, K, 1)
    inside = (xx >= x0) & (xx < x1) & (yy >= y0) & (yy < y1)  # NaN boxes compare False
    return ~inside.any(dim=1)


def background_cls_cosine(patches: Tensor, cls: Tensor, background: Tensor) -> Tensor:
    """Per image, the mean cosine similarity between its background patch tokens and its CLS token.

    ``patches`` (N, P, D), ``cls`` (N, D), ``background`` (N, P) bool -> (N,) float32, NaN for an image
    without background patches."""
    if patches.shape[:2] != background.shape or len(cls) != len(patches):
        raise ValueError(f"patches {tuple(patches.shape)}, cls {tuple(cls.shape)} and background mask "
                         f"{tuple(background.shape)} do not match (N, P, D), (N, D), (N, P)")
    cosine = F.cosine_similarity(patches.float(), cls.float()[:, None, :], dim=-1)  # (N, P)
    weight = background.float()
    count = weight.sum(1)
    total = (cosine * weight).sum(1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.nan)
