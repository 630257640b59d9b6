"""Model weight files: safetensors with the vitscope config in the header metadata."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vitscope.files import atomic_path
from vitscope.models.config import ViTConfig
from vitscope.models.vit import VisionTransformer
from vitscope.run_folder import MODEL_FILE, model_file

CONFIG_KEY = "vitscope_config"


def save_model(model: VisionTransformer, path: str | Path) -> Path:
    """Write weights and config atomically (temporary file, then rename) to ``path``."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={CONFIG_KEY: json.dumps(model.cfg.to_dict())})
    return Path(path)


def find_model_file(path: str | Path) -> Path:
    """The weights file for a run folder (its top-level model, ``vitscope.run_folder``) or the file itself."""
    path = Path(path)
    if path.is_dir():
        if model_file(path).is_file():
            return model_file(path)
        raise FileNotFoundError(f"no {MODEL_FILE} in run folder {path}; train it first (the trainer writes it at "
                                "every checkpoint) or pass the weights file")
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} does not exist; pass a vitscope run folder or .safetensors file")
    return path


def load_model(path: str | Path, **overrides) -> VisionTransformer:
    """A VisionTransformer rebuilt from a vitscope weights file or run folder."""
    file = find_model_file(path)
    with safe_open(str(file), framework="pt") as handle:
        meta = handle.metadata() or {}
    if CONFIG_KEY not in meta:
        raise ValueError(f"{file} has no vitscope config; load foreign weights with load(spec, weights={str(file)!r})")
    cfg = ViTConfig.from_dict(json.loads(meta[CONFIG_KEY])).replace(**overrides)
    model = VisionTransformer(cfg)
    load_weights(model, file)
    return model


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a .safetensors, .pth, .pt or .bin file (a 'model' or 'state_dict' entry is unwrapped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist; give the path of a local weights file")
    if path.suffix == ".safetensors":
        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("model", "state_dict", "teacher"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds no state dict; save one with torch.save(model.state_dict(), path)")
    return state


def load_weights(model: torch.nn.Module, path: str | Path, convert=None, may_lack: set[str] = frozenset()) -> None:
    """Load a weights file into ``model``, strictly; a mismatch names the missing and unexpected keys.

    ``convert(state_dict, model)`` renames foreign keys first (timm's ``checkpoint_filter_fn``); keys in
    ``may_lack`` (parameters added to a pretrained model) may be absent from the file."""
    state = read_state_dict(path)
    if convert is not None:
        state = convert(state, model)
    result = model.load_state_dict(state, strict=False)
    missing = [key for key in result.missing_keys if key not in may_lack]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"weights in {path} do not fit the model: missing {missing[:5]}, unexpected "
            f"{result.unexpected_keys[:5]}; check that the model spec matches the checkpoint"
        )
