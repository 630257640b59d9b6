"""timm's RoPE families and NaFlexVit: capturing their attention and the token layout each forward pass has.

- ``EvaAttention`` (EVA-02, DINOv3) and ``AttentionRope`` (the RoPE ViTs): queries and keys are read at the outputs
  of ``q_norm`` / ``k_norm`` and the rotary embedding, mask and causal flag at the module's input; the rotation is
  applied to them with timm's own ``apply_rot_embed_cat`` exactly as the module's forward does (prefix tokens
  unrotated, the module's ``rotate_half``; grouped-query keys repeated as there). The module itself is not changed,
  so its fused path stays on and its output is bit-identical with and without recording.
- Models built with ``dynamic_img_size`` (DINOv3, any timm ViT so built) take any input size: the grid of each
  forward pass is read at the output of ``patch_embed`` (``InputGrid``).
- ``NaFlexVit`` (SigLIP2's NaFlex): an input is either an image batch (B, C, H, W), one grid for all, or NaFlex's
  dict of pre-patchified ``patches`` with ``patch_coord`` (B, N, 2) as (row, col) and ``patch_valid`` (B, N). The
  layout of each image comes from its valid patches' coordinates (``NaFlexTokens``); for metrics the batch is split
  into groups of images with equal layouts and padding tokens are removed from queries and keys, so padding enters
  no metric. Maps keep the padded form (B, heads, T, T) that timm's manual path gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.attention import AttentionEvent, Softmax
from vitscope.models.capture.delivery import hooks_removed, plain_capture
from vitscope.models.capture.layout import TokenLayout
from vitscope.models.capture.padded import Group, PaddedLayouts, split_capture


def is_rope_attention(module: nn.Module | None) -> bool:
    """timm's ``EvaAttention`` or ``AttentionRope`` with their own forward (the RoPE families)."""
    from timm.layers.attention import AttentionRope
    from timm.models.eva import EvaAttention

    return any(isinstance(module, cls) and type(module).forward is cls.forward for cls in (EvaAttention, AttentionRope))


def attention_inputs(args: tuple, kwargs: dict, mask_at: int, causal_at: int) -> Tensor | None:
    """The mask an attention forward was called with (``attn_mask`` / ``is_causal`` by keyword or at those
    positions), a causal flag folded in as a boolean lower triangle (True = attend)."""
    mask = kwargs.get("attn_mask", args[mask_at] if len(args) > mask_at else None)
    causal = kwargs.get("is_causal", args[causal_at] if len(args) > causal_at else False)
    if causal:
        n = args[0].shape[1]
        tril = torch.ones(n, n, dtype=torch.bool, device=args[0].device).tril()
        mask = tril  # timm: is_causal takes precedence over attn_mask
    return mask


def attach_rope_attention(module: nn.Module, deliver: Callable[[AttentionEvent], None]) -> Callable[[], None]:
    """Deliver an ``AttentionEvent`` with the rotated q and k of every forward pass of a timm RoPE attention."""
    from timm.layers import apply_rot_embed_cat

    softmax = Softmax()
    seen: dict[str, Any] = {}

    def inputs(_m, args, kwargs) -> None:
        seen["rope"] = kwargs.get("rope", args[1] if len(args) > 1 else None)
        seen["mask"] = attention_inputs(args, kwargs, 2, 3)

    def rotated(x: Tensor, dtype: torch.dtype) -> Tensor:
        rope = seen.get("rope")
        if rope is None:
            return x
        npt, half = module.num_prefix_tokens, getattr(module, "rotate_half", False)
        return torch.cat([x[:, :, :npt, :], apply_rot_embed_cat(x[:, :, npt:, :], rope, half=half)], dim=2).type(dtype)

    def query(_m, args, q: Tensor) -> None:
        seen["q"] = rotated(q, args[0].dtype)  # timm casts the rotated q and k to v's dtype, which is q's input's

    def key(_m, args, k: Tensor) -> None:
        k = rotated(k, args[0].dtype)
        groups = getattr(module, "num_kv_groups", 1)
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
        deliver(AttentionEvent(seen.pop("q"), k, module.scale, seen.get("mask"), softmax))

    handles = [module.register_forward_pre_hook(inputs, with_kwargs=True),
               module.q_norm.register_forward_hook(query), module.k_norm.register_forward_hook(key)]
    return hooks_removed(handles)


