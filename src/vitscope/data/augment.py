"""Batched augmentations on the training device, with per-image randomness.

Each function takes a batch (B, C, H, W) and a ``torch.Generator`` on the batch's device, so a run is
reproducible from (seed, step) alone. uint8 stages come first (crop, flip, AutoAugment), float stages
after normalisation (ColorJitter works on [0, 1] floats; CutMix and Mixup on normalised floats).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def _uniform(shape, generator: torch.Generator, device, low: float = 0.0, high: float = 1.0) -> Tensor:
    return torch.rand(shape, generator=generator, device=device) * (high - low) + low


def random_crop(images: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """Zero-pad by ``padding`` pixels and crop back to the original size at a random offset per image."""
    if padding <= 0:
        return images
    b, c, h, w = images.shape
    padded = torch.nn.functional.pad(images, (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=images.device)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=images.device)
    rows = (dy[:, None] + torch.arange(h, device=images.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=images.device))[:, None, None, :]
    batch = torch.arange(b, device=images.device)[:, None, None, None]
    chans = torch.arange(c, device=images.device)[None, :, None, None]
    return padded[batch, chans, rows, cols]


def random_flip(images: Tensor, generator: torch.Generator, p: float = 0.5) -> Tensor:
    """Mirror each image left-right with probability ``p``."""
    flip = _uniform((images.shape[0], 1, 1, 1), generator, images.device) < p
    return torch.where(flip, images.flip(-1), images)


def color_jitter(images: Tensor, generator: torch.Generator, brightness: float = 0.4, contrast: float = 0.4,
                 saturation: float = 0.4) -> Tensor:
    """Per-image brightness, contrast and saturation factors drawn from [1 - s, 1 + s]; [0, 1] floats."""
    b = images.shape[0]
    dev = images.device

    def factor(strength: float) -> Tensor:
        return _uniform((b, 1, 1, 1), generator, dev, max(0.0, 1 - strength), 1 + strength)

    x = (images * factor(brightness)).clamp(0, 1)
    gray = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)
    x = (gray.mean(dim=(2, 3), keepdim=True) + factor(contrast) * (x - gray.mean(dim=(2, 3), keepdim=True))).clamp(0, 1)
    gray = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)
    return (gray + factor(saturation) * (x - gray)).clamp(0, 1)


def one_hot_targets(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """Soft targets (B, K): 1 - smoothing + smoothing / K on the label, smoothing / K elsewhere (timm)."""
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return targets.scatter_(1, labels[:, None], 1.0 - smoothing + off)


def cutmix_box(lam: Tensor, cy: Tensor, cx: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    """timm's batch-mode box for ``lam`` centred at (cy, cx), as a (H, W) bool mask, and lambda corrected to
    the box's true area (float64): cut sides ``int(side * sqrt(1 - lam))``, half-sides floored, clipped to
    the image. All tensors on the device; nothing is read back to the host."""
    ratio = torch.sqrt(1 - lam)
    half_h, half_w = torch.floor(height * ratio) // 2, torch.floor(width * ratio) // 2
    y0, y1 = (cy - half_h).clamp(min=0), (cy + half_h).clamp(max=height)
    x0, x1 = (cx - half_w).clamp(min=0), (cx + half_w).clamp(max=width)
    rows = torch.arange(height, device=lam.device)
    cols = torch.arange(width, device=lam.device)
    box = ((rows >= y0) & (rows < y1))[:, None] & ((cols >= x0) & (cols < x1))[None, :]
    return box, 1.0 - (y1 - y0) * (x1 - x0) / float(height * width)


def cutmix(images: Tensor, targets: Tensor, generator: torch.Generator, alpha: float = 1.0
           ) -> tuple[Tensor, Tensor, Tensor]:
    """timm's batch-mode CutMix: one lambda ~ Beta(alpha, alpha) and one box per batch, each image paired
    with the batch reversed; lambda is corrected to the box's true area. Returns images, targets and lambda
    (a float64 tensor); every choice stays on the device."""
    h, w = images.shape[-2:]
    lam = _beta(alpha, generator)
    cy = torch.randint(0, h, (), generator=generator, device=generator.device)
    cx = torch.randint(0, w, (), generator=generator, device=generator.device)
    box, lam = cutmix_box(lam, cy, cx, h, w)
    mixed = torch.where(box, images.flip(0), images)
    return mixed, lam.float() * targets + (1 - lam).float() * targets.flip(0), lam


def mixup(images: Tensor, targets: Tensor, generator: torch.Generator, alpha: float = 0.8
          ) -> tuple[Tensor, Tensor, Tensor]:
    """timm's batch-mode Mixup: x = lam x + (1 - lam) x.flip(0), with lam ~ Beta(alpha, alpha) (a float64
    tensor on the device)."""
    lam = _beta(alpha, generator)
    keep, other = lam.float(), (1 - lam).float()
    return keep * images + other * images.flip(0), keep * targets + other * targets.flip(0), lam


def _beta(alpha: float, generator: torch.Generator) -> Tensor:
    """One Beta(alpha, alpha) sample (float64, on the generator's device) drawn with ``generator``, as the
    ratio of two Gamma(alpha) samples; 1 when ``alpha`` <= 0."""
    if alpha <= 0:
        return torch.ones((), dtype=torch.float64, device=generator.device)
    gammas = torch._standard_gamma(torch.full((2,), float(alpha), dtype=torch.float64, device=generator.device),
                                   generator=generator)
    return gammas[0] / gammas.sum()


def image_uniforms(seed: int, epoch: int, indices: Tensor, count: int) -> Tensor:
    """Uniforms in [0, 1), float32 (B, count) on the CPU: row b depends only on (seed, epoch, indices[b]).

    Per-image randomness keyed this way gives an image the same augmentation whatever rank, batch or step
    it lands in, so runs on 1 and N processes with the same global batch see the same views."""
    rows = [np.random.default_rng([seed, epoch, int(i)]).random(count, dtype=np.float32)
            for i in indices.tolist()]
    return torch.from_numpy(np.stack(rows)) if rows else torch.zeros(0, count)
