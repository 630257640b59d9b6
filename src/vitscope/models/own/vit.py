"""A Vision Transformer with pluggable attention normalisers and register tokens.

Parameter names match timm's ``VisionTransformer`` (patch_embed.proj, cls_token, reg_token, pos_embed,
blocks.i.{norm1,attn,norm2,mlp}, norm, head), so weights move between the two; a model with CLS/patch
Specialization (``cls_specialization``) adds ``cls_weight``/``cls_bias`` to its norms and early qkv projections.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.layers import DropPath, Mlp, resample_abs_pos_embed, trunc_normal_
from torch import Tensor, nn

from vitscope.attention import Attention
from vitscope.models.own.config import ViTConfig
from vitscope.models.own.specialization import (
    SpecializedLayerNorm,
    SpecializedLinear,
    copy_shared_to_cls,
    specialized_qkv_blocks,
)


class Block(nn.Module):
    """Pre-norm transformer block on tokens (B, T, D). ``specialized_qkv``: the CLS token has its own qkv
    projection (CLS/patch Specialization, ``cfg.cls_specialization``, which also gives both norms a CLS pair)."""

    def __init__(self, cfg: ViTConfig, drop_path: float, specialized_qkv: bool = False):
        super().__init__()
        dim = cfg.embed_dim
        norm = SpecializedLayerNorm if cfg.cls_specialization else nn.LayerNorm
        self.norm1 = norm(dim, eps=1e-6)
        self.attn = Attention(
            dim,
            cfg.num_heads,
            qkv_bias=cfg.qkv_bias,
            normalizer=cfg.attention,
            attn_drop=cfg.attn_drop_rate,
            proj_drop=cfg.drop_rate,
        )
        if specialized_qkv:
            self.attn.qkv = SpecializedLinear.like(self.attn.qkv)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * cfg.mlp_ratio), act_layer=nn.GELU, drop=cfg.drop_rate)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


def sincos_pos_embed(grid_size: tuple[int, int], dim: int, temperature: float = 10000.0) -> Tensor:
    """Fixed 2-D sine-cosine positional embedding (gh * gw, dim), as in MoCo v3 / MAE."""
    if dim % 4:
        raise ValueError(f"sincos positional embedding needs embed_dim divisible by 4, got {dim}")
    gh, gw = grid_size
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float32), torch.arange(gw, dtype=torch.float32), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    out_x = x.flatten()[:, None] * omega[None]
    out_y = y.flatten()[:, None] * omega[None]
    return torch.cat([out_x.sin(), out_x.cos(), out_y.sin(), out_y.cos()], dim=1)


class VisionTransformer(nn.Module):
    """ViT classifier on images (B, C, H, W).

    Token order: [CLS] [registers...] [patches in row-major grid order]. ``num_prefix_tokens`` counts
    CLS and registers; ``grid_size`` is (rows, cols) of patches; ``patch_size`` is in pixels.
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        dim = cfg.embed_dim
        self.patch_size = cfg.patch_size
        self.grid_size = cfg.grid_size
        self.num_registers = cfg.num_registers
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.num_features = self.embed_dim = dim
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(cfg.in_chans, dim, cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cfg.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.num_registers, dim)) if cfg.num_registers else None
        num_patches = self.grid_size[0] * self.grid_size[1]
        embed_len = num_patches + int(cfg.class_token)
        if cfg.pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, dim))
        else:
            table = torch.cat([torch.zeros(int(cfg.class_token), dim), sincos_pos_embed(self.grid_size, dim)])
            self.register_buffer("pos_embed", table[None], persistent=False)
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        rates = torch.linspace(0, cfg.drop_path_rate, cfg.depth).tolist()
        specialized = specialized_qkv_blocks(cfg.depth) if cfg.cls_specialization else 0
        self.blocks = nn.ModuleList(Block(cfg, rate, i < specialized) for i, rate in enumerate(rates))
        self.norm = (SpecializedLayerNorm if cfg.cls_specialization else nn.LayerNorm)(dim, eps=1e-6)
        self.head = nn.Linear(dim, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        for param in (self.cls_token, self.reg_token):
            if param is not None:
                nn.init.normal_(param, std=1e-6 if param is self.cls_token else 0.02)
        if isinstance(self.pos_embed, nn.Parameter):
            trunc_normal_(self.pos_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        copy_shared_to_cls(self)  # a specialized model starts as its plain twin

    def embed(self, images: Tensor) -> Tensor:
        """Images (B, C, H, W) -> input tokens (B, T, D) with positional embedding and prefix tokens.

        Any H and W that are multiples of the patch size work: a learned positional embedding is resampled to
        the input's grid (bicubic, timm's ``resample_abs_pos_embed``, as ``dynamic_img_size``); a sine-cosine
        one is recomputed. Registers carry no positional embedding at any size."""
        p = self.patch_size
        if images.ndim != 4 or images.shape[1] != self.cfg.in_chans or images.shape[-2] % p or images.shape[-1] % p:
            raise ValueError(
                f"expected images (B, {self.cfg.in_chans}, H, W) with H and W multiples of the patch size {p}, "
                f"got {tuple(images.shape)}; resize or crop the inputs to a multiple of {p} pixels"
            )
        x = self.patch_embed.proj(images)
        grid = (x.shape[-2], x.shape[-1])
        x = x.flatten(2).transpose(1, 2)
        batch = x.shape[0]
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(batch, -1, -1), x], dim=1)
        x = x + self.position_embedding(grid)
        if self.reg_token is not None:
            start = int(self.cls_token is not None)
            x = torch.cat([x[:, :start], self.reg_token.expand(batch, -1, -1), x[:, start:]], dim=1)
        return self.pos_drop(x)

    def position_embedding(self, grid: tuple[int, int]) -> Tensor:
        """The positional embedding (1, [CLS] + gh * gw, D) for a patch grid of (gh, gw)."""
        if tuple(grid) == tuple(self.grid_size):
            return self.pos_embed
        if isinstance(self.pos_embed, nn.Parameter):
            return resample_abs_pos_embed(self.pos_embed, new_size=list(grid), old_size=list(self.grid_size),
                                          num_prefix_tokens=int(self.cls_token is not None))
        table = sincos_pos_embed(grid, self.embed_dim).to(self.pos_embed)
        return torch.cat([self.pos_embed[:, : int(self.cls_token is not None)], table[None]], dim=1)

    def forward_tokens(self, images: Tensor) -> Tensor:
        """All tokens (B, T, D) after the last block, before the final norm."""
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return x

    def forward_features(self, images: Tensor) -> dict[str, Tensor | None]:
        """Named outputs: ``cls`` (B, D) or None, ``registers`` (B, R, D), ``patches`` (B, N, D) after
        the final norm, and ``prenorm`` (B, T, D), every token before it."""
        prenorm = self.forward_tokens(images)
        normed = self.norm(prenorm)
        has_cls = self.cls_token is not None
        return {
            "cls": normed[:, 0] if has_cls else None,
            "registers": normed[:, int(has_cls) : self.num_prefix_tokens],
            "patches": normed[:, self.num_prefix_tokens :],
            "prenorm": prenorm,
        }

    def pool(self, features: dict[str, Tensor | None]) -> Tensor:
        """The pooled image feature (B, D): the CLS token, or the mean patch token for ``pool='gap'``."""
        return features["cls"] if self.cfg.pool == "cls" else features["patches"].mean(dim=1)

    def forward(self, images: Tensor) -> Tensor:
        """Class logits (B, num_classes), or the pooled feature (B, D) when the model has no head."""
        return self.head(self.pool(self.forward_features(images)))

    def forward_intermediates(self, images: Tensor, indices: int | Sequence[int] | None = None,
                              norm: bool = False) -> list[Tensor]:
        """Block outputs (B, T, D) for ``indices``: an int n takes the last n blocks (as timm), a sequence
        names blocks (negative counts from the end), None takes all. ``norm`` applies the final norm."""
        wanted = resolve_block_indices(indices, len(self.blocks))
        outputs, x = [], self.embed(images)
        for i, block in enumerate(self.blocks[: max(wanted) + 1]):
            x = block(x)
            if i in wanted:
                outputs.append(self.norm(x) if norm else x)
        return outputs


def resolve_block_indices(indices: int | Sequence[int] | None, depth: int) -> list[int]:
    """Block indices (0-based, sorted) from timm-style ``indices``; raises ValueError when out of range."""
    if indices is None:
        return list(range(depth))
    if isinstance(indices, int):
        if not 1 <= indices <= depth:
            raise ValueError(f"asked for the last {indices} blocks of a {depth}-block model; use 1..{depth}")
        return list(range(depth - indices, depth))
    resolved = []
    for index in indices:
        if not -depth <= index < depth:
            raise ValueError(f"block index {index} is out of range for depth {depth}; use 0..{depth - 1}")
        resolved.append(index % depth)
    return sorted(set(resolved))
