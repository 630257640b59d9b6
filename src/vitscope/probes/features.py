"""Frozen-backbone token features, computed once and cached on disk (float16, memory-mapped).

Token layers follow vitscope's numbering: 0 is the token embedding with positions added (the input of block 1),
l is the output of block l, ``last`` is L and ``all`` is 0..L. Tokens are read after the model's final norm
unless ``norm=False``. A layer's features are every token of every image, (N, T, D): prefix tokens (CLS, then
registers) first, then the patches of the grid in row-major order, so registers never enter the patch grid.

The cache key holds everything the numbers depend on: a hash of every weight and buffer, the model's
structure (its repr: normaliser, registers, image size), the dataset's name, split, size and a hash of its
images and labels (so a different subset is a different key), the layer, the norm flag and the input geometry
(side, mean, std). A sweep over layers or learning rates therefore runs the backbone once.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from vitscope.analyze.inputs import dataset_view, model_batches, model_input
from vitscope.atomic_io import remove_stale_temporaries
from vitscope.cache_dir import cache_root
from vitscope.data import ImageDataset
from vitscope.models import token_layout
from vitscope.record import record_tokens
from vitscope.run_folder import writer_lock

_CACHE_VERSION = 1


def depth_of(model: nn.Module) -> int:
    """Number of transformer blocks of a plain ViT (its ``blocks``)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "num_prefix_tokens"):
        raise ValueError(f"probes read tokens of plain ViTs (vitscope or timm VisionTransformer); "
                         f"{type(model).__name__} has no blocks/num_prefix_tokens")
    return len(blocks)


def parse_layers(spec: str | int | Sequence[int | str], depth: int) -> list[int]:
    """Token layers (sorted, unique, in 0..depth) from ``last``, ``all``, ``"0,4,last"``, an int or a list."""
    items = spec.split(",") if isinstance(spec, str) else ([spec] if isinstance(spec, int) else list(spec))
    layers: set[int] = set()
    for item in items:
        text = str(item).strip().lower()
        if text == "all":
            layers.update(range(depth + 1))
        elif text == "last":
            layers.add(depth)
        elif text.lstrip("-").isdigit() and 0 <= int(text) <= depth:
            layers.add(int(text))
        else:
            raise ValueError(f"layer {item!r} is not a token layer of this {depth}-block model; use 0..{depth} "
                             "(0 = embedding), 'last' or 'all', comma-separated")
    return sorted(layers)


@dataclass
class LayerFeatures:
    """Every token of token layer ``layer`` for every image: ``tokens`` (N, T, D) float16 (memory-mapped when
    cached). ``num_prefix_tokens`` counts CLS and registers; ``grid`` is (rows, cols) of patches."""

    layer: int
    tokens: Tensor
    num_prefix_tokens: int
    num_registers: int
    grid: tuple[int, int]
    patch_size: int

    @property
    def has_cls(self) -> bool:
        return self.num_prefix_tokens > self.num_registers

    @property
    def cls(self) -> Tensor | None:
        """(N, D) CLS tokens, or None for a model without one."""
        return self.tokens[:, 0] if self.has_cls else None

    @property
    def registers(self) -> Tensor:
        """(N, R, D) register tokens."""
        start = int(self.has_cls)
        return self.tokens[:, start : start + self.num_registers]

    @property
    def patches(self) -> Tensor:
        """(N, rows * cols, D) patch tokens in row-major grid order."""
        return self.tokens[:, self.num_prefix_tokens :]

    def pooled(self, pool: str = "cls") -> Tensor:
        """Image features (N, D) in float32: ``cls``, ``mean`` (mean patch token) or ``both`` (N, 2D)."""
        if pool not in ("cls", "mean", "both"):
            raise ValueError(f"pool={pool!r} is unknown; use cls, mean or both")
        if pool != "mean" and not self.has_cls:
            raise ValueError(f"this model has no CLS token; use pool='mean' instead of {pool!r}")
        parts = []
        if pool in ("cls", "both"):
            parts.append(self.cls.float())
        if pool in ("mean", "both"):
            parts.append(self.patch_mean())
        return torch.cat(parts, dim=1)

    def patch_mean(self, chunk: int = 1024) -> Tensor:
        """(N, D) float32 mean patch token, read ``chunk`` images at a time (memory flat in N)."""
        patches = self.patches
        return torch.cat([patches[i : i + chunk].float().mean(1) for i in range(0, len(patches), chunk)]) \
            if len(patches) else torch.zeros(0, patches.shape[-1])


