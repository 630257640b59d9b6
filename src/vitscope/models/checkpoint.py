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
    try:
        with safe_open(str(file), framework="pt") as handle:
            meta = handle.metadata() or {}
    except Exception as err:  # safetensors' "Error while deserializing header", an unreadable file, ...
        raise not_a_checkpoint(file, err) from None
    if CONFIG_KEY not in meta:
        raise ValueError(f"{file} has no vitscope config; load foreign weights with load(spec, weights={str(file)!r})")
    cfg = ViTConfig.from_dict(json.loads(meta[CONFIG_KEY])).replace(**overrides)
    model = VisionTransformer(cfg)
    load_weights(model, file)
    return model


def not_a_checkpoint(path: Path, err: Exception) -> ValueError:
    """The error for a weights file that does not parse (empty, text, truncated): names the file and the fix."""
    detail = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
    return ValueError(f"{path} is not a valid checkpoint ({type(err).__name__}: {detail}); it may be truncated or "
                      "another kind of file: pass a complete .safetensors, .pth, .pt or .bin weights file")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a .safetensors, .pth, .pt or .bin file (a 'model' or 'state_dict' entry is unwrapped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist; give the path of a local weights file")
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # safetensors' header errors; torch's unpickling errors (a text file gives "101")
        raise not_a_checkpoint(path, err) from None
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
        try:
            state = convert(state, model)
        except (RuntimeError, ValueError, KeyError) as err:  # e.g. timm's "shape '[1, 7, 7, -1]' is invalid"
            raise ValueError(f"weights in {path} do not fit the model: converting them failed ({err}); mismatched "
                             f"(file vs model) {_mismatched(state, model)[:5]}; check that the model spec matches "
                             "the checkpoint") from None
    if mismatched := _mismatched(state, model):  # load_state_dict would raise with its detail cut to one line
        own = _own(model)
        raise ValueError(f"weights in {path} do not fit the model: missing {[k for k in own if k not in state][:5]}, "
                         f"unexpected {[k for k in state if k not in own][:5]}, mismatched (file vs model) "
                         f"{mismatched[:5]}; check that the model spec matches the checkpoint")
    result = model.load_state_dict(state, strict=False)
    missing = [key for key in result.missing_keys if key not in may_lack]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"weights in {path} do not fit the model: missing {missing[:5]}, unexpected "
            f"{result.unexpected_keys[:5]}; check that the model spec matches the checkpoint"
        )


def _own(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return model.state_dict()


def _mismatched(state: dict[str, torch.Tensor], model: torch.nn.Module) -> list[str]:
    """'key [file shape] vs [model shape]' for each key both hold with different shapes."""
    own = _own(model)
    return [f"{k} {list(v.shape)} vs {list(own[k].shape)}" for k, v in state.items()
            if k in own and hasattr(v, "shape") and v.shape != own[k].shape]
