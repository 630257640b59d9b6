"""``vitscope.models.load``: a model from a spec, in steps read top to bottom, each taken once.

1. **Parse** the spec and check the options against it (``parse_spec``, ``check_options``).
2. **Find the weights** (``find_weights``): a local file, a vitscope run folder, or the file a pretrained name
   names in the local caches (``weights.hub``); none means random weights.
3. **Build the model** at the asked input size (``build``): vitscope's own ViT from a preset or a run folder's config
   (``own``), a timm architecture with vitscope's attention and registers (``adapters.timm``). The size is checked
   against the patch size here, before any weights are read.
4. **Read the weights into it** (``weights.checkpoint``, ``weights.origins``): the file's position table is fitted
   to the built grid as its own repository fits it (``pos_interp``), so positions are resampled once, from the
   file's grid straight to the model's.
5. **The view** the model is evaluated with travels on the model (``pretrained_cfg``: mean, std, interpolation,
   crop_pct, crop_mode), where the data pipelines read it (``vitscope.data.pixels.model_view``).

``hf:`` folders and ``open_clip:`` towers bring config, weights and view together; their adapters take the same
steps in the same order (``adapters.hf.load_hf``, ``adapters.open_clip.load_open_clip``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from vitscope.models.own.presets import PRESETS, create, preset_config
from vitscope.models.weights.checkpoint import find_model_file, load_model, load_weights
from vitscope.models.weights.resize import check_img_size

KINDS = ("timm", "hf", "open_clip")  # the prefixed kinds; the others are "preset" and "file"


@dataclass(frozen=True)
class Spec:
    """A parsed model spec: ``kind`` (``preset``, ``timm``, ``hf``, ``open_clip`` or ``file``) and ``name`` (the
    spec without its prefix); ``text`` is the spec as given."""

    kind: str
    name: str
    text: str


def parse_spec(spec: str | Path) -> Spec:
    """The kind of ``spec``: a prefixed name, a preset, or the path of a run folder or weights file."""
    text = str(spec)
    for kind in KINDS:
        if text.startswith(f"{kind}:"):
            return Spec(kind, text[len(kind) + 1 :], text)
    if text in PRESETS:
        return Spec("preset", text, text)
    if Path(text).exists():
        return Spec("file", text, text)
    raise ValueError(
        f"unknown model spec {text!r}; use a preset ({', '.join(PRESETS)}), timm:NAME[.TAG], hf:FOLDER, "
        "hf:ORG/NAME, open_clip:ARCH[/TAG], or the path of a vitscope run folder or .safetensors file"
    )


def check_options(spec: Spec, weights: Any, pos_interp: str | None, num_registers: Any, pretrained: Any) -> None:
    """Refuse options that ``spec`` cannot take, each in one line naming the value and the fix."""
    if pos_interp not in (None, "timm", "original"):
        raise ValueError(f"pos_interp={pos_interp!r} is unknown; use 'timm' or 'original' (or leave it unset to follow "
                         "the checkpoint's origin)")
    if pos_interp is not None and spec.kind != "timm":
        _unused_pos_interp(pos_interp, spec.text, weights)
    if isinstance(num_registers, bool) or not isinstance(num_registers, int) or num_registers < 0:
        raise ValueError(f"num_registers={num_registers!r} must be an integer >= 0 (0 adds none)")
    if pretrained not in (None, True, False):
        raise ValueError(f"pretrained={pretrained!r} must be True, False or None (None: a timm tag means pretrained)")
    if pretrained and spec.kind != "timm":
        raise ValueError(f"pretrained=True applies to timm:NAME; {spec.text} names its weights itself (hf:ORG/NAME, "
                         "open_clip:ARCH/TAG) or has none by name (presets, run folders)")
    if spec.kind == "file" and weights is not None:
        raise ValueError(f"{spec.text} already holds weights; drop weights={weights!r}")


@dataclass(frozen=True)
class Weights:
    """Where the weights come from: a local ``file``, and for a file found by name its cache entry (``cached``:
    a ``weights.hub.CachedFile``), which the load line and provenance name."""

    file: Path
    cached: Any = None


def find_weights(spec: Spec, weights: str | Path | None, pretrained: bool | None, download: bool) -> Weights | None:
    """The weights ``load`` reads for a preset, timm or file ``spec``, or None for random weights."""
    if spec.kind == "file":
        return Weights(find_model_file(spec.name))
    if spec.kind == "timm":
        cached = _timm_cached(spec.name, weights, pretrained, download)
        if cached is not None:
            return Weights(Path(cached.file), cached)
    return None if weights is None else Weights(Path(weights))


def _timm_cached(name: str, weights: Any, pretrained: bool | None, download: bool):
    """The cached pretrained file for ``timm:name`` when its tag or ``pretrained`` asks for one, else None."""
    tagged = "." in name
    if pretrained is False or (pretrained is None and not tagged):
        return None
    if weights is not None:
        asked = f"the tag .{name.split('.', 1)[1]}" if tagged and pretrained is None else "pretrained=True"
        raise ValueError(f"timm:{name}: {asked} names timm's pretrained weights and weights={str(weights)!r} names "
                         f"a file; drop one (timm:{name.split('.')[0]} with the file, or the name alone)")
    from vitscope.models.weights.hub import timm_pretrained

    return timm_pretrained(name, download=download)


def load(spec: str | Path, weights: str | Path | None = None, *, attention: str | None = None, num_registers: int = 0,
         img_size: int | None = None, pos_interp: str | None = None, pretrained: bool | None = None,
         download: bool = False, **overrides: Any) -> nn.Module:
    """A model from ``spec``: a preset name, ``timm:<name>[.<tag>]``, ``hf:<folder, ORG/NAME[@REVISION] or arch>``
    (``models.adapters.hf``), ``open_clip:<arch>[/<tag> or @file]`` (``models.adapters.open_clip``) or a vitscope run
    folder / weights file.

    Pretrained weights by name come from the local caches (``vitscope.models.weights.hub``), never from the network
    unless ``download=True``: ``timm:NAME.TAG`` (or ``timm:NAME`` with ``pretrained=True``, timm's default tag) reads
    the file ``timm.create_model(..., pretrained=True)`` would, and loads it as a ``weights`` file (same origin
    detection, position resampling and load line, which also names the cached file, its revision and sha256);
    ``pretrained=False`` builds a tagged name with random weights. ``hf:ORG/NAME[@REVISION]`` is a hub repository's
    cached snapshot (a folder of that path, when one exists, wins); ``open_clip:ARCH/TAG`` OpenCLIP's file for the
    tag. Presets and timm architectures otherwise start from random weights unless ``weights`` names a local file
    (timm or original-repository key names for timm models). ``attention``, ``num_registers`` and ``img_size``
    modify the model: for vitscope models the normaliser and registers are config options; timm models are built
    with vitscope's attention and timm's registers (``vitscope.models.adapters.timm``). ``img_size`` (pixels, a
    multiple of the patch size, checked before anything is read) sets the input size for every kind of spec; a
    loaded position table is resampled to it once, a foreign checkpoint's as its own repository does
    (``vitscope.models.weights.origins``), or as ``pos_interp`` ('timm' or 'original') says.
    """
    parsed = parse_spec(spec)
    check_options(parsed, weights, pos_interp, num_registers, pretrained)
    if parsed.kind in ("hf", "open_clip"):
        return _load_adapted(parsed, weights, attention, num_registers, img_size, download, overrides)
    source = find_weights(parsed, weights, pretrained, download)
    if pos_interp is not None and source is None:
        _unused_pos_interp(pos_interp, parsed.text, weights)
    if parsed.kind == "timm":
        return _load_timm(parsed.name, source, attention, num_registers, img_size, pos_interp, overrides)
    options = {**overrides, **({"attention": attention} if attention is not None else {}),
               **({"num_registers": num_registers} if num_registers else {})}
    if img_size is not None:
        if parsed.kind == "preset":
            check_img_size(img_size, preset_config(parsed.name, **options).patch_size, parsed.text)
        options["img_size"] = img_size
    if parsed.kind == "file":  # its config builds the model (img_size checked there); positions fitted while read
        return load_model(source.file, **options)
    model = create(parsed.name, **options)
    if source is not None:
        load_weights(model, source.file, fit_positions=True)
    return model


def _load_timm(name: str, source: Weights | None, attention: str | None, num_registers: int, img_size: int | None,
               pos_interp: str | None, overrides: dict[str, Any]) -> nn.Module:
    """A timm model: built at ``img_size`` and the file's positions fitted to its grid while read, or, with random
    weights, built and then given the input size as timm resizes its own models (``set_input_size``)."""
    from vitscope.models.adapters.timm import check_timm_img_size, create_timm, load_timm_weights, resize

    if img_size is not None:
        check_timm_img_size(name, img_size, overrides)
    if source is None:
        return resize(create_timm(name, attention=attention, num_registers=num_registers, **overrides), img_size)
    sized = {"img_size": img_size} if img_size is not None else {}
    model = create_timm(name, attention=attention, num_registers=num_registers, **sized, **overrides)
    load_timm_weights(model, source.file, pos_interp, source=source.cached)
    return model


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


def _unused_pos_interp(pos_interp: str, spec: str, weights: Any) -> None:
    """A ValueError for ``pos_interp`` given where no timm weights file is loaded (it would be ignored)."""
    given = "no weights" if weights is None else "these weights"
    raise ValueError(f"pos_interp={pos_interp!r} (--pos-interp) sets how a timm model's weights position table is "
                     f"interpolated, and {spec} with {given} loads none that way; drop it, or give timm:NAME with "
                     "--weights FILE (or a pretrained timm:NAME.TAG)")


def _load_adapted(spec: Spec, weights: Any, attention: str | None, num_registers: int, img_size: int | None,
                  download: bool, overrides: dict[str, Any]) -> nn.Module:
    """``hf:`` and ``open_clip:`` models: their own weights (``weights=`` is an OpenCLIP tower's file), vitscope's
    normaliser for transformers models (``attention=``), no added registers."""
    name = spec.name
    if spec.kind == "open_clip" and weights is not None:  # weights= is the @FILE of the spec
        if "@" in name or "/" in name:
            raise ValueError(f"{spec.text} already names its file; drop weights={str(weights)!r}")
        name, weights = f"{name}@{weights}", None
    hf_attention = attention if spec.kind == "hf" else None  # transformers models take vitscope's normaliser
    attention = None if spec.kind == "hf" else attention
    for option, value, fix in (("weights", weights, "load the save_pretrained folder with hf:FOLDER"),
                               ("attention", attention, "its nn.MultiheadAttention computes its own softmax"),
                               ("num_registers", num_registers or None, "its registers are the model's own")):
        if value is not None:
            raise ValueError(f"{spec.text} does not take {option}={value!r}: {fix}")
    if spec.kind == "open_clip":
        from vitscope.models.adapters.open_clip import load_open_clip

        return load_open_clip(name, img_size=img_size, download=download, **overrides)
    from vitscope.models.adapters.hf import load_hf

    model = load_hf(name, img_size=img_size, download=download, **overrides)
    if hf_attention is not None:
        model.set_normalizer(hf_attention)
    return model
