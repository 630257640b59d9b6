"""Model weight files: safetensors with the vitscope config in the header metadata."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vitscope.atomic_io import atomic_path
from vitscope.models.own.config import ViTConfig
from vitscope.models.own.vit import VisionTransformer
from vitscope.models.weights.resize import check_img_size, fit_position_table
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
    """A VisionTransformer rebuilt from a vitscope weights file or run folder; ``overrides`` change its config (an
    ``img_size`` builds it at that size, the file's position table fitted to the grid as it is read)."""
    file = find_model_file(path)
    try:
        with safe_open(str(file), framework="pt") as handle:
            meta = handle.metadata() or {}
    except Exception as err:  # safetensors' "Error while deserializing header", an unreadable file, ...
        raise not_a_checkpoint(file, err) from None
    if CONFIG_KEY not in meta:
        raise ValueError(f"{file} has no vitscope config; load foreign weights with load(spec, weights={str(file)!r})")
    cfg = ViTConfig.from_dict(json.loads(meta[CONFIG_KEY]))
    if overrides.get("img_size") is not None:
        check_img_size(overrides["img_size"], overrides.get("patch_size", cfg.patch_size), str(file))
    model = VisionTransformer(cfg.replace(**overrides))
    load_weights(model, file, fit_positions=True)
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


def load_weights(model: torch.nn.Module, path: str | Path, convert=None, may_lack: set[str] = frozenset(), *,
                 fit_positions: bool = False) -> None:
    """Load a weights file into ``model``, strictly; a mismatch names the missing and unexpected keys.

    ``convert(state_dict, model)`` renames foreign keys first (timm's ``checkpoint_filter_fn``); keys in
    ``may_lack`` (parameters added to a pretrained model) may be absent from the file. ``fit_positions``: a
    vitscope ViT's learned position table saved at another grid is resampled to the model's (``resize``)."""
    state = read_state_dict(path)
    if convert is not None:
        state = convert_or_refuse(state, model, convert, path)
    table = state.get("pos_embed")
    if fit_positions and isinstance(model, VisionTransformer) and table is not None and table.ndim == 3:
        state["pos_embed"] = fit_position_table(table, model)
    missing, unexpected = differences(state, model, may_lack)
    if missing or unexpected or mismatched_keys(state, model):  # load_state_dict cuts its detail to one line
        raise misfit(path, state, model, missing, unexpected)
    model.load_state_dict(state, strict=False)


FIX = "check that the model spec matches the checkpoint"
SHOWN = 5  # keys listed per kind in a misfit line; the rest are counted


def misfit(path: str | Path, state: dict[str, torch.Tensor], model: torch.nn.Module, missing: list[str],
           unexpected: list[str], *, model_name: str = "", detail: str = "", fix: str = FIX) -> ValueError:
    """The one-line error for weights that do not fit ``model``: names the file and lists the ``missing`` and
    ``unexpected`` keys and those whose shapes differ (file vs model), each kind capped at ``SHOWN`` with a count
    of the rest; ``detail`` says what failed first (a converter's error), ``fix`` what to do."""
    kinds = [("missing", missing), ("unexpected", unexpected),
             ("mismatched (file vs model)", mismatched_keys(state, model))]
    listed = ", ".join(f"{kind} {_capped(keys)}" for kind, keys in kinds if keys) or "no key differs"
    name = f" {model_name}" if model_name else ""
    detail = f" ({detail})" if detail else ""
    return ValueError(f"weights in {path} do not fit the model{name}{detail}: {listed}; {fix}")


def _capped(keys: list[str]) -> str:
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return f"{keys[:SHOWN]}{more}"


def differences(state: dict[str, torch.Tensor], model: torch.nn.Module, may_lack: Collection[str] = (),
                may_have: Callable[[str], bool] = lambda key: False) -> tuple[list[str], list[str]]:
    """The model's keys the file lacks (but those in ``may_lack``) and the file's keys the model lacks (but those
    for which ``may_have`` is true: a classifier head the model does not have)."""
    own = _own(model)
    missing = [k for k in own if k not in state and k not in may_lack]
    return missing, [k for k in state if k not in own and not may_have(k)]


def convert_or_refuse(state: dict[str, torch.Tensor], model: torch.nn.Module, convert, path: str | Path, *,
                      may_lack: Collection[str] = (), may_have: Callable[[str], bool] = lambda key: False,
                      **misfit_options) -> dict[str, torch.Tensor]:
    """``convert(state, model)`` (timm's ``checkpoint_filter_fn``); when it fails on tensors that do not fit (timm's
    ``shape '[1, 7, 7, -1]' is invalid`` for an odd position grid), the ``misfit`` line with its error as detail
    (``may_lack``, ``may_have``: as ``differences``; ``misfit_options``: ``model_name``, ``fix``)."""
    try:
        return convert(state, model)
    except (RuntimeError, ValueError, KeyError, IndexError) as err:
        missing, unexpected = differences(state, model, may_lack, may_have)
        message = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise misfit(path, state, model, missing, unexpected, detail=f"converting them failed: {message}",
                     **misfit_options) from None


def _own(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return model.state_dict()


def mismatched_keys(state: dict[str, torch.Tensor], model: torch.nn.Module) -> list[str]:
    """'key [file shape] vs [model shape]' for each key both hold with different shapes."""
    own = _own(model)
    return [f"{k} {list(v.shape)} vs {list(own[k].shape)}" for k, v in state.items()
            if k in own and hasattr(v, "shape") and v.shape != own[k].shape]