def _hash_tensors(items: Sequence[tuple[str, Tensor]], digest: Any) -> None:
    for name, tensor in items:
        digest.update(name.encode())
        digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
        digest.update(tensor.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes())


def model_fingerprint(model: nn.Module) -> str:
    """Hash of every weight and buffer, the model's structure (its repr and prefix-token count) and the forward
    hooks on it. A hook (a planted outlier, say) changes outputs that weights do not show: it enters the key by
    identity, so its features are reused within a process and recomputed in the next one."""
    digest = hashlib.sha1()
    digest.update(repr(model).encode())
    digest.update(str(getattr(model, "num_prefix_tokens", None)).encode())
    for name, module in model.named_modules():
        for hooks in (module._forward_hooks, module._forward_pre_hooks):
            for hook in hooks.values():
                digest.update(f"{name}:{getattr(hook, '__qualname__', type(hook).__name__)}:{id(hook)}".encode())
    _hash_tensors(list(model.state_dict().items()), digest)
    return digest.hexdigest()


def dataset_fingerprint(dataset: ImageDataset) -> str:
    """Hash of the dataset's name, split, root, images and labels (a subset is a different fingerprint)."""
    digest = hashlib.sha1(json.dumps([dataset.name, dataset.split, str(dataset.root)]).encode())
    _hash_tensors([("images", dataset.images), ("labels", dataset.labels)], digest)
    return digest.hexdigest()


def _cache_file(folder: Path, model_key: str, data_key: str, layer: int, norm: bool, geometry: Any) -> Path:
    key = json.dumps([_CACHE_VERSION, model_key, data_key, layer, norm, geometry])
    return folder / f"layer{layer}-{hashlib.sha1(key.encode()).hexdigest()[:20]}.npy"


CACHE_FIX = "set VITSCOPE_CACHE to a writable folder with room, or pass --no-cache"
STALE_TEMPORARY = r"\.layer\d+-[0-9a-f]+\.npy\.(?P<pid>\d+)\.tmp"  # _run_backbone's temporaries


def _cache_sink(temp: Path, shape: tuple[int, ...]) -> np.memmap:
    """A float16 ``.npy`` memory map of ``shape`` at ``temp``, once the disk has room for all of it: a memory map
    written past a full disk kills the process with SIGBUS and no message."""
    need = int(np.prod(shape)) * 2 + 4096  # float16 values and the .npy header
    try:
        free = shutil.disk_usage(temp.parent).free
    except OSError:
        free = None
    if free is not None and free < need:
        raise ValueError(f"the disk holding the feature cache {temp.parent} is full: a cache entry needs "
                         f"{need / 2**20:,.0f} MB and {free / 2**20:,.0f} MB are free; free space, or {CACHE_FIX}")
    try:
        sink = np.lib.format.open_memmap(temp, mode="w+", dtype=np.float16, shape=shape)
        with open(temp, "r+b") as handle:  # reserve the blocks now: a disk filled meanwhile fails here, not later
            os.posix_fallocate(handle.fileno(), 0, os.path.getsize(temp))
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise ValueError(f"the disk holding the feature cache {temp.parent} is full (a cache entry needs "
                             f"{need / 2**20:,.0f} MB); free space, or {CACHE_FIX}") from None
        if "sink" not in locals() or err.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise ValueError(f"the feature cache {temp.parent} cannot be written ({err.strerror or err}); "
                             f"{CACHE_FIX}") from None  # else: no fallocate on this file system, written as is
    return sink


def _open(path: Path) -> Tensor:
    return torch.from_numpy(np.load(path, mmap_mode="c"))  # copy-on-write: writable, the file untouched


