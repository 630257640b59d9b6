"""DINO's multi-crop augmentation, batched on the training device with per-image randomness.

Each image yields 2 global views and ``n_local`` local views (Caron et al. 2021, ``DataAugmentationDINO``):
random resized crop, horizontal flip, colour jitter (0.4, 0.4, 0.2, 0.1 at p 0.8), grayscale (p 0.2),
Gaussian blur (p 1.0 / 0.1 / 0.5 for global 1 / global 2 / local) and solarisation (p 0.2, second global view
only), then normalisation. Every random number of an image comes from ``image_uniforms(seed, epoch, index)``,
so an image gets the same views whichever rank or batch it lands in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torchvision.ops import roi_align

from vitscope.data.augment import image_uniforms
from vitscope.data.dataset import normalize

DRAWS_PER_VIEW = 16  # uniforms reserved per view and image; views read disjoint columns


@dataclass(frozen=True)
class MultiCropSpec:
    """Sizes in pixels, scales as fractions of the image area, blur sigma range in output pixels."""

    global_size: int = 224
    local_size: int = 96
    n_local: int = 8
    global_scale: tuple[float, float] = (0.4, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.4)
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.1)  # brightness, contrast, saturation, hue
    jitter_p: float = 0.8
    grayscale_p: float = 0.2
    blur_p: tuple[float, float, float] = (1.0, 0.1, 0.5)  # global 1, global 2, local
    solarize_p: float = 0.2  # second global view

    def __post_init__(self) -> None:
        for name in ("global_scale", "local_scale", "blur_sigma"):
            low, high = getattr(self, name)
            if not 0 < low <= high or (name != "blur_sigma" and high > 1):
                raise ValueError(f"{name}={(low, high)} must be (low, high) with 0 < low <= high"
                                 + (" <= 1" if name != "blur_sigma" else ""))
        if self.global_size < 1 or self.local_size < 1 or self.n_local < 0:
            raise ValueError(f"global_size={self.global_size} and local_size={self.local_size} must be >= 1 "
                             f"and n_local={self.n_local} >= 0")

    @property
    def num_views(self) -> int:
        return 2 + self.n_local


def resized_crop_boxes(u: Tensor, height: int, width: int, scale: tuple[float, float],
                       ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> Tensor:
    """Boxes (B, 4) x0, y0, x1, y1 in pixels from uniforms ``u`` (B, 4): area fraction uniform in ``scale``,
    aspect ratio log-uniform in ``ratio`` (torchvision's RandomResizedCrop, one draw clipped to the image
    instead of ten tries), position uniform."""
    area = height * width * (scale[0] + (scale[1] - scale[0]) * u[:, 0])
    log_ratio = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[:, 1]
    aspect = torch.exp(log_ratio)
    w = torch.sqrt(area * aspect).clamp(1, width)
    h = torch.sqrt(area / aspect).clamp(1, height)
    x0 = (width - w) * u[:, 2]
    y0 = (height - h) * u[:, 3]
    return torch.stack([x0, y0, x0 + w, y0 + h], dim=1)


def crop_and_resize(images: Tensor, boxes: Tensor, size: int, image_index: Tensor | None = None) -> Tensor:
    """Float images (B, C, H, W) cut at ``boxes`` (R, 4) and resized to ``size`` x ``size`` -> (R, C, size, size);
    box r cuts image ``image_index[r]`` (default: image r, R = B). Bilinear with area averaging when shrinking
    (``roi_align`` with adaptive sampling; each box is computed on its own, so grouping boxes changes nothing)."""
    if image_index is None:
        image_index = torch.arange(len(images), device=images.device)
    rois = torch.cat([image_index.to(images.device, images.dtype)[:, None], boxes.to(images.dtype)], dim=1)
    return roi_align(images, rois, output_size=(size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)


def _gray(x: Tensor) -> Tensor:
    return (0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)  # torchvision's weights


def _blend(a: Tensor, b: Tensor, factor: Tensor) -> Tensor:
    return (factor * a + (1 - factor) * b).clamp(0, 1)


def color_jitter(x: Tensor, u: Tensor, strength: tuple[float, float, float, float]) -> Tensor:
    """torchvision's ColorJitter per image on [0, 1] floats, in the order brightness, contrast, saturation,
    hue; ``u`` (B, 4) uniforms give each image its factors."""
    b, c, s, h = strength
    view = (-1, 1, 1, 1)
    x = _blend(x, torch.zeros_like(x), (1 - b + 2 * b * u[:, 0]).view(view))
    x = _blend(x, _gray(x).mean(dim=(1, 2, 3), keepdim=True), (1 - c + 2 * c * u[:, 1]).view(view))
    x = _blend(x, _gray(x), (1 - s + 2 * s * u[:, 2]).view(view))
    if h > 0:
        x = shift_hue(x, -h + 2 * h * u[:, 3])
    return x


def shift_hue(x: Tensor, shift: Tensor) -> Tensor:
    """Rotate the HSV hue of [0, 1] images (B, 3, H, W) by ``shift`` (B,) turns, keeping saturation and value
    (torchvision's ``adjust_hue``, per image)."""
    r, g, b = x.unbind(1)
    value, _ = x.max(dim=1)
    chroma = value - x.min(dim=1).values
    safe = torch.where(chroma > 0, chroma, torch.ones_like(chroma))
    hue = torch.where(value == r, ((g - b) / safe).remainder(6.0),
                      torch.where(value == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0))
    hue = torch.where(chroma > 0, hue, torch.zeros_like(hue)) + 6.0 * shift.view(-1, 1, 1)
    channels = []
    for n in (5.0, 3.0, 1.0):  # r, g, b: v - c * clamp(min(k, 4 - k), 0, 1) with k = (n + 6 h) mod 6
        k = (n + hue).remainder(6.0)
        channels.append(value - chroma * torch.minimum(k, 4.0 - k).clamp(0.0, 1.0))
    return torch.stack(channels, dim=1)


def gaussian_blur(x: Tensor, sigma: Tensor) -> Tensor:
    """Separable Gaussian blur with a per-image ``sigma`` (B,) in pixels (reflect padding)."""
    radius = max(1, math.ceil(3 * float(sigma.max())))
    radius = min(radius, (min(x.shape[-2:]) - 1))
    offsets = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (offsets[None] / sigma[:, None].to(x.dtype)) ** 2)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # (B, K)
    b, c, hgt, wid = x.shape
    weights = kernel.repeat_interleave(c, dim=0)  # (B * C, K)
    flat = x.reshape(1, b * c, hgt, wid)
    flat = torch.nn.functional.pad(flat, (radius, radius, 0, 0), mode="reflect")
    flat = torch.nn.functional.conv2d(flat, weights[:, None, None, :], groups=b * c)
    flat = torch.nn.functional.pad(flat, (0, 0, radius, radius), mode="reflect")
    flat = torch.nn.functional.conv2d(flat, weights[:, None, :, None], groups=b * c)
    return flat.reshape(b, c, hgt, wid)


