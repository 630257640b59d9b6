"""Vision Transformers: vitscope's own model, presets, checkpoints and loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from vitscope.models.checkpoint import load_model, load_weights, save_model
from vitscope.models.config import ViTConfig
from vitscope.models.layout import TokenLayout
from vitscope.models.presets import PRESETS, count_parameters, create, preset_config
from vitscope.models.resize import check_img_size, resize_input
from vitscope.models.sites import AttentionSite, attention_sites, token_layout
from vitscope.models.vit import VisionTransformer


def load(spec: str, weights: str | Path | None = None, *, attention: str | None = None, num_registers: int = 0,
         img_size: int | None = None, pos_interp: str | None = None, pretrained: bool | None = None,
         download: bool = False, **overrides: Any) -> nn.Module:
    """A model from ``spec``: a preset name, ``timm:<name>[.<tag>]``, ``hf:<folder, ORG/NAME[@REVISION] or arch>``
    (``models.hf_adapter``), ``open_clip:<arch>[/<tag> or @file]`` (``models.openclip_adapter``) or a vitscope run
    folder / weights file.

    Pretrained weights by name come from the local caches (``vitscope.models.hub``), never from the network unless
    ``download=True``: ``timm:NAME.TAG`` (or ``timm:NAME`` with ``pretrained=True``, timm's default tag) reads the
    file ``timm.create_model(..., pretrained=True)`` would, and loads it as a ``weights`` file (same origin
    detection, position resampling and load line, which also names the cached file, its revision and sha256);
    ``pretrained=False`` builds a tagged name with random weights. ``hf:ORG/NAME[@REVISION]`` is a hub repository's
    cached snapshot (a folder of that path, when one exists, wins); ``open_clip:ARCH/TAG`` OpenCLIP's file for the
    tag. Presets and timm architectures otherwise start from random weights unless ``weights`` names a local file
    (timm or original-repository key names for timm models). ``attention``, ``num_registers`` and ``img_size``
    modify the model: for vitscope models the normaliser and registers are config options; timm models are built
    with vitscope's attention and timm's registers (``vitscope.models.timm_adapter``). ``img_size`` (pixels, a
    multiple of the patch size) resamples the positional embedding of loaded weights, for every kind of spec; a
    foreign checkpoint's table is resampled as its own repository does (``vitscope.models.origins``), or as
    ``pos_interp`` ('timm' or 'original') says.
    """
    spec = str(spec)
    if pos_interp not in (None, "timm", "original"):
        raise ValueError(f"pos_interp={pos_interp!r} is unknown; use 'timm' or 'original' (or leave it unset to follow "
                         "the checkpoint's origin)")
    if pos_interp is not None and not spec.startswith("timm:"):
        _unused_pos_interp(pos_interp, spec, weights)
    if isinstance(num_registers, bool) or not isinstance(num_registers, int) or num_registers < 0:
        raise ValueError(f"num_registers={num_registers!r} must be an integer >= 0 (0 adds none)")
    if pretrained not in (None, True, False):
        raise ValueError(f"pretrained={pretrained!r} must be True, False or None (None: a timm tag means pretrained)")
    if spec.startswith("timm:"):
        from vitscope.models.timm_adapter import create_timm, load_timm_weights, resize

        name = spec[len("timm:") :]
        source = _timm_source(name, weights, pretrained, download)
        weights = source.file if source is not None else weights
        if pos_interp is not None and weights is None:
            _unused_pos_interp(pos_interp, spec, weights)
        if weights is not None and img_size is not None:  # build at the weights' size: no resampling round trip
            model = create_timm(name, attention=attention, num_registers=num_registers, img_size=img_size,
                                **overrides)
            load_timm_weights(model, weights, pos_interp, source=source)
            return model
        model = create_timm(name, attention=attention, num_registers=num_registers, **overrides)
        if weights is not None:
            load_timm_weights(model, weights, pos_interp, source=source)
        return resize(model, img_size)
    if pretrained:
        raise ValueError(f"pretrained=True applies to timm:NAME; {spec} names its weights itself (hf:ORG/NAME, "
                         "open_clip:ARCH/TAG) or has none by name (presets, run folders)")
    if spec.startswith(("hf:", "open_clip:")):
        return _load_adapted(spec, weights, attention, num_registers, img_size, download, overrides)
    vit_options = {k: v for k, v in (("attention", attention),) if v is not None}
    if num_registers:
        vit_options["num_registers"] = num_registers
    overrides = {**overrides, **vit_options}
    if spec in PRESETS:
        if weights is None and img_size is not None:  # random weights: build at the size directly
            check_img_size(img_size, preset_config(spec, **overrides).patch_size, spec)
            return create(spec, img_size=img_size, **overrides)
        model = create(spec, **overrides)
        if weights is not None:
            load_weights(model, weights)
    elif Path(spec).exists():
        if weights is not None:
            raise ValueError(f"{spec} already holds weights; drop weights={weights!r}")
        model = load_model(spec, **overrides)
    else:
        raise ValueError(
            f"unknown model spec {spec!r}; use a preset ({', '.join(PRESETS)}), timm:NAME[.TAG], hf:FOLDER, "
            "hf:ORG/NAME, open_clip:ARCH[/TAG], or the path of a vitscope run folder or .safetensors file"
        )
    return model if img_size is None else resize_input(model, img_size)


def has_random_weights(spec: str, weights: str | None = None, pretrained: bool | None = None) -> bool:
    """True when ``load(spec, weights, pretrained=pretrained)`` starts from random weights: a preset, ``timm:NAME``
    without a tag (or any with ``pretrained=False``), ``hf:ARCH`` or ``open_clip:ARCH`` without a weights file, tag or
    hub name (run folders, ``.safetensors`` files, hub names and cached tags hold trained weights)."""
    spec = str(spec)
    if weights is not None or pretrained:
        return False
    kind, _, name = spec.partition(":")
    if kind == "timm":
        return "." not in name or pretrained is False
    if kind == "hf":
        return "/" not in name and not Path(name).expanduser().is_dir()
    if kind == "open_clip":
        return not any(mark in name for mark in "@/")
    return spec in PRESETS


def _timm_source(name: str, weights: Any, pretrained: bool | None, download: bool):
    """The cached pretrained file for ``timm:name`` when its tag or ``pretrained`` asks for one, else None."""
    tagged = "." in name
    if pretrained is False or (pretrained is None and not tagged):
        return None
    if weights is not None:
        asked = f"the tag .{name.split('.', 1)[1]}" if tagged and pretrained is None else "pretrained=True"
        raise ValueError(f"timm:{name}: {asked} names timm's pretrained weights and weights={str(weights)!r} names "
                         f"a file; drop one (timm:{name.split('.')[0]} with the file, or the name alone)")
    from vitscope.models.hub import timm_pretrained

    return timm_pretrained(name, download=download)


def _unused_pos_interp(pos_interp: str, spec: str, weights: Any) -> None:
    """A ValueError for ``pos_interp`` given where no timm weights file is loaded (it would be ignored)."""
    given = "no weights" if weights is None else "these weights"
    raise ValueError(f"pos_interp={pos_interp!r} (--pos-interp) sets how a timm model's weights position table is "
                     f"interpolated, and {spec} with {given} loads none that way; drop it, or give timm:NAME with "
                     "--weights FILE (or a pretrained timm:NAME.TAG)")


def _load_adapted(spec: str, weights: Any, attention: str | None, num_registers: int, img_size: int | None,
                  download: bool, overrides: dict[str, Any]) -> nn.Module:
    """``hf:`` and ``open_clip:`` models: their own weights (``weights=`` is an OpenCLIP tower's file), vitscope's
    normaliser for transformers models (``attention=``), no added registers."""
    kind, name = spec.split(":", 1)
    if kind == "open_clip" and weights is not None:  # weights= is the @FILE of the spec
        if "@" in name or "/" in name:
            raise ValueError(f"{spec} already names its file; drop weights={str(weights)!r}")
        name, weights = f"{name}@{weights}", None
    hf_attention = attention if kind == "hf" else None  # transformers models take vitscope's normaliser
    attention = None if kind == "hf" else attention
    for option, value, fix in (("weights", weights, "load the save_pretrained folder with hf:FOLDER"),
                               ("attention", attention, "its nn.MultiheadAttention computes its own softmax"),
                               ("num_registers", num_registers or None, "its registers are the model's own")):
        if value is not None:
            raise ValueError(f"{spec} does not take {option}={value!r}: {fix}")
    if kind == "open_clip":
        from vitscope.models.openclip_adapter import load_open_clip

        return load_open_clip(name, img_size=img_size, download=download, **overrides)
    from vitscope.models.hf_adapter import load_hf

    model = load_hf(name, img_size=img_size, download=download, **overrides)
    if hf_attention is not None:
        model.set_normalizer(hf_attention)
    return model


__all__ = [
    "PRESETS", "AttentionSite", "TokenLayout", "ViTConfig", "VisionTransformer", "attention_sites",
    "check_img_size", "count_parameters", "create", "has_random_weights", "load", "load_model", "load_weights",
    "preset_config", "resize_input", "save_model",
    "token_layout",
]
