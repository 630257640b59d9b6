"""Training protocols: a base (random crop + flip) plus any of three named components.

Components: ``autoaugment`` (AutoAugment, CIFAR-10 policy; ColorJitter stands in on Tiny-ImageNet and the
name stays), ``cutmix`` (timm batch mode, alpha 1) and ``labelsmoothing`` (0.1). Canonical names:
0 or 1 component -> ``baseline`` / ``baseline+<component>``; 2 or 3 -> ``modern-<missing>`` / ``modern``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import torch
import torch.nn.functional as F
from torch import Tensor

from vitscope.data import augment
from vitscope.data.autoaugment import AutoAugment
from vitscope.data.dataset import normalize

COMPONENTS = ("autoaugment", "cutmix", "labelsmoothing")


def protocol_name(components: frozenset[str]) -> str:
    """The canonical name of a set of components."""
    ordered = [c for c in COMPONENTS if c in components]
    if len(ordered) <= 1:
        return "baseline" + "".join(f"+{c}" for c in ordered)
    missing = [c for c in COMPONENTS if c not in components]
    return "modern" + "".join(f"-{c}" for c in missing)


def parse_protocol(name: str) -> frozenset[str]:
    """Components of a protocol name, in any spelling: 'modern-cutmix', 'baseline+cutmix+labelsmoothing'."""
    text = name.strip().lower()
    base, *rest = text.replace("-", " -").replace("+", " +").split()
    if base not in ("baseline", "modern"):
        raise ValueError(f"protocol {name!r} must start with 'baseline' or 'modern'; e.g. baseline+cutmix, "
                         f"modern-autoaugment; valid: {', '.join(ABLATION)}")
    components = set() if base == "baseline" else set(COMPONENTS)
    for token in rest:
        sign, comp = token[0], token[1:]
        if comp not in COMPONENTS:
            raise ValueError(f"protocol {name!r}: unknown component {comp!r}; components are {', '.join(COMPONENTS)}")
        if sign == "+":
            components.add(comp)
        else:
            components.discard(comp)
    return frozenset(components)


def canonical_protocol(name: str) -> str:
    return protocol_name(parse_protocol(name))


ABLATION = tuple(protocol_name(frozenset(c)) for k in range(4) for c in combinations(COMPONENTS, k))


def expand_conditions(spec: str) -> list[str]:
    """'ablation' -> all 8 canonical names; otherwise a comma list resolved to canonical names."""
    if spec.strip() == "ablation":
        return list(ABLATION)
    names = [canonical_protocol(part) for part in spec.split(",") if part.strip()]
    if not names:
        raise ValueError("no conditions given; use e.g. baseline,modern or ablation")
    return list(dict.fromkeys(names))


@dataclass
class Protocol:
    """Turns a uint8 batch into normalised, augmented images and soft targets on its device."""

    name: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    color_jitter_instead: bool = False  # Tiny-ImageNet: ColorJitter stands in for AutoAugment
    crop_padding: int = 4
    smoothing: float = 0.1
    cutmix_alpha: float = 1.0
    mixup_alpha: float = 0.0
    components: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.components = parse_protocol(self.name)
        self.name = protocol_name(self.components)
        self._autoaugment = AutoAugment("cifar10") if "autoaugment" in self.components else None

    def __call__(self, images: Tensor, labels: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """uint8 (B, C, H, W) images and int labels -> float inputs (B, C, H, W) and targets (B, K)."""
        x = augment.random_flip(augment.random_crop(images, self.crop_padding, generator), generator)
        if self._autoaugment is not None and not self.color_jitter_instead:
            x = self._autoaugment(x, generator)
        if "autoaugment" in self.components and self.color_jitter_instead:
            x = augment.color_jitter(x.float() / 255.0, generator)
        x = normalize(x, self.mean, self.std)
        smoothing = self.smoothing if "labelsmoothing" in self.components else 0.0
        targets = augment.one_hot_targets(labels, self.num_classes, smoothing)
        if "cutmix" in self.components:
            x, targets, _ = augment.cutmix(x, targets, generator, self.cutmix_alpha)
        if self.mixup_alpha > 0:
            x, targets, _ = augment.mixup(x, targets, generator, self.mixup_alpha)
        return x, targets


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy against soft targets (B, K) (class probabilities, e.g. smoothed or CutMix-mixed labels),
    computed in float32: ``F.cross_entropy`` with probability targets."""
    return F.cross_entropy(logits.float(), targets.float())
