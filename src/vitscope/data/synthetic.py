"""Synthetic scenes: textured shapes on cluttered backgrounds, with dense targets.

Each image holds one object whose *shape* is the class label, drawn with a random size, rotation,
position and two-colour texture over a background of colour gradients and distractor strokes. Every
image also has its object box (pixels x0, y0, x1, y1), a segmentation mask (0 = background,
1 + class = object) and a depth map (metres-like units: a receding ground plane, the object nearer).
With ``cue='texture'`` the class is instead a texture (pattern x period) shared by four grey objects of
random outlines, one per quadrant, each with its own grey levels, orientation and phase: what any crop of
the scene keeps, while its other properties differ between crops (the self-supervised demo's data).

Image i of a split depends only on (seed, split, i), so any subset is reproducible on its own.
"""

from __future__ import annotations

import numpy as np
import torch

from vitscope.data.dataset import ImageDataset

SHAPES = ("bar", "ring", "cross", "circle", "triangle", "square", "ell", "half-disc")  # most distinct first
# per-channel statistics of the default training split (4096 images of 32 px), in [0, 1] units
SYNTHETIC_MEAN = (0.50, 0.50, 0.50)
SYNTHETIC_STD = (0.21, 0.21, 0.21)
# cue='texture': class k is a pattern at a period (pixels), coarse and fine of each pattern
TEXTURES = (("stripes", 4.0), ("checker", 4.0), ("dots", 5.0), ("blocks", 4.0),
            ("stripes", 8.0), ("checker", 8.0), ("dots", 9.0), ("blocks", 8.0))
TEXTURE_OUTLINES = ("circle", "square", "half-disc", "triangle")  # filled: most of a crop of one is texture
CUES = ("shape", "texture")
_SPLIT_IDS = {"train": 0, "eval": 1}


def _shape_mask(name: str, u: np.ndarray, v: np.ndarray, r: float) -> np.ndarray:
    """Boolean mask of ``name`` in object-frame coordinates (u, v) for radius r (pixels)."""
    rad = np.hypot(u, v)
    if name == "circle":
        return rad <= r
    if name == "square":
        return np.maximum(abs(u), abs(v)) <= 0.8 * r
    if name == "triangle":
        return (v <= 0.7 * r) & (abs(u) <= 0.6 * (v + 0.9 * r))
    if name == "cross":
        arm = 0.3 * r
        return ((abs(u) <= arm) & (abs(v) <= r)) | ((abs(v) <= arm) & (abs(u) <= r))
    if name == "ring":
        return (rad <= r) & (rad >= 0.55 * r)
    if name == "ell":
        return ((u <= -0.4 * r) & (u >= -r) & (abs(v) <= r)) | ((v >= 0.4 * r) & (v <= r) & (abs(u) <= r))
    if name == "bar":
        return (abs(u) <= r) & (abs(v) <= 0.35 * r)
    if name == "half-disc":
        return (rad <= r) & (v >= -0.1 * r)
    raise ValueError(f"unknown shape {name!r}")


