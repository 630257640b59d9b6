"""Foreign checkpoint files for timm architectures: where a file comes from, and loading it as its own code would.

Origins, detected from the keys:
- ``hf``: Hugging Face ``transformers`` names (``embeddings.``, ``encoder.layer.``, ``vision_model.``); refused here,
  loaded with ``hf:FOLDER``;
- ``dinov3``: the DINOv3 repository (``storage_tokens``, ``rope_embed``); rotary positions, nothing to interpolate;
- ``dinov2``: the DINOv2 repository (``mask_token``, ``register_tokens``), or a DINOv2 backbone in timm's key names
  (as timm's ``vit_*_patch14_dinov2`` files: the DINO layout below with LayerScale and 14-pixel patches);
- ``dino``: timm's key names without a classifier head and without registers, the layout of the DINO repository's
  released backbones (``backbone.`` / ``module.`` prefixes of its training checkpoints are stripped);
- ``timm``: anything else with timm's names.

Position embeddings. At a grid other than the file's, the original repositories interpolate the learned table at
every forward pass (``interpolate_pos_encoding``): bicubic, with
- DINO and DINOv2 without registers: ``scale_factor = (g + 0.1) / M`` per axis (M: the table's side, g: the new
  grid's), no antialiasing;
- DINOv2 with registers (``interpolate_offset=0``, ``interpolate_antialias=True``): ``size = g``, antialiased.
timm resamples with ``size = g`` and antialiasing whatever the origin. ``pos_interp`` chooses: ``None`` follows the
origin, ``"original"`` / ``"timm"`` force one. The table is resampled here, before timm's converter, so timm finds
it at the model's grid and keeps it.

Refused, in one line naming the file, the key and the fix: a patch size other than the model's (timm would resample
the patch kernel), register tokens the model has and the file lacks (or the other way round), and any missing or
unexpected key that is not a known classifier head. A head the file lacks is dropped from the model; a head the
model lacks is dropped from the file; both are said in the load line.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.models.weights.checkpoint import differences, misfit, mismatched_keys

ORIGINS = ("timm", "dino", "dinov2", "dinov3", "hf")
POS_INTERP = ("timm", "original")
# classifier / projection heads a backbone file or a model may carry: timm's, and the DINO, iBOT and DINOv2 heads
HEAD_PREFIXES = ("head.", "dino_head.", "ibot_head.")
_TRAINING_PREFIXES = ("module.", "backbone.")


@dataclass
class LoadReport:
    """What one load did: ``origin``, keys matched, what was dropped, how positions were interpolated."""

    file: Path
    origin: str
    matched: int = 0
    dropped: list[str] = field(default_factory=list)
    pos_interp: str | None = None  # 'original' or 'timm' when the table was resampled, else None
    notes: list[str] = field(default_factory=list)
    source: dict | None = None  # a file found by name: hub.CachedFile.to_dict() (repo, revision, sha256)

    def line(self) -> str:
        dropped = "; dropped " + ", ".join(self.dropped) if self.dropped else ""
        interp = f"; positions interpolated as {interpolated_by(self.origin, self.pos_interp)} does" \
            if self.pos_interp else ""
        notes = "".join(f"; {note}" for note in self.notes)
        return (f"vitscope: loaded {self.file.name}: origin {self.origin}, {self.matched} keys matched{dropped}{interp}"
                f"{notes}")

    def to_dict(self) -> dict:
        return {"file": str(self.file), "origin": self.origin, "matched": self.matched, "dropped": self.dropped,
                "pos_interp": self.pos_interp, "notes": self.notes, "source": self.source}


REPOSITORIES = {"dino": "the DINO repository", "dinov2": "the DINOv2 repository"}  # whose code 'original' names


def interpolated_by(origin: str, pos_interp: str) -> str:
    """Whose code resampled the position table: timm, or the repository that wrote the file (``original``)."""
    return REPOSITORIES.get(origin, "the file's repository") if pos_interp == "original" else "timm"


def strip_training_prefixes(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Keys without a DDP ``module.`` or DINO ``backbone.`` prefix (when every backbone key has it)."""
    for prefix in _TRAINING_PREFIXES:
        if state and any(k.startswith(prefix) for k in state) and all(
                k.startswith(prefix) or k.startswith(HEAD_PREFIXES) for k in state):
            state = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
    return state


