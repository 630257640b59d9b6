"""Attention geometry of hierarchical timm models: Swin window attention and PVT-v2 reduced keys.

Swin: window-local token indices are mapped to global grid coordinates with the cyclic shift undone;
padded tokens are dropped (padded query rows removed, padded keys zeroed). Canonical maps are
(B, heads, windows x window_area, window_area): every real token's row over its window's keys;
distances are in the stage's own patch units (``patch_size`` is the stage stride in pixels).

PVT-v2: queries on the stage's full grid, keys on the reduced grid (strided convolution, or the 7x7
pool of the linear variant); distances between query centres and key-cell centres are in pixels, so
``patch_size`` is 1 and the 'patch' and 'pixel' units both read pixels.

Capture (``attach``): queries and keys are read at the outputs of the layer's own projections (Swin's ``qkv``,
PVT's ``q`` and ``kv``) and its forward arguments (Swin's shift mask, PVT's feature size) at its input; nothing
of the module changes, so whichever path it takes (``fused_attn``) its output is bit-identical with and
without recording. The probabilities are recomputed on demand with the operations of timm's manual path
(scaled q k^T, Swin's relative-position bias and shift mask, softmax).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from vitscope.metrics import SoftmaxInputs
from vitscope.models.capture.delivery import hooks_removed
from vitscope.models.capture.layout import TokenLayout

# hands over a layer's raw probabilities (computed when called) and, where its canonical form is the raw one,
# its softmax inputs
Deliver = Callable[[Callable[[], Tensor], SoftmaxInputs | None], None]


def _centres(starts: Tensor, ends: Tensor) -> Tensor:
    return (starts + ends).to(torch.float32) / 2


def _require(module: nn.Module | None, names: tuple[str, ...], family: str) -> nn.Module:
    """``module``, checked to have what its capture reads (a timm version that renamed them is refused clearly)."""
    missing = [name for name in names if not hasattr(module, name)]
    if module is None or missing:
        raise ValueError(f"cannot record this {family} attention ({type(module).__name__}): it lacks "
                         f"{', '.join(missing) or 'a module'}; vitscope reads timm's {family} attention as of timm "
                         "1.0 (projections and scale as there)")
    return module


class SwinWindows:
    """Canonical form and layout of one Swin block's window attention (``module``: its ``WindowAttention``)."""

    def __init__(self, resolution: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], stride: int,
                 module: nn.Module | None = None):
        self.module = module
        (h, w), (wh, ww), (sh, sw) = resolution, window, shift
        hp, wp = math.ceil(h / wh) * wh, math.ceil(w / ww) * ww
        self.num_windows, self.area = (hp // wh) * (wp // ww), wh * ww
        win_r, win_c, loc_r, loc_c = torch.meshgrid(torch.arange(hp // wh), torch.arange(wp // ww), torch.arange(wh),
                                                    torch.arange(ww), indexing="ij")
        rows, cols = (win_r * wh + loc_r).reshape(-1), (win_c * ww + loc_c).reshape(-1)  # shifted, padded frame
        valid = (rows < h) & (cols < w)
        coords = torch.stack([(rows + sh) % h, (cols + sw) % w], dim=1).float().view(self.num_windows, self.area, 2)
        dist = torch.cdist(coords, coords).reshape(-1, self.area)  # (windows x area, area)
        self.query_index = valid.nonzero().squeeze(1)
        key_valid = valid.view(self.num_windows, 1, self.area).expand(-1, self.area, -1).reshape(-1, self.area)
        self.key_valid = None if bool(valid.all()) else key_valid[self.query_index].float()
        self.layout = TokenLayout(0, (h, w), stride, distances=dist[self.query_index])

    def attach(self, deliver: Deliver) -> Callable[[], None]:
        """Deliver every forward pass's probabilities (raw: (windows x B, heads, area, area)) until detached."""
        module = _require(self.module, ("qkv", "scale", "num_heads", "softmax", "_get_rel_pos_bias"), "Swin")
        seen: dict[str, Tensor | None] = {}

        def inputs(_m, args, kwargs) -> None:
            seen["mask"] = kwargs.get("mask", args[1] if len(args) > 1 else None)

        def projections(_m, _inputs, qkv: Tensor) -> None:
            b, n, _ = qkv.shape
            seen["q"], seen["k"], _ = qkv.reshape(b, n, 3, module.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)

        def outputs(_m, _inputs, _out) -> None:
            q, k, mask = seen.pop("q"), seen.pop("k"), seen.pop("mask")
            deliver(lambda: swin_probabilities(module, q, k, mask), None)

        return hooks_removed([module.register_forward_pre_hook(inputs, with_kwargs=True),
                               module.qkv.register_forward_hook(projections), module.register_forward_hook(outputs)])

    def __call__(self, probs: Tensor) -> tuple[Tensor, TokenLayout]:
        windows, heads = self.num_windows, probs.shape[1]
        batch = probs.shape[0] // windows
        canon = probs.view(batch, windows, heads, self.area, self.area).permute(0, 2, 1, 3, 4)
        canon = canon.reshape(batch, heads, windows * self.area, self.area)
        if self.key_valid is not None:
            canon = canon[:, :, self.query_index.to(probs.device)] * self.key_valid.to(probs.device)
        return canon, self.layout


class PvtReducedKeys:
    """Canonical form and layout of one PVT-v2 attention; the feature size is read at each forward."""

    def __init__(self, module: nn.Module, stride: int):
        self.module, self.stride = module, stride
        self.feat_size: tuple[int, int] | None = None
        self._cache: dict[tuple[int, int], TokenLayout] = {}

    def attach(self, deliver: Deliver) -> Callable[[], None]:
        """Deliver every forward pass's probabilities (B, heads, Nq, Nk) and softmax inputs until detached."""
        module = _require(self.module, ("q", "kv", "scale", "num_heads", "head_dim"), "PVT-v2")
        seen: dict[str, Tensor] = {}

        def inputs(_m, args, kwargs) -> None:
            self.feat_size = tuple(kwargs["feat_size"] if "feat_size" in kwargs else args[1])

        def queries(_m, _inputs, q: Tensor) -> None:
            b, n, _ = q.shape
            seen["q"] = q.reshape(b, n, module.num_heads, -1).permute(0, 2, 1, 3)

        def keys(_m, _inputs, kv: Tensor) -> None:
            seen["k"] = kv.reshape(kv.shape[0], -1, 2, module.num_heads, module.head_dim).permute(2, 0, 3, 1, 4)[0]

        def outputs(_m, _inputs, _out) -> None:
            inputs_ = SoftmaxInputs(seen.pop("q"), seen.pop("k"), module.scale)
            deliver(lambda: pvt_probabilities(inputs_), inputs_)

        return hooks_removed([module.register_forward_pre_hook(inputs, with_kwargs=True),
                               module.q.register_forward_hook(queries), module.kv.register_forward_hook(keys),
                               module.register_forward_hook(outputs)])

    @property
    def layout(self) -> TokenLayout:
        """The layout of the latest forward pass."""
        if self.feat_size is None:
            raise RuntimeError("PVT attention ran without its feature size; record through vitscope.record_attention")
        return self._layout(*self.feat_size)

    def _layout(self, h: int, w: int) -> TokenLayout:
        if (h, w) not in self._cache:
            s = self.stride
            q = torch.stack(torch.meshgrid((torch.arange(h) + 0.5) * s, (torch.arange(w) + 0.5) * s, indexing="ij"),
                            dim=-1).reshape(-1, 2)
            if getattr(self.module, "pool", None) is not None:  # linear variant: adaptive 7x7 average pool
                cells = self.module.pool.output_size
                cells = (cells, cells) if isinstance(cells, int) else cells
                axes = [_centres(torch.tensor([math.floor(j * n / c) for j in range(c)]),
                                 torch.tensor([math.ceil((j + 1) * n / c) for j in range(c)]))
                        for n, c in zip((h, w), cells, strict=True)]
            elif getattr(self.module, "sr", None) is not None:
                r = self.module.sr.stride[0]
                axes = [(torch.arange(n // r) * r + r / 2).float() for n in (h, w)]
            else:
                axes = [torch.arange(n) + 0.5 for n in (h, w)]
            k = torch.stack(torch.meshgrid(axes[0] * s, axes[1] * s, indexing="ij"), dim=-1).reshape(-1, 2)
            self._cache[(h, w)] = TokenLayout(0, (h, w), 1, distances=torch.cdist(q.float(), k.float()))
        return self._cache[(h, w)]

    def __call__(self, probs: Tensor) -> tuple[Tensor, TokenLayout]:
        return probs, self.layout


def swin_probabilities(module: nn.Module, q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
    """A Swin ``WindowAttention``'s probabilities (windows x B, heads, area, area) from its q and k, as timm's
    manual path computes them: scaled q k^T, plus the relative-position bias, plus the shift mask, softmax."""
    with torch.no_grad():
        attn = (q * module.scale) @ k.transpose(-2, -1)
        attn = attn + module._get_rel_pos_bias()
        if mask is not None:
            n, num_win = attn.shape[-1], mask.shape[0]
            attn = attn.view(-1, num_win, module.num_heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, module.num_heads, n, n)
        return module.softmax(attn)


def pvt_probabilities(inputs: SoftmaxInputs) -> Tensor:
    """A PVT-v2 attention's probabilities (B, heads, Nq, Nk), as timm's manual path computes them."""
    with torch.no_grad():
        return (inputs.scaled_q @ inputs.k.transpose(-2, -1)).softmax(dim=-1)


Geometry = SwinWindows | PvtReducedKeys


def hierarchical_geometry(model: nn.Module) -> list[tuple[str, nn.Module, Geometry]] | None:
    """(module path, attention module, canonical form) of every attention layer of a timm Swin or PVT-v2 model
    in block order, or None for other models."""
    name = type(model).__name__
    found: list[tuple[str, nn.Module, Geometry]] = []
    if name == "SwinTransformer":
        img = model.patch_embed.img_size
        for s, stage in enumerate(model.layers):
            for b, block in enumerate(stage.blocks):
                stride = img[0] // block.input_resolution[0]
                geometry = SwinWindows(tuple(block.input_resolution), tuple(block.window_size),
                                       tuple(block.shift_size), stride, block.attn)
                found.append((f"layers.{s}.blocks.{b}.attn", block.attn, geometry))
        return found
    if name == "PyramidVisionTransformerV2":
        stride = model.patch_embed.proj.stride[0]  # the stem
        for s, stage in enumerate(model.stages):
            stride *= stage.downsample.proj.stride[0] if stage.downsample is not None else 1
            for b, block in enumerate(stage.blocks):
                found.append((f"stages.{s}.blocks.{b}.attn", block.attn, PvtReducedKeys(block.attn, stride)))
        return found
    return None
