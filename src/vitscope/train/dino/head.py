"""DINO's projection head and the multi-crop network that runs a backbone on views of several sizes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm


class DINOHead(nn.Module):
    """MLP (``layers`` linear layers, GELU, hidden ``hidden_dim``, output ``bottleneck_dim``), L2 normalisation,
    then a weight-normalised linear layer to ``out_dim`` without bias whose norm g is fixed to 1 when
    ``norm_last_layer`` (Caron et al. 2021, ``vision_transformer.py`` ``DINOHead``)."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 layers: int = 3, norm_last_layer: bool = True):
        super().__init__()
        if layers < 1:
            raise ValueError(f"head layers={layers} must be >= 1")
        dims = [in_dim] + [hidden_dim] * (layers - 1) + [bottleneck_dim]
        modules: list[nn.Module] = []
        for i in range(layers):
            modules.append(nn.Linear(dims[i], dims[i + 1]))
            if i < layers - 1:
                modules.append(nn.GELU())
        self.mlp = nn.Sequential(*modules)
        for module in self.mlp:
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        self.last_layer = weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        g = self.last_layer.parametrizations.weight.original0
        g.data.fill_(1.0)
        g.requires_grad = not norm_last_layer

    def forward(self, x: Tensor) -> Tensor:
        """Features (N, in_dim) -> logits (N, out_dim)."""
        return self.last_layer(F.normalize(self.mlp(x), dim=-1, p=2))


class MultiCropNetwork(nn.Module):
    """Backbone + head on a list of views: views of one size run through the backbone together, then the head
    runs once on every view's pooled feature (DINO's ``MultiCropWrapper``). Output (sum of view batches, K)."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, views: list[Tensor]) -> Tensor:
        features, start = [], 0
        while start < len(views):
            end = start + 1
            while end < len(views) and views[end].shape[-2:] == views[start].shape[-2:]:
                end += 1
            features.append(self.backbone(torch.cat(views[start:end])))
            start = end
        return self.head(torch.cat(features))
