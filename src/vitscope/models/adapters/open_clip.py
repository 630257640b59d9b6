"""OpenCLIP visual towers with vitscope's model contract (an optional extra: ``vitscope[open_clip]``).

``open_clip:ARCH`` builds the visual tower of an OpenCLIP architecture (``open_clip.list_models()``) with random
weights, keyword overrides changing its ``vision_cfg`` (``layers``, ``width``, ``image_size`` ...);
``open_clip:ARCH@FILE`` loads its tensors from a local checkpoint (a full CLIP state dict, whose ``visual.`` keys
are taken, or the tower's own), strictly; ``open_clip:ARCH/TAG`` loads the file OpenCLIP's pretrained registry names
for the tag from the local caches (``vitscope.models.weights.hub``). Nothing is downloaded unless ``download=True``.

Towers built on a timm trunk (the SigLIP configs) are that timm model, which vitscope reads directly. OpenCLIP's own
``VisionTransformer`` (CLS first, then patches; ``ln_post`` its final norm) uses ``nn.MultiheadAttention``: its
input is read by a hook and the queries and keys recomputed from ``in_proj_weight`` / ``in_proj_bias`` exactly as
PyTorch's attention forms them, so the module keeps its fused path and its output.

View. A tower is fed what OpenCLIP's own eval transform makes of an image (``view_cfg``): its preprocess config (the
tag's registry entry over OpenCLIP's defaults), ``resize_mode`` shortest or squash, no further crop.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.attention import AttentionEvent, Softmax
from vitscope.models.capture.layout import TokenLayout

INSTALL = "pip install 'vitscope[open_clip]'"


def _open_clip():
    try:
        import open_clip
    except ImportError:
        raise ImportError(f"open_clip: models need OpenCLIP; install it with {INSTALL}") from None
    return open_clip


def load_open_clip(spec: str, img_size: int | None = None, download: bool = False, **overrides: Any) -> nn.Module:
    """The visual tower of ``open_clip:ARCH[@FILE]`` or ``open_clip:ARCH/TAG`` (``spec`` without the prefix; the
    tag's file from the local caches, ``vitscope.models.weights.hub``, fetched only with ``download``)."""
    open_clip = _open_clip()
    from open_clip.model import _build_vision_tower

    arch, at, file = spec.partition("@")
    if at and not file.strip():
        raise ValueError(f"open_clip:{spec} names no file after '@'; give open_clip:{arch}@FILE (a local checkpoint) "
                         f"or open_clip:{arch} for random weights")
    arch, slash, tag = arch.partition("/")
    if slash and not tag.strip():
        raise ValueError(f"open_clip:{spec} names no tag after '/'; give open_clip:{arch}/TAG (one of "
                         f"open_clip.list_pretrained_tags_by_model('{arch}')) or open_clip:{arch} for random weights")
    config = open_clip.get_model_config(arch)
    if config is None:
        raise ValueError(f"open_clip:{arch} is not an OpenCLIP architecture; see open_clip.list_models()")
    source, notes, tag_cfg = None, "", {}
    if tag:
        from vitscope.models.weights.hub import open_clip_pretrained

        if file:
            raise ValueError(f"open_clip:{spec} names both a tag and a file; drop one")
        source, tag_cfg = open_clip_pretrained(arch, tag, download=download)
        file = str(source.file)
        if bool(tag_cfg.get("quick_gelu", False)) != bool(config.get("quick_gelu", False)):
            notes = (f"; the tag was trained with quick_gelu={bool(tag_cfg.get('quick_gelu'))} but {arch} has "
                     f"quick_gelu={bool(config.get('quick_gelu'))} (as OpenCLIP warns; use the -quickgelu arch)")
    vision_cfg = {**config["vision_cfg"], **overrides}
    if img_size is not None:
        vision_cfg["image_size"] = img_size
    visual = _build_vision_tower(config["embed_dim"], vision_cfg, quick_gelu=config.get("quick_gelu", False))
    origin, matched = "open_clip (random weights)", 0
    if file:
        matched = _load_visual(visual, Path(file).expanduser(), arch, img_size)
        origin = "open_clip"
    trunk = getattr(visual, "trunk", None)
    if trunk is None and not isinstance(getattr(visual, "transformer", None), nn.Module):
        raise ValueError(f"open_clip:{arch}'s tower ({type(visual).__name__}) is not a Vision Transformer (vitscope "
                         "reads ViTs only); pick a ViT architecture such as open_clip:ViT-B-32")
    preprocess = preprocess_cfg(visual, tag_cfg)
    visual.preprocess_cfg = preprocess  # as open_clip.create_model sets it (set_model_preprocess_cfg)
    model = trunk if trunk is not None else OpenCLIPVisionTransformer(visual)
    view, view_note = view_cfg(preprocess)
    own = getattr(model, "pretrained_cfg", None) or {}  # a timm trunk's own view is not the tower's
    model.pretrained_cfg = {**{k: v for k, v in own.items() if k not in ("crop_pct", "crop_mode")}, **view}
    note = "; the tower's timm trunk is used (projection head dropped)" if trunk is not None else ""
    notes += view_note
    model.vitscope_load = {"file": file or None, "origin": origin, "matched": matched, "pos_interp": None,
                           "source": source.to_dict() if source else None}
    cached = f"; {source.note()}" if source else ""
    print(f"vitscope: loaded open_clip:{spec}: origin {origin}, {matched} keys matched{note}{cached}{notes}",
          file=sys.stderr)
    return model.eval()


def preprocess_cfg(visual: nn.Module, tag_cfg: dict[str, Any]) -> dict[str, Any]:
    """OpenCLIP's preprocess for this tower, as ``open_clip.create_model_and_transforms`` builds it: its
    ``PreprocessCfg`` defaults, the pretrained tag's entries (mean, std, interpolation, resize_mode) over them, the
    size the tower was built at."""
    from dataclasses import asdict

    from open_clip.transform import PreprocessCfg, merge_preprocess_dict

    merged = merge_preprocess_dict(asdict(PreprocessCfg()), tag_cfg)
    return {**merged, "size": visual.image_size}


def view_cfg(preprocess: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """OpenCLIP's eval transform (``image_transform_v2``) in the ``pretrained_cfg`` keys vitscope's views read
    (``vitscope.data.pixels.model_view``): ``resize_mode`` shortest (the shorter side to the size, centre crop)
    or squash (both sides to it), never a further crop (``crop_pct`` 1), with its interpolation, mean and std; and
    a note for the load line when it is not reproduced (``longest``: padded)."""
    view = {"mean": tuple(preprocess["mean"]), "std": tuple(preprocess["std"]),
            "interpolation": preprocess["interpolation"]}
    modes = {"shortest": "center", "squash": "squash"}
    mode, size = preprocess.get("resize_mode", "shortest"), preprocess["size"]
    square = not isinstance(size, tuple | list) or len(set(size)) == 1
    if mode not in modes or not square:
        what = f"resize_mode {mode!r} pads the image" if mode not in modes else f"its size {tuple(size)} is not square"
        return view, f"; its preprocess is not reproduced ({what}): images are viewed as by a model that names none"
    return {**view, "crop_pct": 1.0, "crop_mode": modes[mode]}, ""


def _load_visual(visual: nn.Module, file: Path, arch: str, img_size: int | None = None) -> int:
    """Load the tower's tensors from ``file`` strictly; refuses a missing or unexpected key in one line, and a
    position table of another length at ``img_size`` as the size it is (not another architecture)."""
    from vitscope.models.weights.checkpoint import read_state_dict

    state = read_state_dict(file)
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}
    if any(k.startswith("visual.") for k in state):
        state = {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")}
    table, built = state.get("positional_embedding"), getattr(visual, "positional_embedding", None)
    if img_size is not None and table is not None and built is not None and table.shape != built.shape:
        patch = int(visual.patch_size[0])
        side = round((table.shape[0] - 1) ** 0.5) * patch  # CLS + a square grid of patches
        raise ValueError(f"{file}: its position table holds {table.shape[0] - 1} patches ({side} px at patch {patch}) "
                         f"and --img-size {img_size} asks for {built.shape[0] - 1}; open_clip: towers load at their "
                         f"own input size: drop --img-size (or use --img-size {side})")
    try:
        result = visual.load_state_dict(state, strict=False)
    except RuntimeError as err:
        raise ValueError(f"{file}: {str(err).strip().splitlines()[-1].strip()}; use the architecture the file was "
                         f"saved from (not open_clip:{arch})") from None
    for kind, keys in (("missing from the file", result.missing_keys), ("not in the tower", result.unexpected_keys)):
        if keys:
            raise ValueError(f"{file}: the key {keys[0]!r} is {kind} of open_clip:{arch} ({len(keys)} such keys); "
                             "use the architecture the file was saved from")
    return len(state)


class OpenCLIPVisionTransformer(nn.Module):
    """OpenCLIP's ``VisionTransformer`` with vitscope's contract: tokens [CLS] [patches, row-major]; ``prenorm``
    is the last block's output and ``patches`` are after ``ln_post``; ``forward`` gives the projected embedding."""

    def __init__(self, visual: nn.Module):
        super().__init__()
        self.visual = visual
        self.patch_size = int(visual.patch_size[0])
        self.grid_size = tuple(visual.grid_size)
        self.num_prefix_tokens, self.num_registers = 1, 0
        self.embed_dim = self.num_features = int(visual.conv1.out_channels)
        side = visual.image_size[0]
        self.pretrained_cfg = {"input_size": (3, side, side)}  # and the view, set by load_open_clip
        resblocks = list(visual.transformer.resblocks)
        for i, block in enumerate(resblocks):
            if not isinstance(getattr(block, "attn", None), nn.MultiheadAttention):
                raise ValueError(f"cannot record block {i} of this OpenCLIP tower: {type(block).__name__} has no "
                                 "nn.MultiheadAttention (open_clip's custom attention blocks are not read yet)")
        self.__dict__["_blocks"] = resblocks  # registered once, inside self.visual
        self._grid = self.grid_size
        self.__dict__["_layouts"] = {}

    @property
    def blocks(self) -> list[nn.Module]:
        return self._blocks

    @property
    def attention_modules(self) -> list[nn.Module]:
        return [block.attn for block in self._blocks]

    @property
    def norm(self) -> nn.Module:
        return self.visual.ln_post

    def init_weights(self) -> None:
        """Re-initialise as OpenCLIP's constructor does (embeddings and projection ~ N(0, width^-1/2), attention
        with PyTorch's own init; linear layers and norms by their ``reset_parameters``)."""
        scale = self.embed_dim ** -0.5
        with torch.no_grad():
            for name in ("class_embedding", "positional_embedding", "proj"):
                param = getattr(self.visual, name, None)
                if isinstance(param, nn.Parameter):
                    param.normal_(0, scale)
            for module in self.visual.modules():
                if isinstance(module, nn.MultiheadAttention):
                    module._reset_parameters()
                elif hasattr(module, "reset_parameters") and module is not self.visual:
                    module.reset_parameters()

    def input_layout(self) -> TokenLayout:
        if self._grid not in self._layouts:
            self._layouts[self._grid] = TokenLayout(1, tuple(self._grid), self.patch_size)
        return self._layouts[self._grid]

    def attach_attention(self, index: int, deliver: Callable[[AttentionEvent], None]) -> Callable[[], None]:
        """Deliver q and k of block ``index``'s attention, recomputed from its input, at every forward pass."""
        module, softmax = self._blocks[index].attn, Softmax()

        def inputs(_m, args, kwargs) -> None:
            x = args[0] if args else kwargs["query"]
            x = x if module.batch_first else x.transpose(0, 1)
            b, t, d = x.shape
            heads = module.num_heads
            q, k, _ = F.linear(x, module.in_proj_weight, module.in_proj_bias).chunk(3, dim=-1)
            q, k = (y.reshape(b, t, heads, d // heads).transpose(1, 2) for y in (q, k))
            mask = kwargs.get("attn_mask")
            deliver(AttentionEvent(q, k, (d // heads) ** -0.5, mask, softmax))

        handle = module.register_forward_pre_hook(inputs, with_kwargs=True)
        return handle.remove

    def _blocks_out(self, images: Tensor, wanted: Sequence[int]) -> tuple[Tensor, dict[int, Tensor]]:
        p = self.patch_size
        if images.ndim != 4 or images.shape[-2] % p or images.shape[-1] % p:
            raise ValueError(f"expected images (B, 3, H, W) with H and W multiples of {p}, got {tuple(images.shape)}")
        self._grid = (images.shape[-2] // p, images.shape[-1] // p)
        seen: dict[int, Tensor] = {}
        hooks = [self._blocks[i].register_forward_hook(lambda _m, _a, out, i=i: seen.__setitem__(i, out))
                 for i in wanted]
        try:
            pooled = self.visual(images)
        finally:
            for hook in hooks:
                hook.remove()
        return pooled, seen

    def forward(self, images: Tensor) -> Tensor:
        """The tower's embedding (B, output_dim)."""
        return self._blocks_out(images, [])[0]

    def forward_features(self, images: Tensor) -> dict[str, Tensor | None]:
        last = len(self._blocks) - 1
        _, seen = self._blocks_out(images, [last])
        prenorm = seen[last]
        normed = self.norm(prenorm)
        return {"cls": normed[:, 0], "registers": normed[:, 1:1], "patches": normed[:, 1:], "prenorm": prenorm}

    def forward_intermediates(self, images: Tensor, indices: int | Sequence[int] | None = None,
                              norm: bool = False) -> list[Tensor]:
        from vitscope.models.own.vit import resolve_block_indices

        wanted = resolve_block_indices(indices, len(self._blocks))
        _, seen = self._blocks_out(images, wanted)
        return [self.norm(seen[i]) if norm else seen[i] for i in wanted]

