"""Planted outliers: a documented forward hook that makes a plain ViT grow known high-norm tokens.

Artifacts (high-norm tokens) need scale and long training to appear; to show and test the detector and the
token probes on a small model, ``plant_outliers`` imitates what Darcet et al. (arXiv 2309.16588) describe:

* *where*: in every image, the ``count`` patches with the lowest local pixel variance (the most redundant,
  background-like patches; ties broken by patch order), chosen from the model's input images;
* *what*: after block ``layer`` (0-based), each chosen patch token is replaced by the image's mean patch
  token, rescaled to ``scale`` times the image's median patch-token norm. The token then carries a global
  summary of the image and no longer its position or pixels, with a norm far above every other patch;
  later blocks carry it on through the residual stream.

Token layer ``layer + 1`` (numbered as in files and reports) is therefore the first layer where they appear.

    with plant_outliers(model, layer=1, count=2, scale=20.0) as planted:
        model(images)
    planted.positions   # (images, count) patch indices, row-major, of every forward pass seen
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitscope.metrics.high_norm import patch_statistics


class PlantedOutliers:
    """The hooks of ``plant_outliers``; ``remove()`` (or leaving the ``with`` block) restores the model."""

    def __init__(self, model: nn.Module, layer: int, count: int, scale: float):
        blocks = getattr(model, "blocks", None)
        if blocks is None or not hasattr(model, "num_prefix_tokens"):
            raise ValueError(f"planted outliers need a plain ViT with blocks, not {type(model).__name__}")
        if not 0 <= layer < len(blocks):
            raise ValueError(f"layer={layer} is out of range for {len(blocks)} blocks; use 0..{len(blocks) - 1}")
        grid = tuple(getattr(model, "grid_size", None) or model.patch_embed.grid_size)
        if not 1 <= count < grid[0] * grid[1]:
            raise ValueError(f"count={count} must lie in 1..{grid[0] * grid[1] - 1} for a {grid[0]}x{grid[1]} grid")
        if scale <= 1:
            raise ValueError(f"scale={scale} must exceed 1 for the planted tokens to stand out")
        self.model, self.layer, self.count, self.scale = model, layer, count, float(scale)
        self.grid, self.prefix = grid, int(model.num_prefix_tokens)
        self.settings = {"layer": layer, "count": count, "scale": self.scale, "selection": "lowest local variance",
                         "token": "mean patch token rescaled to scale x median patch norm"}
        self._chosen: Tensor | None = None
        self._seen: list[Tensor] = []
        self._handles = [model.register_forward_pre_hook(self._choose),
                         blocks[layer].register_forward_hook(self._plant)]

    @property
    def positions(self) -> Tensor:
        """(images, count) planted patch indices of every forward pass since the hooks were added."""
        return torch.cat(self._seen) if self._seen else torch.empty(0, self.count, dtype=torch.long)

    def _choose(self, _module: nn.Module, args: tuple) -> None:
        images = args[0]
        _, variance = patch_statistics(images.detach(), self.grid)
        # stable ascending sort: lowest variance first, ties by patch index
        self._chosen = variance.sort(dim=1, stable=True).indices[:, : self.count]
        self._seen.append(self._chosen.cpu())

    def _plant(self, _module: nn.Module, _inputs: tuple, output: Tensor) -> Tensor:
        if self._chosen is None:
            raise RuntimeError("planted outliers saw a block run without the model's forward; call model(images)")
        patches = output[:, self.prefix :]
        norms = patches.norm(dim=-1)
        direction = patches.mean(dim=1)
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        token = direction * (self.scale * norms.median(dim=1).values)[:, None]  # (B, D)
        chosen, self._chosen = self._chosen, None  # one forward pass, one choice
        index = (chosen.to(output.device) + self.prefix)[..., None].expand(-1, -1, output.shape[-1])
        return output.scatter(1, index, token[:, None].expand(-1, self.count, -1).to(output.dtype))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> PlantedOutliers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def plant_outliers(model: nn.Module, layer: int, count: int = 2, scale: float = 20.0) -> PlantedOutliers:
    """Plant ``count`` high-norm tokens per image after block ``layer`` (0-based) of a plain ViT (see the
    module docstring); returns the hooks, usable as a context manager."""
    return PlantedOutliers(model, layer, count, scale)
