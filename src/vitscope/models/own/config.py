"""The configuration of a vitscope VisionTransformer, validated at construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vitscope.attention import parse_normalizer


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines a VisionTransformer's architecture.

    Sizes are in pixels (``img_size``, ``patch_size``) and channels (``embed_dim``). Registers follow the
    DINOv2 convention: inserted after CLS, with no positional embedding.
    """

    img_size: int = 32
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 100
    depth: int = 8
    embed_dim: int = 192
    num_heads: int = 8
    mlp_ratio: float = 2.0
    qkv_bias: bool = True
    class_token: bool = True
    num_registers: int = 0
    pos_embed: str = "learn"  # "learn" or "sincos"
    pool: str = "cls"  # "cls" or "gap"
    attention: str = "softmax"  # softmax | sparsemax | entmax15 | entmax:ALPHA | entmax:learned[:ALPHA]
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    cls_specialization: bool = False  # CLS/patch Specialization (vitscope.models.own.specialization)

    def __post_init__(self) -> None:
        for name in ("img_size", "patch_size", "in_chans", "depth", "embed_dim", "num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.num_classes < 0 or self.num_registers < 0:
            raise ValueError(
                f"num_classes={self.num_classes} and num_registers={self.num_registers} must be >= 0"
            )
        if self.img_size % self.patch_size:
            raise ValueError(
                f"image size {self.img_size} is not divisible by patch size {self.patch_size}; "
                f"use an image size that is a multiple of {self.patch_size}"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}; "
                "choose a head count that divides the width"
            )
        if self.pos_embed not in ("learn", "sincos"):
            raise ValueError(f"pos_embed={self.pos_embed!r} is unknown; use 'learn' or 'sincos'")
        if self.pool not in ("cls", "gap"):
            raise ValueError(f"pool={self.pool!r} is unknown; use 'cls' or 'gap'")
        if self.pool == "cls" and not self.class_token:
            raise ValueError("pool='cls' needs class_token=True; set pool='gap' for a model without CLS")
        if self.cls_specialization and not self.class_token:
            raise ValueError("cls_specialization=True gives the CLS token its own parameters and needs "
                             "class_token=True")
        parse_normalizer(self.attention)  # raises a ValueError naming the valid choices
        for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1)")

    @property
    def grid_size(self) -> tuple[int, int]:
        side = self.img_size // self.patch_size
        return side, side

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + self.num_registers

    def replace(self, **overrides: Any) -> ViTConfig:
        """A copy with some fields changed; unknown names raise a ValueError listing the valid ones."""
        check_keys(overrides)
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ViTConfig:
        check_keys(values)
        return cls(**values)


def check_keys(values: dict[str, Any]) -> None:
    valid = {f.name for f in dataclasses.fields(ViTConfig)}
    unknown = sorted(set(values) - valid)
    if unknown:
        raise ValueError(f"unknown model option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(valid))}")
