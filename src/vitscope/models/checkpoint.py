"""Model weight files: safetensors with the vitscope config in the header metadata."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vitscope.models.config import ViTConfig
from vitscope.models.vit import VisionTransformer

CONFIG_KEY = "vitscope_config"
MODEL_FILE = "model.safetensors"


def save_model(model: VisionTransformer, path: str | Path) -> Path:
    """Write weights and config atomically (temporary file, then rename) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(tmp), metadata={CONFIG_KEY: json.dumps(model.cfg.to_dict())})
    os.replace(tmp, path)
    return path


def find_model_file(path: str | Path) -> Path:
    """The weights file for a run folder (its model.safetensors) or the file itself."""
    path = Path(path)
    if path.is_dir():
        candidates = [path / MODEL_FILE]
        pointer = path / "checkpoints" / "LATEST"  # written by vitscope.train.checkpoint
        if pointer.is_file():
            candidates.append(path / "checkpoints" / pointer.read_text().strip() / MODEL_FILE)
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"no {MODEL_FILE} in run folder {path}; train it first or pass the weights file")
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


def load_weights(model: torch.nn.Module, path: str | Path, convert=None) -> None:
    """Load a weights file into ``model``, strictly; a mismatch names the missing and unexpected keys.

    ``convert(state_dict, model)`` renames foreign keys first (timm's ``checkpoint_filter_fn``)."""
    state = read_state_dict(path)
    if convert is not None:
        state = convert(state, model)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"weights in {path} do not fit the model: missing {result.missing_keys[:5]}, unexpected "
            f"{result.unexpected_keys[:5]}; check that the model spec matches the checkpoint"
        )