def detect_origin(state: dict[str, Tensor]) -> str:
    """Which code wrote ``state`` (one of ``ORIGINS``), from its key names."""
    keys = set(state)
    if any(k.startswith(("embeddings.", "encoder.layer.", "vision_model.", "dinov2.", "vit.")) for k in keys):
        return "hf"
    if "storage_tokens" in keys or any(k.startswith("rope_embed.") for k in keys):
        return "dinov3"
    if "mask_token" in keys or "register_tokens" in keys:
        return "dinov2"
    if "cls_token" in keys and "reg_token" not in keys and _has_cls_entry(state.get("pos_embed")) and not any(
            k.startswith(HEAD_PREFIXES) for k in keys):
        kernel = state.get("patch_embed.proj.weight")
        dinov2 = "blocks.0.ls1.gamma" in keys and isinstance(kernel, Tensor) and kernel.shape[-1] == 14
        return "dinov2" if dinov2 else "dino"  # DINOv2 backbones in timm's names: LayerScale, 14-pixel patches
    return "timm"


def _has_cls_entry(table: object) -> bool:
    """Whether a position table (1, 1 + M*M, D) has a CLS entry before a square patch grid."""
    if not isinstance(table, Tensor) or table.ndim != 3:
        return False
    n = table.shape[1]
    return math.isqrt(n) ** 2 != n and math.isqrt(n - 1) ** 2 == n - 1


def original_pos_embed(table: Tensor, grid: tuple[int, int], *, offset: float, antialias: bool) -> Tensor:
    """The DINO / DINOv2 ``interpolate_pos_encoding`` of a table (1, 1 + M*M, D) with its CLS entry first, to a
    ``grid`` (rows, cols): bicubic on the M x M patch part, ``scale_factor = (g + offset) / M`` when ``offset`` is
    nonzero, else ``size = grid``; ``antialias`` as the repository's setting. Returns (1, 1 + rows*cols, D)."""
    cls_entry, patches = table[:, :1], table[:, 1:].float()
    side = math.isqrt(patches.shape[1])
    if side * side != patches.shape[1]:
        raise ValueError(f"a position table of {patches.shape[1]} patch entries is not square; it cannot be an "
                         "original DINO/DINOv2 table")
    dim = patches.shape[-1]
    kwargs = ({"scale_factor": ((grid[0] + offset) / side, (grid[1] + offset) / side)} if offset
              else {"size": tuple(grid)})
    out = F.interpolate(patches.reshape(1, side, side, dim).permute(0, 3, 1, 2), mode="bicubic", antialias=antialias,
                        **kwargs)
    if tuple(out.shape[-2:]) != tuple(grid):
        raise ValueError(f"interpolating the position table to {grid} gave {tuple(out.shape[-2:])}")
    return torch.cat([cls_entry, out.permute(0, 2, 3, 1).reshape(1, -1, dim).to(table.dtype)], dim=1)


def model_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return f"timm:{cfg.get('architecture', type(model).__name__)}"


def _file_registers(state: dict[str, Tensor]) -> int:
    for key in ("register_tokens", "reg_token", "storage_tokens"):
        if key in state:
            return int(state[key].shape[1])
    return 0


def check_fits(state: dict[str, Tensor], model: nn.Module, file: Path, own_registers: int) -> None:
    """Refuse a file whose patch size or register count differs from the model's (``own_registers``: the
    registers the architecture itself has, not those vitscope adds)."""
    name = model_name(model)
    kernel = state.get("patch_embed.proj.weight")
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    if kernel is not None and isinstance(proj, nn.Conv2d) and kernel.ndim == 4:
        have, want = tuple(kernel.shape[-2:]), tuple(proj.weight.shape[-2:])
        if have != want:
            raise ValueError(f"{file}: patch_embed.proj.weight is a {have[0]}x{have[1]} patch kernel but {name} takes "
                             f"{want[0]}x{want[1]} patches; use the /{have[0]} variant of the architecture "
                             f"(e.g. patch{have[0]} in the timm name)")
    regs = _file_registers(state)
    if own_registers and not regs:
        raise ValueError(f"{file}: no register tokens (register_tokens / reg_token) but {name} has {own_registers}; "
                         "use the architecture without registers (e.g. drop _reg4 from the name) or a file with them")
    if regs and not own_registers:
        key = next(k for k in ("register_tokens", "reg_token", "storage_tokens") if k in state)
        raise ValueError(f"{file}: {key} holds {regs} register tokens but {name} has none; use the register variant "
                         f"of the architecture (e.g. _reg{regs} in the timm name)")
    if regs != own_registers:
        raise ValueError(f"{file}: {regs} register tokens but {name} has {own_registers}; use the _reg{regs} variant")


