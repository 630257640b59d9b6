"""Hugging Face ``transformers`` vision models with vitscope's model contract (an optional extra: ``vitscope[hf]``).

``hf:FOLDER`` loads a model saved with ``save_pretrained`` (``config.json`` and its weights; a full CLIP / SigLIP /
SigLIP2 folder gives its vision tower); ``hf:ARCH`` (a class name such as ``Dinov2Model`` or a ``model_type`` such
as ``dinov2``) builds one with random weights from its default config, changed by keyword overrides.
``hf:ORG/NAME[@REVISION]`` loads that hub repository's snapshot from the local hub cache
(``vitscope.models.weights.hub``); a name that is also an existing folder is the folder. Nothing is downloaded
unless ``download=True`` (``--download``): a name that is not cached is refused with the cache folder searched and
the command that fetches it.

Covered: ViTModel, DeiTModel (CLS and distillation token), Dinov2Model, Dinov2WithRegistersModel, DINOv3ViTModel
(rotary positions, registers), CLIPVisionModel, SiglipVisionModel and Siglip2VisionModel (images are patchified
as its processor does, one full grid per image; or its processor's padded output, a dict, is passed as it is, each
image's layout from its ``spatial_shapes`` and padding left out of every metric).

View. A folder's image processor sets the view its images are fed with and the model's input side
(``models.adapters.hf_processor``): what ``transformers.AutoImageProcessor`` makes of an image, reproduced.

Capture. The model is run with ``attn_implementation="vitscope_sdpa"``: transformers' own SDPA attention function,
called unchanged, which first hands the queries and keys it receives (after any rotary embedding), the mask and the
scale to an observer when one is attached. So the fast path stays on, outputs are those of ``"sdpa"``, and the
probabilities are recomputed (softmax of scale q k^T plus the mask) only when asked for. ``set_normalizer``
(``load(..., attention=)``) switches to ``vitscope_normalized``, vitscope's normaliser in place of softmax
(``models.adapters.hf_attention``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.attention import AttentionEvent, make_normalizer
from vitscope.models.adapters import hf_attention
from vitscope.models.adapters.hf_processor import ProcessorView, processor_view
from vitscope.models.capture.layout import TokenLayout
from vitscope.models.capture.padded import Group, PaddedLayouts, row_major_coords
from vitscope.models.weights import hub

IMPLEMENTATION = hf_attention.OBSERVED
INSTALL = "pip install 'vitscope[hf]'"


@dataclass(frozen=True)
class Family:
    """How vitscope reads one transformers class: its final norm, whether ``last_hidden_state`` is after it,
    its prefix tokens before registers (CLS, DeiT's distillation token)."""

    cls: str
    final_norm: str
    normed_output: bool = True
    leading: int = 1
    patchified: bool = False  # SigLIP2: pre-patchified inputs with spatial shapes


FAMILIES = {
    "vit": Family("ViTModel", "layernorm"),
    "deit": Family("DeiTModel", "layernorm", leading=2),
    "dinov2": Family("Dinov2Model", "layernorm"),
    "dinov2_with_registers": Family("Dinov2WithRegistersModel", "layernorm"),
    "dinov3_vit": Family("DINOv3ViTModel", "norm"),
    "clip_vision_model": Family("CLIPVisionModel", "post_layernorm", normed_output=False),
    "siglip_vision_model": Family("SiglipVisionModel", "post_layernorm", leading=0),
    "siglip2_vision_model": Family("Siglip2VisionModel", "post_layernorm", leading=0, patchified=True),
}
COMPOSITE = {"clip": "clip_vision_model", "siglip": "siglip_vision_model", "siglip2": "siglip2_vision_model"}
BY_CLASS = {family.cls: model_type for model_type, family in FAMILIES.items()}
HUB_NAME = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")  # ORG/NAME[@REVISION] of the Hugging Face hub


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError(f"hf: models need Hugging Face transformers; install it with {INSTALL}") from None
    hf_attention.register(transformers)
    return transformers


def _family(model_type: str, where: str) -> Family:
    model_type = COMPOSITE.get(model_type, model_type)
    if model_type not in FAMILIES:
        known = ", ".join(f.cls for f in FAMILIES.values())
        raise ValueError(f"{where}: model_type {model_type!r} is not a vision model vitscope reads; use one of {known}")
    return FAMILIES[model_type]


def load_hf(name: str, img_size: int | None = None, download: bool = False, **overrides: Any) -> HFVisionTransformer:
    """The model of ``hf:name``: a local ``save_pretrained`` folder; else a hub name ``ORG/NAME[@REVISION]`` from
    the hub cache (``models.weights.hub``; fetched only with ``download``); else an architecture with random weights.

    The steps of ``vitscope.models.load``, in order: find the folder, read its config and build the model with its
    weights (or build the architecture), fit the positions to ``img_size`` (the adapter), take the folder's view."""
    transformers = _transformers()
    folder, source = _find_folder(name, download)
    if folder is None:
        model, family = _build_architecture(transformers, name, overrides)
        dropped, view, origin = [], ProcessorView({}), f"hf {family.cls} (random weights)"
    else:
        model, family, dropped = _read_folder(transformers, name, folder, overrides)
        view, origin = processor_view(transformers, folder), f"hf {family.cls}"
    adapter = HFVisionTransformer(model.eval(), family, view, img_size)
    line = f"vitscope: loaded hf:{name}: origin {origin}, {sum(1 for _ in model.state_dict())} keys matched"
    if dropped:
        line += f"; dropped {len(dropped)} keys of the folder not in {family.cls} (e.g. {dropped[0]})"
    if view.cfg or view.unreproduced:
        line += f"; {view.describe()}"
    adapter.vitscope_load = {"file": str(source.file) if source else name, "origin": origin, "dropped": dropped[:20],
                             "pos_interp": None, "source": source.to_dict() if source else None}
    if source is not None:
        line += f"; {source.note()}"
    print(line, file=sys.stderr)
    return adapter


def _find_folder(name: str, download: bool) -> tuple[Path | None, hub.CachedFile | None]:
    """The ``save_pretrained`` folder ``hf:name`` names (a local folder wins over a hub name of that path) and, for
    a hub name, its cached weights file; (None, None) for an architecture name."""
    folder = Path(name).expanduser()
    if not folder.is_dir() and HUB_NAME.match(name) and BY_CLASS.get(name, name) not in FAMILIES:
        repo_id, revision = hub.split_revision(name)
        folder = hub.hub_folder(f"hf:{name}", repo_id, revision, download=download)
        return folder, hub.folder_weights(folder, repo_id)
    if folder.is_dir():
        return folder, None
    model_type = BY_CLASS.get(name, name)
    if model_type in FAMILIES or model_type in COMPOSITE:
        return None, None
    if folder.exists() or folder.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1:
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"hf:{name} {what}; give hf: the folder written by save_pretrained (holding "
                         "config.json and the weights)")
    raise ValueError(f"hf:{name} is neither a local folder, a hub name (ORG/NAME[@REVISION]) nor an "
                     f"architecture; use a save_pretrained folder, a hub name or one of {', '.join(BY_CLASS)}")


