"""Batched augmentations on the training device, with per-image randomness.

Each function takes a batch (B, C, H, W) and a ``torch.Generator`` on the batch's device, so a run is
reproducible from (seed, step) alone. uint8 stages come first (crop, flip, AutoAugment), float stages
after normalisation (ColorJitter works on [0, 1] floats; CutMix and Mixup on normalised floats).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torchvision.transforms import v2


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


class AutoAugment:
    """AutoAugment with torchvision's policy tables and operations, sampled per image.

    Every image draws its own sub-policy, each operation fires with its own probability, and signed
    operations draw their own sign; images that share an (operation, magnitude) are transformed together.
    ``applied`` keeps the last batch's operations per image, for inspection and tests.
    """

    def __init__(self, policy: str = "cifar10", fill: int = 128):
        policies = {"cifar10": v2.AutoAugmentPolicy.CIFAR10, "imagenet": v2.AutoAugmentPolicy.IMAGENET,
                    "svhn": v2.AutoAugmentPolicy.SVHN}
        if policy not in policies:
            raise ValueError(f"AutoAugment policy {policy!r} is unknown; use one of {', '.join(policies)}")
        self._tv = v2.AutoAugment(policies[policy], fill=fill)
        self.policies = self._tv._policies
        self.applied: list[list[tuple[str, float]]] = []

    def _magnitude(self, name: str, bin_index: int | None, height: int, width: int) -> tuple[float, bool]:
        magnitudes_fn, signed = self._tv._AUGMENTATION_SPACE[name]
        magnitudes = magnitudes_fn(10, height, width)
        value = float(magnitudes[bin_index]) if magnitudes is not None and bin_index is not None else 0.0
        return value, signed

    def __call__(self, images: Tensor, generator: torch.Generator) -> Tensor:
        if images.dtype != torch.uint8:
            raise ValueError("AutoAugment works on uint8 images; apply it before normalisation")
        b, _, h, w = images.shape
        device = images.device
        choice = torch.randint(len(self.policies), (b,), generator=generator, device=device).tolist()
        fire = _uniform((b, 2), generator, device).tolist()
        sign = (_uniform((b, 2), generator, device) < 0.5).tolist()
        groups: dict[tuple[int, str, float], list[int]] = {}
        self.applied = [[] for _ in range(b)]
        for i in range(b):
            for slot, (name, prob, bin_index) in enumerate(self.policies[choice[i]]):
                if fire[i][slot] > prob:
                    continue
                magnitude, signed = self._magnitude(name, bin_index, h, w)
                if signed and sign[i][slot]:
                    magnitude = -magnitude
                groups.setdefault((slot, name, magnitude), []).append(i)
                self.applied[i].append((name, magnitude))
        out = images.clone()
        for slot in (0, 1):  # first operations of every sub-policy, then the second ones
            for (group_slot, name, magnitude), members in groups.items():
                if group_slot != slot:
                    continue
                index = torch.tensor(members, device=device)
                out[index] = self._tv._apply_image_or_video_transform(
                    out[index], name, magnitude, interpolation=self._tv.interpolation, fill=self._tv._fill)
        return out


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


def cutmix(images: Tensor, targets: Tensor, generator: torch.Generator, alpha: float = 1.0
           ) -> tuple[Tensor, Tensor, float]:
    """timm's batch-mode CutMix: one lambda ~ Beta(alpha, alpha) and one box per batch, each image paired
    with the batch reversed; lambda is corrected to the box's true area. Returns images, targets, lambda."""
    lam = _beta(alpha, generator)
    h, w = images.shape[-2:]
    ratio = math.sqrt(1 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    cy = int(torch.randint(0, h, (1,), generator=generator, device=generator.device))
    cx = int(torch.randint(0, w, (1,), generator=generator, device=generator.device))
    y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
    x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
    mixed = images.clone()
    mixed[..., y0:y1, x0:x1] = images.flip(0)[..., y0:y1, x0:x1]
    lam = 1.0 - (y1 - y0) * (x1 - x0) / float(h * w)
    return mixed, lam * targets + (1 - lam) * targets.flip(0), lam


def mixup(images: Tensor, targets: Tensor, generator: torch.Generator, alpha: float = 0.8
          ) -> tuple[Tensor, Tensor, float]:
    """timm's batch-mode Mixup: x = lam x + (1 - lam) x.flip(0), with lam ~ Beta(alpha, alpha)."""
    lam = _beta(alpha, generator)
    return lam * images + (1 - lam) * images.flip(0), lam * targets + (1 - lam) * targets.flip(0), lam


def _beta(alpha: float, generator: torch.Generator) -> float:
    """One Beta(alpha, alpha) sample, drawn by numpy from a seed taken from ``generator`` (as timm does)."""
    if alpha <= 0:
        return 1.0
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return float(np.random.default_rng(seed).beta(alpha, alpha))


def image_uniforms(seed: int, epoch: int, indices: Tensor, count: int) -> Tensor:
    """Uniforms in [0, 1), float32 (B, count) on the CPU: row b depends only on (seed, epoch, indices[b]).

    Per-image randomness keyed this way gives an image the same augmentation whatever rank, batch or step
    it lands in, so runs on 1 and N processes with the same global batch see the same views."""
    rows = [np.random.default_rng([seed, epoch, int(i)]).random(count, dtype=np.float32)
            for i in indices.tolist()]
    return torch.from_numpy(np.stack(rows)) if rows else torch.zeros(0, count)
