"""Small models with known attention for the explorer tests (tests/test_explore*.py), and readers of a page's data."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import timm
import torch

from vitscope.explorer.blob import text_bytes
from vitscope.explorer.rows import normalize
from vitscope.models import create, load

PLANTED_PATCH = 19  # row 2, column 3 of vit-micro's 8x8 grid


@torch.no_grad()
def planted_attention_model(patch: int = PLANTED_PATCH, strength: float = 5.0):
    """vit-micro whose every query (CLS and patches), in every layer and head, attends to ``patch``.

    Patch embeddings, CLS and positions are zero except the planted patch's position, so after ``norm1`` every
    token is 0 but that one (v). Queries are a constant u (the qkv bias); keys are W_k x with W_k v = strength u,
    so the planted key's logit is strength * |u_head|^2 * scale = 20 and every other key's is 0 (softmax puts
    1 - 1.3e-7 on it). Attention and MLP outputs are zeroed, so every block sees the same tokens."""
    model = create("vit-micro").eval()
    dim = model.embed_dim
    model.patch_embed.proj.weight.zero_()
    model.patch_embed.proj.bias.zero_()
    model.cls_token.zero_()
    model.pos_embed.zero_()
    e = torch.cat([torch.ones(dim // 2), -torch.ones(dim // 2)])
    model.pos_embed[0, 1 + patch] = 3.0 * e
    v = e  # LayerNorm(3 e) = e: mean 0, unit variance
    u = torch.ones(dim)
    for block in model.blocks:
        qkv = block.attn.qkv
        qkv.weight.zero_()
        qkv.bias.zero_()
        qkv.bias[:dim] = u
        qkv.weight[dim : 2 * dim] = strength * torch.outer(u, v) / v.dot(v)
        block.attn.proj.weight.zero_()
        block.attn.proj.bias.zero_()
        block.mlp.fc2.weight.zero_()
        block.mlp.fc2.bias.zero_()
    return model


@torch.no_grad()
def sharpened(model, factor: float):
    """``model`` with every query and key projection scaled by ``factor`` (peakier maps, so entmax has zeros)."""
    for block in model.blocks:
        qkv = block.attn.qkv
        dim = qkv.in_features
        qkv.weight[: 2 * dim] *= factor
    return model


def qk_case(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """Small models whose every layer the page computes from queries and keys, and their pictures."""
    torch.manual_seed(0)
    if name == "softmax+registers":
        return create("vit-micro", num_registers=2).eval(), pictures(2, 32)
    if name in ("entmax15", "entmax:1.3", "entmax:learned"):  # sharpened, so that rows have exact zeros
        model = sharpened(create("vit-micro", attention=name).eval(), 3.0)
        if name == "entmax:learned":  # one alpha per head, each its own
            for block in model.blocks:
                block.attn.normalizer.alpha_logit.data = torch.tensor([-1.5, -0.3, 0.4, 1.8])
        return model, pictures(2, 32)
    if name == "float32 heads":  # logits of thousands: some head-images keep float32 (float16 would err)
        return sharpened(create("vit-micro").eval(), 100.0), pictures(2, 32)
    if name == "rope+registers":  # DINOv3: rotary embedding on patch q and k, 4 registers
        return load("timm:vit_small_patch16_dinov3", img_size=64, depth=2, embed_dim=64, num_heads=2).eval(), \
            pictures(2, 64)
    raise ValueError(name)


def tiny_swin():
    """A random-init Swin with shifted, padded windows on a 6x6 stage grid (test_registers_hier.py's)."""
    torch.manual_seed(0)
    return timm.create_model("swin_tiny_patch4_window7_224", num_classes=0, img_size=24, patch_size=4, window_size=4,
                             depths=(2, 2), embed_dim=16, num_heads=(2, 2)).eval()


def pictures(count: int, side: int, seed: int = 0) -> torch.Tensor:
    """Random uint8 pictures (count, 3, side, side)."""
    return torch.randint(0, 256, (count, 3, side, side), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.uint8)


def page_payload(html: str) -> tuple[dict, dict[str, bytes]]:
    """The JSON description and the decompressed blobs (by name) embedded in a page's text."""
    meta = json.loads(re.search(r'<script id="vitscope-meta" type="application/json">(.*?)</script>', html,
                                re.S).group(1))
    blobs = {}
    for name in meta["blobs"]:
        text = re.search(f'<script id="vitscope-blob-{name}" type="application/octet-stream">(.*?)</script>', html,
                         re.S).group(1)
        blobs[name] = gzip.decompress(text_bytes(text))
    return meta, blobs


def stored(blobs: dict[str, bytes], ref: dict) -> np.ndarray:
    """One stored array (float16 ones are two byte planes: low bytes, then high bytes)."""
    data = blobs[ref["blob"]]
    if ref["dtype"] == "float16":
        planes = np.frombuffer(data, dtype=np.uint8, count=2 * ref["length"], offset=ref["offset"]).reshape(2, -1)
        return planes.T.copy().view(np.float16).reshape(ref["shape"])
    return np.frombuffer(data, dtype=ref["dtype"], count=ref["length"], offset=ref["offset"]).reshape(ref["shape"])


def stored_rows(blobs: dict[str, bytes], layer: dict, image: int, slot: int) -> torch.Tensor:
    """Every row (queries, keys) of a qk layer's kept head ``slot`` on ``image``, from its stored queries and keys, in
    float64 (the Python twin of the page's rows.js)."""
    qk = layer["qk"]
    part = qk["heads"][slot][image]
    q = torch.from_numpy(stored(blobs, part["q"]).astype(np.float64))
    k = torch.from_numpy(stored(blobs, part["k"]).astype(np.float64))
    spec = {**qk["normalizer"], **({"alpha": qk["normalizer"]["alpha"][slot : slot + 1]}
                                   if "alpha" in qk["normalizer"] else {})}
    return normalize((q @ k.T * qk["scale"])[None], spec)[0]