def _read_folder(transformers: Any, name: str, folder: Path, overrides: dict[str, Any]
                 ) -> tuple[nn.Module, Family, list[str]]:
    """The model a ``save_pretrained`` folder holds, built from its config.json with its weights (transformers'
    ``from_pretrained``), and the folder's keys the model did not take; a missing key is refused in one line."""
    if not (folder / "config.json").is_file():
        raise ValueError(f"hf:{name} has no config.json; point hf: at a folder written by save_pretrained")
    config = transformers.AutoConfig.from_pretrained(folder)
    family = _family(config.model_type, f"hf:{name}")
    cls = getattr(transformers, family.cls)
    logs = transformers.utils.logging
    verbosity, bars = logs.get_verbosity(), logs.is_progress_bar_enabled()
    logs.set_verbosity_error()  # its key table and progress bar: vitscope says in one line what it loaded
    logs.disable_progress_bar()
    try:
        model, info = cls.from_pretrained(folder, attn_implementation=IMPLEMENTATION, output_loading_info=True,
                                          **overrides)
    except Exception as err:  # transformers' multi-line reports and safetensors' raw header errors
        raise ValueError(_weights_error(name, err)) from None
    finally:
        logs.set_verbosity(verbosity)
        if bars:
            logs.enable_progress_bar()
    missing = [k for k in info.get("missing_keys", []) if "pooler" not in k and not k.startswith("head.")]
    if missing:
        raise ValueError(f"hf:{name}: the key {sorted(missing)[0]!r} of {family.cls} is missing from the folder's "
                         "weights; save the model with save_pretrained and load that folder")
    return model, family, sorted(info.get("unexpected_keys", []))


