"""CLS/patch Specialization: the CLS token takes its own parameters in some layers, the other tokens the shared ones.

Seed 001 (the sparse-attention paper) names "CLS/patch Specialization" as one of its baselines without describing
it. The closest published method we found is the layer specialization of Marouani et al., "Revisiting [CLS] and
Patch Token Interaction in Vision Transformers" (arXiv 2602.08626): separate parameters for the CLS token and the
patch tokens in the normalisation layers and in the query-key-value projections of the early blocks, attention
still mixing every token, about 8 % more parameters and no extra compute. Its public abstract does not say which
early blocks (a third-party summary says the first half, 12.5 % more); vitscope takes the first third
(``specialized_qkv_blocks``), which gives the abstract's 8 % on a ViT-S/16 (4 of 12 blocks, +8.3 %). That the seed's
baseline is this method is our reading, not the seed's. So vitscope's variant, stated once here:

- every LayerNorm (both of each block and the final one) has a second affine pair for the CLS token
  (``cls_weight``, ``cls_bias``; the statistics are per token, as in any LayerNorm);
- the qkv projection of the first ``specialized_qkv_blocks(depth)`` blocks has a second weight and bias for the
  CLS token;
- registers, when there are any, take the patch path (the CLS token is token 0);
- the CLS copies start equal to the shared parameters, so a specialized model equals its plain twin at
  initialisation and the two paths part only through training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

QKV_FRACTION = 1 / 3  # the share of blocks, from the first, whose qkv projection is specialized


def specialized_qkv_blocks(depth: int) -> int:
    """How many blocks, from the first, have a specialized qkv projection: a third of ``depth``, at least 1."""
    return max(1, round(depth * QKV_FRACTION))


class SpecializedLayerNorm(nn.LayerNorm):
    """LayerNorm over tokens (B, T, D) whose first token (CLS) uses ``cls_weight`` and ``cls_bias`` and every
    other token the shared ``weight`` and ``bias``."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps=eps)
        self.cls_weight = nn.Parameter(torch.ones(dim))
        self.cls_bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        cls = F.layer_norm(x[:, :1], self.normalized_shape, self.cls_weight, self.cls_bias, self.eps)
        return torch.cat([cls, super().forward(x[:, 1:])], dim=1)

    def copy_shared_to_cls(self) -> None:
        """Set the CLS pair equal to the shared one."""
        with torch.no_grad():
            self.cls_weight.copy_(self.weight)
            self.cls_bias.copy_(self.bias)


class SpecializedLinear(nn.Linear):
    """A linear map over tokens (B, T, in) whose first token (CLS) uses ``cls_weight`` and ``cls_bias`` and every
    other token the shared ``weight`` and ``bias``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.cls_weight = nn.Parameter(torch.empty(out_features, in_features))
        self.cls_bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.copy_shared_to_cls()

    @classmethod
    def like(cls, linear: nn.Linear) -> SpecializedLinear:
        """A specialized twin of ``linear`` with its weights on both paths (drawing no random numbers, so that a
        model built with it draws the same initial weights as its plain twin)."""
        with torch.random.fork_rng(devices=[]):
            twin = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        twin.load_state_dict(linear.state_dict(), strict=False)
        twin.copy_shared_to_cls()
        return twin.to(linear.weight)

    def forward(self, x: Tensor) -> Tensor:
        cls = F.linear(x[:, :1], self.cls_weight, self.cls_bias)
        return torch.cat([cls, super().forward(x[:, 1:])], dim=1)

    def copy_shared_to_cls(self) -> None:
        """Set the CLS weight and bias equal to the shared ones."""
        with torch.no_grad():
            self.cls_weight.copy_(self.weight)
            if self.cls_bias is not None:
                self.cls_bias.copy_(self.bias)


def copy_shared_to_cls(model: nn.Module) -> None:
    """Start every specialized layer of ``model`` with its CLS parameters equal to the shared ones."""
    for module in model.modules():
        if isinstance(module, SpecializedLayerNorm | SpecializedLinear):
            module.copy_shared_to_cls()
