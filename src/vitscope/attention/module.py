"""Multi-head self-attention with a pluggable normaliser and a recording point.

Parameter names follow timm (``qkv``, ``proj``) so that timm checkpoints load unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.attention.learned import make_normalizer
from vitscope.attention.normalizers import Normalizer

# Called with the module and its attention probabilities (B, heads, T, T), after the normaliser.
AttentionObserver = Callable[[nn.Module, Tensor], None]


class Attention(nn.Module):
    """Self-attention over tokens (B, T, dim) -> (B, T, dim).

    With a softmax normaliser, ``fused=True`` and no observer attached, it runs through
    ``F.scaled_dot_product_attention``; otherwise it takes the manual path, which computes the
    probabilities explicitly, hands them to ``observer`` and gives the same output.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        qkv_bias: bool = True,
        normalizer: str | Normalizer = "softmax",
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by heads={num_heads}; pick a divisor of {dim}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.normalizer = make_normalizer(normalizer, num_heads) if isinstance(normalizer, str) else normalizer
        self.fused = True
        self.observer: AttentionObserver | None = None
        # Called with scaled queries and keys (B, heads, T, head_dim) and the attention mask (or None) while
        # the fused path stays on; used by streaming statistics, which need probabilities but not the manual
        # path's output.
        self.probe: Callable[[Tensor, Tensor, Tensor | None], None] | None = None

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """``attn_mask`` (broadcastable to (B, heads, T, T)) is boolean (True = attend) or additive, as in
        ``scaled_dot_product_attention`` and timm; ``is_causal`` masks keys after each query."""
        if is_causal:
            causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
            attn_mask = causal if attn_mask is None else attn_mask & causal if attn_mask.dtype == torch.bool \
                else attn_mask.masked_fill(~causal, float("-inf"))
        B, T, C = x.shape
        q, k, v = self._qkv(x)
        if self.fused and self.normalizer.is_softmax and self.observer is None:
            drop = self.attn_drop.p if self.training else 0.0
            if self.probe is not None:
                self.probe(q * self.scale, k, attn_mask)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=drop)
        else:
            probs = self.normalizer(masked_logits(q * self.scale, k, attn_mask))
            if self.observer is not None:
                self.observer(self, probs)
            out = self.attn_drop(probs) @ v
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, T, C)))

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

    def attention_probs(self, x: Tensor) -> Tensor:
        """The attention probabilities (B, heads, T, T) for tokens x, without the value product."""
        q, k, _ = self._qkv(x)
        return self.normalizer((q * self.scale) @ k.transpose(-2, -1))


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


__all__ = ["Attention", "AttentionObserver", "use_fused_attention"]