def _build_architecture(transformers: Any, name: str, overrides: dict[str, Any]) -> tuple[nn.Module, Family]:
    """``hf:ARCH`` with random weights from its default config, changed by ``overrides`` (its own fields only)."""
    family = _family(BY_CLASS.get(name, name), f"hf:{name}")
    cls = getattr(transformers, family.cls)
    known = set(cls.config_class().to_dict())
    unknown = sorted(set(overrides) - known)
    if unknown:  # a config takes any keyword silently; a typo would change nothing
        raise ValueError(f"hf:{name}: {', '.join(unknown)} not in {cls.config_class.__name__}; use its fields, "
                         f"e.g. {', '.join(sorted(k for k in known if not k.startswith('_'))[:6])}")
    model = cls(cls.config_class(**overrides))
    model.set_attn_implementation(IMPLEMENTATION)
    return model, family


def _weights_error(name: str, err: Exception) -> str:
    """One line for a save_pretrained folder whose weights do not load: another shape, or a damaged file."""
    text = str(err)
    if "mismatch" in text or "above report" in text or "shape" in text:
        return (f"hf:{name}: the folder's weights do not fit the model its config.json describes (tensors of another "
                "shape, e.g. another width); save the model and its config together with save_pretrained")
    detail = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return (f"hf:{name}: the folder's weights cannot be read ({detail}); the file may be truncated or damaged: save "
            "the model again with save_pretrained")