class _Watched:
    """A layout source that watches one module of the model while any site of it is recorded (one hook)."""

    def __init__(self, module: nn.Module):
        self.module, self._users, self._handle = module, 0, None

    def _hook(self) -> Any:
        raise NotImplementedError

    def watch(self) -> Callable[[], None]:
        """Start watching (once for all sites); the returned function stops this site's watch."""
        if self._users == 0:
            self._handle = self._hook()
        self._users += 1

        def stop() -> None:
            self._users -= 1
            if self._users == 0 and self._handle is not None:
                self._handle.remove()
                self._handle = None

        return stop


class InputGrid(_Watched):
    """The layout of a model that takes any input size: prefix tokens as ``base``, the grid of the latest forward
    pass read at the output of ``patch_embed`` ((B, H, W, C) with ``dynamic_img_size``, else its fixed grid)."""

    def __init__(self, patch_embed: nn.Module, base: TokenLayout):
        super().__init__(patch_embed)
        self.base, self.grid = base, tuple(base.grid_size)
        self._layouts: dict[tuple[int, int], TokenLayout] = {self.grid: base}

    def _hook(self) -> Any:
        def seen(_m, _inputs, out: Tensor) -> None:
            self.grid = tuple(out.shape[1:3]) if out.ndim == 4 else self.grid

        return self.module.register_forward_hook(seen)

    @property
    def layout(self) -> TokenLayout:
        if self.grid not in self._layouts:
            b = self.base
            self._layouts[self.grid] = TokenLayout(b.num_prefix_tokens, self.grid, b.patch_size, b.num_registers)
        return self._layouts[self.grid]

    def capture(self, event: AttentionEvent):
        return plain_capture(event, self.layout)


class NaFlexTokens(_Watched):
    """The layouts of a ``NaFlexVit`` batch, from the ``patch_coord`` / ``patch_valid`` its ``embeds`` receive.

    The batch's groups (images of one layout, with the token indices of their prefix and valid patches) are worked
    out once per forward pass, when the embedding runs, and used by every attention layer of that pass."""

    def __init__(self, embeds: nn.Module, base: TokenLayout):
        super().__init__(embeds)
        self.base = base
        self.grid = tuple(base.grid_size)
        self.groups: list[Group] | None = None  # None for an image batch
        self._layouts: dict[tuple[int, int], TokenLayout] = {}
        self._padded = PaddedLayouts(base)

    def _hook(self) -> Any:
        def seen(_m, args, kwargs, out) -> None:
            coords = kwargs.get("patch_coord", args[1] if len(args) > 1 else None)
            valid = kwargs.get("patch_valid", args[2] if len(args) > 2 else None)
            if coords is None:
                self.groups = None
                if out[1] is not None:
                    self.grid = tuple(int(s) for s in out[1])
                return
            valid = torch.ones(coords.shape[:2], dtype=torch.bool) if valid is None else valid.detach().bool()
            self.groups = self._padded.group(coords.detach().cpu(), valid.cpu(), coords.device)

        return self.module.register_forward_hook(seen, with_kwargs=True)

    def capture(self, event: AttentionEvent):
        if self.groups is None:  # an image batch: one full grid
            b = self.base
            layout = self._layouts.setdefault(self.grid, TokenLayout(
                b.num_prefix_tokens, self.grid, b.patch_size, b.num_registers))
            return plain_capture(event, layout)
        return split_capture(event, self.groups)


def naflex_layout(model: nn.Module) -> TokenLayout:
    """A NaFlexVit's layout for square images of its default input size (``pretrained_cfg['input_size']``,
    which ``load(..., img_size=)`` sets), what vitscope's pipelines feed it."""
    embeds = model.embeds
    side = (getattr(model, "pretrained_cfg", None) or {}).get("input_size")
    patch = int(embeds.patch_size[0])
    grid = (side[-2] // patch, side[-1] // patch) if side else embeds.pos_embed_grid_size
    if grid is None:
        raise ValueError("this NaFlexVit has no default input size; load it with img_size=")
    return TokenLayout(int(model.num_prefix_tokens), tuple(grid), patch,
                       int(getattr(embeds, "num_reg_tokens", 0) or 0))
