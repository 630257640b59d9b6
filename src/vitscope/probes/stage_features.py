"""Token features of hierarchical models (timm Swin, PVT-v2), stage by stage, for the token probes.

Token layer l of a hierarchical model is the output of block l, counted from 1 across stages (there is no token
layer 0: the patch embedding has no positions added before block 1 and no prefix tokens). A layer's tokens are
its stage's grid in row-major order, with no CLS and no registers; a token's "patch" is the cell of the input
image it covers: the stage's stride in pixels (input side / grid side). Tokens are read as the block outputs
(hierarchical models have no final norm between stages). Features stay in memory (no disk cache).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from tqdm.auto import tqdm

from vitscope.analyze.inputs import model_batches, model_input
from vitscope.data import ImageDataset
from vitscope.models.capture.sites import token_blocks
from vitscope.probes.features import LayerFeatures
from vitscope.record import record_tokens


def is_hierarchical(model: nn.Module) -> bool:
    """A model whose tokens change grid by stage (no ``num_prefix_tokens``/``blocks`` of a plain ViT)."""
    return not (hasattr(model, "blocks") and hasattr(model, "num_prefix_tokens"))


def stage_of_layers(model: nn.Module) -> dict[int, int]:
    """Token layer (1..L) -> its stage (1-based), from the model's blocks."""
    return {i + 1: int(name.split(".")[1]) + 1 for i, (name, _) in enumerate(token_blocks(model))}


def stage_last_layers(model: nn.Module) -> list[int]:
    """The last token layer of every stage (where the census fixes each stage's threshold)."""
    stages = stage_of_layers(model)
    return [max(layer for layer, s in stages.items() if s == stage) for stage in sorted(set(stages.values()))]


@torch.no_grad()
def extract_stage_features(model: nn.Module, dataset: ImageDataset, layers: list[int], *, batch_size: int = 64,
                           device: torch.device | str = "cpu", img_size: int | None = None, progress: bool = True,
                           **_ignored) -> dict[int, LayerFeatures]:
    """Tokens (N, cells, D) float16 of each token layer in ``layers`` (1..L) for every image of ``dataset``."""
    depth = len(token_blocks(model))
    if any(not 1 <= layer <= depth for layer in layers):
        raise ValueError(f"token layers {layers} of a hierarchical model must lie in 1..{depth} (block outputs; "
                         "there is no layer 0 before the first stage); use e.g. --layers 1,last")
    side = model_input(model, dataset, img_size)[0]
    was_training = model.training
    model.to(device).eval()
    parts: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    bar = tqdm(total=len(dataset), unit="img", desc="stage features", disable=not progress, dynamic_ncols=True)
    try:
        for images, _ in model_batches(model, dataset, batch_size, device, img_size):
            with record_tokens(model, layers=[layer - 1 for layer in layers]) as rec:
                model(images)
            for layer, tokens in zip(layers, rec.tokens, strict=True):
                parts[layer].append(tokens.to("cpu", torch.float16))
            bar.update(len(images))
    finally:
        bar.close()
        model.train(was_training)
    out = {}
    for layer in layers:
        tokens = torch.cat(parts[layer])
        cells = math.isqrt(tokens.shape[1])
        if cells * cells != tokens.shape[1]:
            raise ValueError(f"token layer {layer} has {tokens.shape[1]} tokens, not a square grid; probe square "
                             "inputs")
        out[layer] = LayerFeatures(layer, tokens, 0, 0, (cells, cells), side // cells)
    return out