class HFVisionTransformer(nn.Module):
    """A transformers vision model with vitscope's contract (``forward_features`` dict, ``forward_intermediates``,
    ``num_prefix_tokens``, ``grid_size``, ``patch_size``; ``blocks`` and ``norm`` as in timm).

    Tokens are [CLS] [distillation (DeiT)] [registers] [patches, row-major]. ``prenorm`` is the last layer's
    output; ``patches`` are after the model's final norm (for CLIP, whose ``last_hidden_state`` is before it,
    ``post_layernorm`` is applied to every token, as timm's CLIP ViTs do)."""

    def __init__(self, hf_model: nn.Module, family: Family, view: ProcessorView | None = None,
                 img_size: int | None = None):
        super().__init__()
        self.hf = hf_model
        self.family = family
        config = hf_model.config
        self.patch_size = int(config.patch_size)
        side = getattr(config, "image_size", None) or int(round(getattr(config, "num_patches", 256) ** 0.5)) * \
            self.patch_size
        view = view or ProcessorView({})
        side = img_size or view.side or side  # the image processor's output side, as transformers feeds the model
        if side % self.patch_size:
            raise ValueError(f"img_size={side} is not a multiple of the patch size {self.patch_size}")
        self.native_side = int(getattr(config, "image_size", side) or side)
        self.grid_size = (side // self.patch_size, side // self.patch_size)
        self.num_registers = int(getattr(config, "num_register_tokens", 0) or 0)
        self.num_prefix_tokens = family.leading + self.num_registers
        self.embed_dim = self.num_features = int(config.hidden_size)
        self.pretrained_cfg = {"input_size": (3, side, side), **view.at(side)}
        self._grid = self.grid_size
        self._groups: list[Group] | None = None  # the latest input's layout groups, when it was a padded batch
        self._padded: PaddedLayouts | None = None
        layers = [m for name, m in hf_model.named_modules() if isinstance(m, nn.ModuleList)
                  and name.rsplit(".", 1)[-1] in ("layer", "layers")]
        if len(layers) != 1:
            raise ValueError(f"cannot find the layers of {type(hf_model).__name__}; vitscope reads transformers 5")
        self.__dict__["_layers"] = list(layers[0])  # not registered twice: they live in self.hf
        self.__dict__["_attention"] = [_attention_of(layer) for layer in self._layers]

    @property
    def blocks(self) -> list[nn.Module]:
        return self._layers

    @property
    def attention_modules(self) -> list[nn.Module]:
        return self._attention

    @property
    def norm(self) -> nn.Module:
        return getattr(self.hf, self.family.final_norm)

    def init_weights(self) -> None:
        """Re-initialise every weight with the architecture's own scheme (a random twin for probe floors)."""
        self.hf.apply(self.hf._init_weights)

    def input_layout(self) -> TokenLayout:
        """The layout of the latest input (its grid), registers after CLS (and DeiT's distillation token)."""
        layouts = self.__dict__.setdefault("_layouts", {})
        if self._grid not in layouts:
            layouts[self._grid] = TokenLayout(self.num_prefix_tokens, tuple(self._grid), self.patch_size,
                                              self.num_registers)
        return layouts[self._grid]

    def attach_attention(self, index: int, deliver: Callable[[AttentionEvent], None]) -> Callable[[], None]:
        """Hand an ``AttentionEvent`` of layer ``index`` to ``deliver`` at every forward pass until detached."""
        module = self._attention[index]
        watching = hf_attention.observers(module)
        watching.append(deliver)

        def detach() -> None:
            watching.remove(deliver)
            if not watching:
                module.__dict__.pop("_vitscope_observers", None)

        return detach

    def set_normalizer(self, spec: str) -> None:
        """Every layer's attention with vitscope's normaliser ``spec`` in place of softmax
        (``models.adapters.hf_attention``); 'softmax' returns to the observed SDPA path."""
        if spec == "softmax":
            self.hf.set_attn_implementation(hf_attention.OBSERVED)
            return
        heads = int(self.hf.config.num_attention_heads)
        for module in self._attention:
            module.vitscope_normalizer = make_normalizer(spec, heads)
        self.hf.set_attn_implementation(hf_attention.NORMALIZED)

    def input_groups(self) -> list[Group] | None:
        """For a padded SigLIP2 batch, its images grouped by layout (``models.capture.padded``); else None."""
        return self._groups

    def _padded_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """SigLIP2's processor output as it is: ``pixel_values`` (B, N, p*p*C), ``pixel_attention_mask`` (B, N) and
        ``spatial_shapes`` (B, 2); each image's layout from its shape, padding left out of metrics."""
        missing = {"pixel_values", "pixel_attention_mask", "spatial_shapes"} - set(batch)
        if not self.family.patchified or missing:
            raise ValueError(f"a dict input is SigLIP2's processor output (pixel_values, pixel_attention_mask, "
                             f"spatial_shapes); {self.family.cls} takes images (B, 3, H, W)"
                             + (f", and {sorted(missing)} are missing" if missing and self.family.patchified else ""))
        shapes, mask = batch["spatial_shapes"], batch["pixel_attention_mask"]
        coords, valid = row_major_coords(shapes.cpu(), mask.shape[1])
        if not torch.equal(valid, mask.cpu().bool()):
            raise ValueError("pixel_attention_mask does not mark each image's first rows x cols patches as valid; "
                             "pass the processor's output unchanged")
        self._padded = self._padded or PaddedLayouts(self.input_layout())
        self._groups = self._padded.group(coords, valid, mask.device)
        self._grid = tuple(int(v) for v in shapes[0])
        return dict(batch)

    def _inputs(self, images: Tensor | dict[str, Tensor]) -> dict[str, Tensor]:
        if isinstance(images, dict):
            return self._padded_inputs(images)
        self._groups = None
        if images.ndim != 4 or images.shape[-2] % self.patch_size or images.shape[-1] % self.patch_size:
            raise ValueError(f"expected images (B, 3, H, W) with H and W multiples of the patch size "
                             f"{self.patch_size}, got {tuple(images.shape)}")
        b, c, h, w = images.shape
        p = self.patch_size
        self._grid = (h // p, w // p)
        if self.family.patchified:  # SigLIP2's processor layout: (rows, cols, p, p, C) per image
            patches = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, -1, p * p * c)
            shapes = torch.tensor([[h // p, w // p]] * b, device=images.device)
            mask = torch.ones(patches.shape[:2], dtype=torch.long, device=images.device)
            return {"pixel_values": patches, "pixel_attention_mask": mask, "spatial_shapes": shapes}
        inputs = {"pixel_values": images}
        if (h, w) != (self.native_side, self.native_side) and self.family.cls in (
                "ViTModel", "DeiTModel", "CLIPVisionModel", "SiglipVisionModel"):
            inputs["interpolate_pos_encoding"] = True
        return inputs

    def _run(self, images: Tensor, wanted: Sequence[int] = ()) -> tuple[Any, dict[int, Tensor]]:
        """The transformers output and the outputs of the layers in ``wanted``."""
        seen: dict[int, Tensor] = {}
        hooks = [self._layers[i].register_forward_hook(
            lambda _m, _a, out, i=i: seen.__setitem__(i, out[0] if isinstance(out, tuple) else out)) for i in wanted]
        try:
            out = self.hf(**self._inputs(images))
        finally:
            for hook in hooks:
                hook.remove()
        return out, seen

    def forward_features(self, images: Tensor) -> dict[str, Tensor | None]:
        """``cls`` (B, D) or None, ``registers`` (B, R, D), ``patches`` (B, N, D) after the final norm, ``prenorm``
        (B, T, D) the last layer's output."""
        last = len(self._layers) - 1
        out, seen = self._run(images, [last])
        prenorm = seen[last]
        normed = out.last_hidden_state if self.family.normed_output else self.norm(prenorm)
        lead, prefix = self.family.leading, self.num_prefix_tokens
        return {"cls": normed[:, 0] if lead else None, "registers": normed[:, lead:prefix],
                "patches": normed[:, prefix:], "prenorm": prenorm}

    def forward(self, images: Tensor) -> Tensor:
        """The pooled feature (B, D): CLS after the final norm, else the model's pooling head (SigLIP)."""
        if self.family.leading:
            return self.forward_features(images)["cls"]
        out, _ = self._run(images)
        pooled = getattr(out, "pooler_output", None)
        return pooled if pooled is not None else out.last_hidden_state.mean(1)

    def forward_intermediates(self, images: Tensor, indices: int | Sequence[int] | None = None,
                              norm: bool = False) -> list[Tensor]:
        """Layer outputs (B, T, D) for ``indices`` (as vitscope's VisionTransformer), optionally normed."""
        from vitscope.models.own.vit import resolve_block_indices

        wanted = resolve_block_indices(indices, len(self._layers))
        _, seen = self._run(images, wanted)
        return [self.norm(seen[i]) if norm else seen[i] for i in wanted]


def _attention_of(layer: nn.Module) -> nn.Module:
    found = [m for m in layer.children() if type(m).__name__.endswith("Attention") and hasattr(m, "q_proj")]
    if len(found) != 1:
        raise ValueError(f"cannot find the attention of {type(layer).__name__}; vitscope reads transformers 5")
    return found[0]