def _apply_where(mask: Tensor, fn, x: Tensor, *args: Tensor) -> Tensor:
    """``fn`` applied to the images where ``mask`` (B,) holds, the others kept (computed on that subset only)."""
    chosen = mask.nonzero().flatten()
    if len(chosen) == 0:
        return x
    out = x.clone()
    out[chosen] = fn(x[chosen], *(a[chosen] for a in args))
    return out


def augment_view(x: Tensor, u: Tensor, spec: MultiCropSpec, view: int) -> Tensor:
    """Flip, jitter, grayscale, blur and solarise crops ``x`` (B, C, S, S) in [0, 1] with uniforms (B, >= 14):
    columns 4 flip, 5-9 jitter, 10 grayscale, 11-12 blur, 13 solarisation (0-3 went to the crop box)."""
    x = torch.where((u[:, 4] < 0.5).view(-1, 1, 1, 1), x.flip(-1), x)
    x = _apply_where(u[:, 5] < spec.jitter_p, lambda im, v: color_jitter(im, v, spec.jitter), x, u[:, 6:10])
    x = _apply_where(u[:, 10] < spec.grayscale_p, lambda im: _gray(im).expand_as(im), x)
    blur_p = spec.blur_p[min(view, 2)]
    if blur_p > 0:
        sigma = spec.blur_sigma[0] + (spec.blur_sigma[1] - spec.blur_sigma[0]) * u[:, 12]
        x = _apply_where(u[:, 11] < blur_p, gaussian_blur, x, sigma)
    if view == 1 and spec.solarize_p > 0:
        x = _apply_where(u[:, 13] < spec.solarize_p, lambda im: torch.where(im >= 0.5, 1 - im, im), x)
    return x


def cut_views(images: Tensor, u: Tensor, spec: MultiCropSpec) -> list[Tensor]:
    """The geometric part of multi-crop: [0, 1] float images (B, C, H, W) and their uniforms (B, >= num_views *
    16) -> ``spec.num_views`` crops in [0, 1]: two (B, C, G, G) global ones, then the (B, C, L, L) local ones.
    Views of one size are cut in one ``roi_align`` call."""
    height, width = images.shape[-2:]
    batch = len(images)
    crops: list[Tensor] = []
    groups = ((range(2), spec.global_scale, spec.global_size), (range(2, spec.num_views), spec.local_scale,
                                                                 spec.local_size))
    for views, scale, size in groups:
        if len(views) == 0:
            continue
        boxes = torch.cat([resized_crop_boxes(u[:, v * DRAWS_PER_VIEW : v * DRAWS_PER_VIEW + 4], height, width, scale)
                           for v in views])
        index = torch.arange(batch, device=images.device).repeat(len(views))
        crops += crop_and_resize(images, boxes, size, index).clamp(0, 1).split(batch)
    return crops


def photometric_views(crops: list[Tensor], u: Tensor, spec: MultiCropSpec, mean: tuple[float, ...],
                      std: tuple[float, ...]) -> list[Tensor]:
    """The per-view flip, colour and blur augmentations and normalisation of ``cut_views``' crops (in [0, 1])
    with the same uniforms ``u`` -> normalised float views."""
    return [normalize(augment_view(crops[view], u[:, view * DRAWS_PER_VIEW : (view + 1) * DRAWS_PER_VIEW], spec,
                                   view), mean, std) for view in range(spec.num_views)]


def view_uniforms(seed: int, epoch: int, indices: Tensor, spec: MultiCropSpec) -> Tensor:
    """Every random number of the views of images ``indices`` (B,): (B, num_views * 16) on the CPU."""
    return image_uniforms(seed, epoch, indices, spec.num_views * DRAWS_PER_VIEW)


def multicrop(images: Tensor, indices: Tensor, seed: int, epoch: int, spec: MultiCropSpec,
              mean: tuple[float, ...], std: tuple[float, ...]) -> list[Tensor]:
    """uint8 images (B, C, H, W) and their training-set ``indices`` (B,) -> ``spec.num_views`` normalised float
    views: two (B, C, G, G) global views, then the (B, C, L, L) local ones."""
    if images.dtype != torch.uint8:
        raise ValueError(f"multicrop takes uint8 images, got {images.dtype}")
    u = view_uniforms(seed, epoch, indices, spec).to(images.device)
    return photometric_views(cut_views(images.float() / 255.0, u, spec), u, spec, mean, std)