def resample_positions(state: dict[str, Tensor], model: nn.Module, origin: str, pos_interp: str | None
                       ) -> str | None:
    """Resample the file's ``pos_embed`` to the model's grid as ``pos_interp`` says (None: as the origin's code
    does), in place; returns what was used, or None when the grids already agree."""
    if pos_interp is not None and pos_interp not in POS_INTERP:
        raise ValueError(f"pos_interp={pos_interp!r} is unknown; use one of {', '.join(POS_INTERP)}")
    table, target = state.get("pos_embed"), getattr(model, "pos_embed", None)
    grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
    if table is None or target is None or grid is None or table.ndim != 3:
        return None
    n = table.shape[1]
    file_prefix = 0 if math.isqrt(n) ** 2 == n else 1  # 1 with a CLS entry first (1 + M*M)
    if table.shape[1] - file_prefix == grid[0] * grid[1]:
        return None  # already the model's grid (timm checks squareness itself)
    mode = pos_interp or ("original" if origin in ("dino", "dinov2") else "timm")
    if mode == "timm" or origin not in ("dino", "dinov2") or file_prefix != 1:
        return "timm"  # timm's converter resamples it (size = grid, antialiased); timm's own files are timm's
    registers = "register_tokens" in state
    resampled = original_pos_embed(table, tuple(grid), offset=0.0 if registers else 0.1, antialias=registers)
    state["pos_embed"] = resampled
    return "original"


def known_head(key: str) -> bool:
    return key.startswith(HEAD_PREFIXES)


def has_head(model: nn.Module) -> bool:
    """Whether a timm model has a classifier (``num_classes`` > 0)."""
    return int(getattr(model, "num_classes", 0) or 0) > 0 and hasattr(model, "reset_classifier")


def prepare(state: dict[str, Tensor], model: nn.Module, file: Path, *, own_registers: int,
            pos_interp: str | None) -> tuple[dict[str, Tensor], LoadReport]:
    """The file's tensors made ready for timm's converter, and the report so far: prefixes stripped, origin
    detected, the fit checked, positions resampled, and a head the model lacks dropped from the file."""
    state = strip_training_prefixes(dict(state))
    origin = detect_origin(state)
    report = LoadReport(file, origin)
    if origin == "hf":
        key = next(iter(state))
        raise ValueError(f"{file}: {key!r} is a Hugging Face transformers key; load the folder holding this file and "
                         "its config.json with --model hf:FOLDER")
    check_fits(state, model, file, own_registers)
    if not has_head(model):
        heads = sorted({k.split(".")[0] for k in state if known_head(k)})
        if heads:
            state = {k: v for k, v in state.items() if not known_head(k)}
            report.dropped.append(f"the file's {', '.join(heads)} (the model has no head)")
    report.pos_interp = resample_positions(state, model, origin, pos_interp)
    if origin in ("dino", "dinov2") and getattr(model, "dynamic_img_size", False):
        report.notes.append("built with dynamic_img_size, inputs of other sizes are resampled by timm at each forward, "
                            "not as the original code does; build at the input size (img_size=) instead")
    return state, report


def fix(report: LoadReport) -> str:
    """What to do when a file's tensors do not fit the model (the end of ``checkpoint.misfit``'s line)."""
    return (f"use the architecture the file was saved from (origin {report.origin}); only a known head "
            f"({', '.join(HEAD_PREFIXES)}) may be missing or extra")


def finish(model: nn.Module, state: dict[str, Tensor], report: LoadReport, may_lack: set[str]) -> LoadReport:
    """Load the converted ``state`` into ``model``: a head the file lacks is dropped from the model; any other
    missing, unexpected or mismatched key is refused in one line naming the file and listing the keys
    (``checkpoint.misfit``)."""
    if has_head(model) and not any(k.startswith("head.") for k in state):
        model.reset_classifier(0)
        report.dropped.append("the model's classifier head (the file has none; outputs are pooled features)")
    missing, unexpected = differences(state, model, may_lack, known_head)
    if missing or unexpected or mismatched_keys(state, model):  # load_state_dict would cut its detail to a line
        raise misfit(report.file, state, model, missing, unexpected, model_name=model_name(model), fix=fix(report))
    result = model.load_state_dict(state, strict=False)
    dropped_heads = sorted({k.split(".")[0] for k in result.unexpected_keys if known_head(k)})
    if dropped_heads:
        report.dropped.append(f"the file's {', '.join(dropped_heads)}")
    report.matched = len(state) - len(result.unexpected_keys)
    return report


def announce(report: LoadReport) -> None:
    """The one line that says what was loaded, on stderr."""
    print(report.line(), file=sys.stderr)
