"""Multi-head self-attention with a pluggable normaliser and one observation point.

Parameter names follow timm (``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``gate``, ``proj``) and the constructor
takes timm's ``Attention`` arguments, so that timm checkpoints load unchanged and timm builds its ViTs with it
through ``attn_layer=``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.attention.learned import make_normalizer
from vitscope.attention.normalizers import Normalizer


@dataclass
class AttentionEvent:
    """One forward pass of one attention layer, as an observer sees it.

    ``q`` (B, heads, Tq, head_dim) are the queries (after any q-norm), ``k`` (B, heads, Tk, head_dim) the keys,
    ``scale`` the factor on q k^T, ``attn_mask`` None, boolean (True = attend) or additive, broadcastable to
    (B, heads, Tq, Tk). ``probs`` (B, heads, Tq, Tk) are the probabilities: the layer's own when it computed
    them (manual path), else computed once, on first access, from q and k (the fused path keeps running for
    the layer's output, so observing never changes it).
    """

    q: Tensor
    k: Tensor
    scale: float
    attn_mask: Tensor | None
    normalizer: Normalizer
    _probs: Tensor | None = None

    @property
    def scaled_q(self) -> Tensor:
        return self.q * self.scale

    @property
    def probs(self) -> Tensor:
        if self._probs is None:
            with torch.no_grad():
                self._probs = self.normalizer(masked_logits(self.scaled_q.detach(), self.k.detach(), self.attn_mask))
        return self._probs

    @property
    def is_softmax(self) -> bool:
        return bool(self.normalizer.is_softmax)


class AttentionObserver(Protocol):
    """Called once per forward pass of an attention layer with what it saw."""

    def __call__(self, event: AttentionEvent) -> None: ...


class Attention(nn.Module):
    """Self-attention over tokens (B, T, dim) -> (B, T, dim_out).

    With a softmax normaliser and ``fused=True`` it runs through ``F.scaled_dot_product_attention``;
    otherwise it takes the manual path, which computes the probabilities explicitly. Either way an attached
    ``observer`` receives an ``AttentionEvent`` and the output is that of the path taken. ``qk_norm``,
    ``scale_norm`` and ``gated`` are timm's options (per-head q/k normalisation, a norm on the attention
    output before the projection, a sigmoid gate on it).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        normalizer: str | Normalizer = "softmax",
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        dim_out: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by heads={num_heads}; pick a divisor of {dim}")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("qk_norm and scale_norm need norm_layer (e.g. nn.LayerNorm)")
        dd = {"device": device, "dtype": dtype}
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
        self.gate = nn.Linear(dim, dim, bias=qkv_bias, **dd) if gated else None
        self.proj = nn.Linear(dim, dim_out or dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.normalizer = make_normalizer(normalizer, num_heads) if isinstance(normalizer, str) else normalizer
        self.fused = True
        self.observer: AttentionObserver | None = None

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """``attn_mask`` (broadcastable to (B, heads, T, T)) is boolean (True = attend) or additive, as in
        ``scaled_dot_product_attention`` and timm; ``is_causal`` masks keys after each query."""
        if is_causal:
            causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
            attn_mask = causal if attn_mask is None else attn_mask & causal if attn_mask.dtype == torch.bool \
                else attn_mask.masked_fill(~causal, float("-inf"))
        B, T, C = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self._qkv(x)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused and self.normalizer.is_softmax:
            if self.observer is not None:
                self.observer(AttentionEvent(q, k, self.scale, attn_mask, self.normalizer))
            drop = self.attn_drop.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=drop)
        else:
            scaled_q = q * self.scale
            probs = self.normalizer(masked_logits(scaled_q, k, attn_mask))
            if self.observer is not None:
                self.observer(AttentionEvent(q, k, self.scale, attn_mask, self.normalizer, probs))
            out = self.attn_drop(probs) @ v
        out = self.norm(out.transpose(1, 2).reshape(B, T, C))
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, each (B, heads, T, head_dim)."""
        B, T, _ = x.shape
        return self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def set_normalizer(self, normalizer: str | Normalizer) -> None:
        """Swap the normaliser in place (no parameters change, except a learned alpha's, which starts anew)."""
        if isinstance(normalizer, str):
            device = self.qkv.weight.device
            normalizer = make_normalizer(normalizer, self.num_heads).to(device)
        self.normalizer = normalizer


def masked_logits(scaled_q: Tensor, k: Tensor, attn_mask: Tensor | None) -> Tensor:
    """q k^T (B, heads, Tq, Tk) with a boolean (True = attend) or additive mask applied."""
    logits = scaled_q @ k.transpose(-2, -1)
    if attn_mask is None:
        return logits
    return logits.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else logits + attn_mask


def use_fused_attention(model: nn.Module, enabled: bool) -> None:
    """Turn the fused (scaled_dot_product_attention) path on or off in every vitscope Attention."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.fused = enabled


__all__ = ["Attention", "AttentionEvent", "AttentionObserver", "masked_logits", "use_fused_attention"]