class _EmbeddingTap:
    """Captures the input of block 1 (token layer 0), optionally through the final norm."""

    def __init__(self, model: nn.Module):
        self.model, self.value = model, None

    def __enter__(self) -> _EmbeddingTap:
        self.handle = self.model.blocks[0].register_forward_pre_hook(self._hook)
        return self

    def _hook(self, _module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        self.value = inputs[0].detach()

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


@torch.no_grad()
def extract_features(model: nn.Module, dataset: ImageDataset, layers: str | Sequence[int | str] = "last", *,
                     norm: bool = True, batch_size: int = 64, device: torch.device | str = "cpu",
                     img_size: int | None = None, cache: str | Path | None | bool = True,
                     progress: bool = True) -> dict[int, LayerFeatures]:
    """Token features of ``layers`` (token-layer numbers) for every image of ``dataset``, by token layer.

    The backbone runs frozen in eval mode, once for all layers missing from the cache; ``cache`` is a folder,
    True for ``$VITSCOPE_CACHE/features`` or False for memory only. Each cached layer is written to a temporary
    file batch by batch (memory stays flat in dataset size) and renamed into place when complete.
    """
    depth = depth_of(model)
    wanted = parse_layers(layers, depth)
    layout = token_layout(model)
    side, mean, std = model_input(model, dataset, img_size)
    # how the images became inputs: a change of preprocessing is a new cache entry, never a stale one
    # (crop_pct, then only what differs from a bilinear centre crop: views named so keep their keys from before)
    geometry = [side, list(mean), list(std), "eval-view", *dataset_view(model, dataset, img_size).key()[1:]]
    folder = None if cache is False or cache is None else (cache_root() / "features" if cache is True
                                                            else Path(cache))
    files: dict[int, Path] = {}
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(f"the feature cache {folder} cannot be created ({err.strerror or err}); "
                             f"{CACHE_FIX}") from None
        model_key, data_key = model_fingerprint(model), dataset_fingerprint(dataset)
        files = {layer: _cache_file(folder, model_key, data_key, layer, norm, geometry) for layer in wanted}
    missing = [layer for layer in wanted if layer not in files or not files[layer].exists()]
    lock = nullcontext() if not missing or folder is None else writer_lock(
        folder, "feature cache", CACHE_FIX, name=f".{model_key[:16]}-{data_key[:16]}.lock", wait=True)
    with lock:  # one writer per cache entry: a second process waits for it, then reuses what it wrote
        if missing and folder is not None:  # what a killed writer left: a half-written entry, hundreds of MB
            remove_stale_temporaries(folder, STALE_TEMPORARY)
        missing = [layer for layer in missing if layer not in files or not files[layer].exists()]
        computed = _run_backbone(model, dataset, missing, norm, batch_size, device, img_size, files, progress)
    out = {}
    for layer in wanted:
        tokens = computed[layer] if layer in computed and folder is None else _open(files[layer])
        out[layer] = LayerFeatures(layer, tokens, layout.num_prefix_tokens, layout.num_registers,
                                   tuple(layout.grid_size), layout.patch_size)
    return out


def _run_backbone(model: nn.Module, dataset: ImageDataset, layers: list[int], norm: bool, batch_size: int,
                  device: torch.device | str, img_size: int | None, files: dict[int, Path], progress: bool
                  ) -> dict[int, Tensor]:
    """One pass of the frozen backbone writing ``layers`` to ``files`` (or returning them in memory)."""
    if not layers:
        return {}
    was_training = model.training
    model.to(device).eval()
    sinks: dict[int, Any] = {}
    temps: dict[int, Path] = {}
    blocks = [layer - 1 for layer in layers if layer > 0]
    final_norm = getattr(model, "norm", None)
    bar = tqdm(total=len(dataset), unit="img", desc=f"features (layers {','.join(map(str, layers))})",
               disable=not progress, dynamic_ncols=True)
    start = 0
    try:
        for images, _ in model_batches(model, dataset, batch_size, device, img_size):
            with _EmbeddingTap(model) as tap, record_tokens(model, layers=blocks or [0]) as rec:
                model(images)
            by_layer = {}
            if 0 in layers:
                embedded = tap.value
                by_layer[0] = final_norm(embedded) if norm and final_norm is not None else embedded
            raw, normed = rec.tokens, rec.normed
            for slot, block in enumerate(sorted(set(blocks))):
                by_layer[block + 1] = normed[slot] if norm and normed[slot] is not None else raw[slot]
            for layer in layers:
                batch = by_layer[layer].to("cpu", torch.float16).numpy()
                if layer not in sinks:
                    shape = (len(dataset), *batch.shape[1:])
                    if layer in files:
                        temps[layer] = files[layer].with_name(f".{files[layer].name}.{os.getpid()}.tmp")
                        sinks[layer] = _cache_sink(temps[layer], shape)
                    else:
                        sinks[layer] = np.empty(shape, dtype=np.float16)
                sinks[layer][start : start + len(batch)] = batch
            start += len(images)
            bar.update(len(images))
        memory = {}
        for layer, sink in sinks.items():
            if layer in temps:
                sink.flush()
                del sink
                os.replace(temps.pop(layer), files[layer])
            else:
                memory[layer] = torch.from_numpy(sink)
        return memory
    finally:
        bar.close()
        for temp in temps.values():  # an interrupted pass leaves no half-written cache entry
            temp.unlink(missing_ok=True)
        model.train(was_training)