def _texture(rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """A two-colour stripe, checker or noise texture, (H, W, 3) in [0, 1]."""
    c1 = rng.uniform(0.0, 1.0, size=3)
    c2 = np.clip(c1 + rng.uniform(-0.25, 0.25, size=3), 0.0, 1.0)  # a low-contrast pattern inside the shape
    kind = rng.integers(3)
    if kind == 0:
        angle, freq = rng.uniform(0, np.pi), rng.uniform(0.5, 1.5)
        t = np.sin(freq * (xx * np.cos(angle) + yy * np.sin(angle))) > 0
    elif kind == 1:
        cell = rng.integers(2, 5)
        t = ((yy // cell + xx // cell) % 2) == 0
    else:
        t = rng.uniform(size=yy.shape) > 0.5
    return np.where(t[..., None], c1, c2)


def _class_texture(rng: np.random.Generator, label: int, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """The texture that *is* class ``label`` under ``cue='texture'``: TEXTURES[label] (pattern x period), in a
    random dark grey and its light complement at a random phase and orientation, (H, W, 3) in [0, 1]. Grey, not
    colour: a colour pair is a per-image cue that every crop keeps and DINO's colour jitter does not remove, so
    self-distillation matches views by it instead of by the pattern."""
    pattern, period = TEXTURES[label]
    c1 = np.full(3, rng.uniform(0.0, 0.3))
    c2 = 1.0 - c1
    angle = rng.uniform(0, np.pi)
    u = xx * np.cos(angle) + yy * np.sin(angle) + rng.uniform(0, period)
    v = -xx * np.sin(angle) + yy * np.cos(angle) + rng.uniform(0, period)
    if pattern == "stripes":
        t = (u // (period / 2)) % 2 == 0
    elif pattern == "checker":
        t = ((u // (period / 2)) + (v // (period / 2))) % 2 == 0
    elif pattern == "dots":
        t = np.hypot(u % period - period / 2, v % period - period / 2) <= period / 4
    else:  # blocks: random cells of half the period
        cells = rng.uniform(size=(int(xx.shape[0] // (period / 2)) + 4,) * 2) > 0.5
        t = cells[(u // (period / 2)).astype(int) % cells.shape[0], (v // (period / 2)).astype(int) % cells.shape[1]]
    return np.where(t[..., None], c1, c2)


def render_scene(seed: int, split: str, index: int, image_size: int, num_classes: int, cue: str = "shape"
                 ) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
    """One scene: image (3, S, S) uint8, label, box (4,) float32, mask (S, S) uint8, depth (S, S) float32.

    ``cue='shape'``: the object's outline is the class (its texture is random); ``cue='texture'``: four objects
    share the class texture (box, mask and depth cover all four; see ``_texture_objects``)."""
    rng = np.random.default_rng([seed, _SPLIT_IDS[split], index])
    s = image_size
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    # background: a colour gradient, a little noise, and distractor strokes
    a, b = rng.uniform(0.1, 0.9, size=(2, 3))
    dark = bool(rng.integers(2))  # object and background sit on opposite halves of the brightness range
    a, b = (a * 0.45, b * 0.45) if dark else (0.55 + a * 0.45, 0.55 + b * 0.45)
    ramp = (yy / max(s - 1, 1))[..., None]
    image = a * (1 - ramp) + b * ramp + rng.normal(0, 0.04, size=(s, s, 3))
    for _ in range(rng.integers(2, 5)):
        y0, x0 = rng.uniform(0, s, size=2)
        angle, length = rng.uniform(0, np.pi), rng.uniform(0.15, 0.4) * s
        along = (xx - x0) * np.cos(angle) + (yy - y0) * np.sin(angle)
        across = -(xx - x0) * np.sin(angle) + (yy - y0) * np.cos(angle)
        stroke = (abs(across) <= 0.6) & (along >= 0) & (along <= length)
        image[stroke] = rng.uniform(0, 1, size=3)
    label = int(rng.integers(num_classes))
    # depth: ground plane receding towards the top; objects stand nearer, tilted slightly
    depth = 2.0 + 8.0 * (1.0 - yy / max(s - 1, 1))
    if cue == "texture":
        image, depth, inside = _texture_objects(rng, label, image, depth, yy, xx)
        return _scene_arrays(image, label, inside, depth)
    # the object
    r = rng.uniform(0.22, 0.36) * s
    cy, cx = rng.uniform(r, s - r, size=2)
    theta = rng.uniform(0, 2 * np.pi)
    u = (xx - cx) * np.cos(theta) + (yy - cy) * np.sin(theta)
    v = -(xx - cx) * np.sin(theta) + (yy - cy) * np.cos(theta)
    inside = _shape_mask(SHAPES[label], u, v, r)
    texture = _texture(rng, yy, xx)
    texture = 0.55 + 0.45 * texture if dark else 0.45 * texture
    image = np.where(inside[..., None], texture, image)
    obj_depth = rng.uniform(1.0, 0.6 * depth[int(cy), int(cx)] + 0.5)
    depth = np.where(inside, obj_depth + 0.02 * (yy - cy), depth).astype(np.float32)
    return _scene_arrays(image, label, inside, depth)


def _texture_objects(rng: np.random.Generator, label: int, image: np.ndarray, depth: np.ndarray, yy: np.ndarray,
                     xx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``cue='texture'``: one object per quadrant (a filled outline of radius 0.22-0.28 x the image size), each
    in the class texture with its own grey levels, orientation and phase, so that two crops of a scene share the
    class and little else. Returns the image (S, S, 3), depth (S, S) and the objects' union mask (S, S)."""
    s = image.shape[0]
    inside = np.zeros((s, s), dtype=bool)
    for quadrant in range(4):
        row, col = divmod(quadrant, 2)
        r = rng.uniform(0.22, 0.28) * s
        cy, cx = (np.array([row, col]) + 0.5) * s / 2 + rng.uniform(-0.06, 0.06, size=2) * s
        theta = rng.uniform(0, 2 * np.pi)
        u = (xx - cx) * np.cos(theta) + (yy - cy) * np.sin(theta)
        v = -(xx - cx) * np.sin(theta) + (yy - cy) * np.cos(theta)
        part = _shape_mask(TEXTURE_OUTLINES[int(rng.integers(len(TEXTURE_OUTLINES)))], u, v, r) & ~inside
        image = np.where(part[..., None], _class_texture(rng, label, yy, xx), image)
        obj_depth = rng.uniform(1.0, 0.6 * depth[int(cy), int(cx)] + 0.5)
        depth = np.where(part, obj_depth + 0.02 * (yy - cy), depth)
        inside |= part
    return image, depth.astype(np.float32), inside


def _scene_arrays(image: np.ndarray, label: int, inside: np.ndarray, depth: np.ndarray
                  ) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
    """(pixels (3, S, S) uint8, label, box of the object pixels (4,), mask (S, S) uint8, depth) of a scene."""
    ys, xs = np.nonzero(inside)
    box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float32)
    mask = (inside * (label + 1)).astype(np.uint8)
    pixels = (np.clip(image, 0, 1) * 255).round().astype(np.uint8).transpose(2, 0, 1)
    return pixels, label, box, mask, depth.astype(np.float32)


def class_names(num_classes: int, cue: str) -> list[str]:
    """The first ``num_classes`` class names of the scenes with this ``cue``."""
    if cue == "shape":
        return list(SHAPES[:num_classes])
    return [f"{pattern}-{period:g}px" for pattern, period in TEXTURES[:num_classes]]


def synthetic_scenes(split: str = "train", num_images: int | None = None, image_size: int = 32,
                     num_classes: int = 8, seed: int = 0, cue: str = "shape") -> ImageDataset:
    """The synthetic scene dataset (default 4096 train / 1024 eval images of 32 px, 8 classes). ``cue`` says
    what the class is: the object's ``shape`` (default) or its ``texture`` (what every crop of the scene still
    shows; the self-supervised demo uses it)."""
    if cue not in CUES:
        raise ValueError(f"synthetic cue={cue!r} is unknown; use one of {', '.join(CUES)}")
    if split not in _SPLIT_IDS:
        raise ValueError(f"synthetic split {split!r} is unknown; use 'train' or 'eval'")
    if not 1 <= num_classes <= len(SHAPES):
        raise ValueError(f"synthetic scenes have 1..{len(SHAPES)} classes, got num_classes={num_classes}")
    if image_size < 8:
        raise ValueError(f"synthetic image_size={image_size} is too small; use 8 pixels or more")
    count = num_images if num_images is not None else (4096 if split == "train" else 1024)
    scenes = [render_scene(seed, split, i, image_size, num_classes, cue) for i in range(count)]
    images, labels, boxes, masks, depth = (np.stack(parts) for parts in zip(*scenes, strict=True))
    return ImageDataset(
        name="synthetic", split=split, images=torch.from_numpy(images), labels=torch.from_numpy(labels).long(),
        classes=class_names(num_classes, cue), mean=SYNTHETIC_MEAN, std=SYNTHETIC_STD,
        extras={"boxes": torch.from_numpy(boxes), "masks": torch.from_numpy(masks),
                "depth": torch.from_numpy(depth)},
    )
