"""An interactive attention and token explorer in one offline HTML file (docs/explore.md).

    page = vitscope.explore(model, images)              # or [model_a, model_b] to compare, labels=[...]
    page                                                # renders inline in Jupyter
    page.save("explorer.html")

``images`` are the pictures as they look: uint8 (images, 3, H, W) or floats in [0, 1], or an ``ImageDataset``
(then the model's input size and the dataset's normalisation are used, as ``vitscope analyze`` does). Each model
sees the evaluation view of the pictures at its input side (``vitscope.data.pixels.model_view``: its own library's
transform); when that view cuts part of a picture (not square, or the model's ``crop_pct`` < 1), the page shows
the first model's view, so the maps lie over what the model saw.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from vitscope.analyze.inputs import model_input
from vitscope.atomic_io import atomic_write_bytes
from vitscope.data import ImageDataset, normalize
from vitscope.data.pixels import model_view
from vitscope.explorer.budget import check_page_size
from vitscope.explorer.measure import ModelRecord, matched_layers, record_model
from vitscope.explorer.page import render_page, static_bytes
from vitscope.explorer.payload import build_payload, picture_urls
from vitscope.lazy_import import submodule_getattr
from vitscope.models import attention_sites

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Explorer:
    """A built explorer page: ``data`` (the whole file's bytes), ``html`` (the same as text), ``save(path)``, and
    ``_repr_html_`` for Jupyter."""

    def __init__(self, page: bytes, meta: dict):
        self.data, self.meta = page, meta
        self._html: str | None = None

    @property
    def html(self) -> str:
        """The page as text: its bytes read as Latin-1, which the page's decoder reads as the file (``blob``)."""
        if self._html is None:
            self._html = self.data.decode("latin-1")
        return self._html

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (a folder gets ``explorer.html``); returns the file written."""
        path = Path(path)
        path = path / "explorer.html" if path.is_dir() else path
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write_bytes(path, self.data)

    def _repr_html_(self) -> str:
        # an iframe keeps the page's script and styles apart from the notebook's
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width:100%;height:900px;border:0" '
                'sandbox="allow-scripts allow-downloads"></iframe>')

    @property
    def size_bytes(self) -> int:
        return len(self.data)


def _pictures(images: Tensor) -> Tensor:
    """uint8 (images, 3, H, W) from uint8 or [0, 1] float pictures."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (images, 3, H, W), got shape {tuple(images.shape)}")
    if images.dtype == torch.uint8:
        return images.cpu()
    if float(images.min()) < 0 or float(images.max()) > 1:
        raise ValueError("float images must lie in [0, 1] (the pictures as they look, not normalised inputs); "
                         "pass uint8 or [0, 1] images")
    return (images.float() * 255).round().to(torch.uint8).cpu()


def model_inputs(model: nn.Module, pictures: Tensor, dataset: ImageDataset | None = None,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Tensor:
    """Normalised inputs (images, 3, S, S) of ``model`` from uint8 ``pictures``: their evaluation view at the model's
    input side S (``vitscope.data.pixels.model_view``, the model's own transform, as ``vitscope analyze`` feeds it),
    normalised with ``mean``/``std``, else the dataset's, else the model's pretrained ones, else ImageNet's."""
    pretrained = getattr(model, "pretrained_cfg", None) or {}
    stats = dataset if dataset is not None else SimpleNamespace(
        mean=tuple(mean or pretrained.get("mean", IMAGENET_MEAN)),
        std=tuple(std or pretrained.get("std", IMAGENET_STD)), image_size=pictures.shape[-1])
    side, m, s = model_input(model, stats)
    m, s = (tuple(mean), tuple(std)) if mean is not None and std is not None else (m, s)
    view = model_view(model, getattr(dataset, "name", None), side)
    return normalize(pictures if getattr(dataset, "view", None) == view else view(pictures), m, s)


def shown_pictures(model: nn.Module, pictures: Tensor, dataset: ImageDataset | None = None) -> Tensor:
    """uint8 ``pictures`` as the page shows them: as they are when ``model``'s view only resizes them (square
    pictures at crop_pct 1, or already at its side), else its view (the part of each picture it sees)."""
    stats = dataset if dataset is not None else SimpleNamespace(image_size=pictures.shape[-1], mean=(0,), std=(1,))
    side = model_input(model, stats)[0]
    view = model_view(model, getattr(dataset, "name", None), side)
    height, width = pictures.shape[-2:]
    if getattr(dataset, "view", None) == view or height == width and (
            view.scale_size == side or (height == side and view.keep_square)):
        return pictures
    return view(pictures)


def dataset_captions(dataset: ImageDataset) -> list[str]:
    """A caption per image: its number, and its class where the set has more than one (a folder of photos is one
    class named after the folder, which says nothing about the photo)."""
    named = len(set(dataset.labels.tolist())) > 1 and bool(dataset.classes)
    return [f"image {i + 1}" + (f": {dataset.classes[int(y)]}" if named else "") for i, y in enumerate(dataset.labels)]


def explore(models: nn.Module | Sequence[nn.Module], images: Tensor | ImageDataset, *,
            labels: Sequence[str] | None = None, layers: Sequence[int] | None = None,
            heads: Sequence[int] | None = None, threshold: str = "percentile:98", detect_layer: int = -1,
            mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
            captions: Sequence[str] | None = None,
            title: str = "vitscope explorer", max_bytes: int = 100_000_000, batch_size: int = 16,
            device: torch.device | str = "cpu", rows: str = "auto") -> Explorer:
    """The explorer page of one model, or several side by side (the first is the reference: ``layers``, 0-based,
    are its layers, and the others show the layers at the same relative depth). ``heads`` are 0-based (None: all);
    ``threshold`` and ``detect_layer`` (0-based block, -1 the last) set the high-norm rule as in ``analyze norms``.
    ``rows``: how each layer's attention rows are stored: ``auto`` (the smaller of maps and queries and keys),
    ``qk`` (queries and keys wherever the layer allows) or ``maps`` (``vitscope.explorer.rows``). A page estimated
    above ``max_bytes`` is refused before any model runs (``vitscope.explorer.budget``); maps are quantised to fit
    it (``vitscope.explorer.payload``)."""
    models = [models] if isinstance(models, nn.Module) else list(models)
    if not models:
        raise ValueError("explore needs at least one model")
    labels = list(labels) if labels is not None else [f"model {i + 1}" for i in range(len(models))]
    if len(labels) != len(models):
        raise ValueError(f"{len(labels)} labels for {len(models)} models; give one label per model")
    dataset = images if isinstance(images, ImageDataset) else None
    pictures = _pictures(dataset.images if dataset is not None else images)
    if dataset is not None and captions is None:
        captions = dataset_captions(dataset)
    captions = list(captions) if captions is not None else [f"image {i + 1}" for i in range(len(pictures))]
    originals, pictures = pictures, shown_pictures(models[0], pictures, dataset)
    sites = attention_sites(models[0])
    reference_depth = len(sites)
    if layers is not None and not all(-reference_depth <= int(i) < reference_depth for i in layers):
        raise ValueError(f"layers {list(layers)} (0-based) reach past the {reference_depth} attention layers of "
                         f"{labels[0]}; use 0..{reference_depth - 1}")
    most_heads = max(int(getattr(site.module, "num_heads", 0)) for site in sites)
    if heads is not None and most_heads and not all(0 <= int(h) < most_heads for h in heads):
        raise ValueError(f"heads {list(heads)} (0-based) reach past the {most_heads} heads of {labels[0]}; "
                         f"use 0..{most_heads - 1}")
    reference = list(range(reference_depth)) if layers is None else sorted({int(i) % reference_depth for i in layers})
    wanted = [matched_layers(reference, reference_depth, len(attention_sites(model))) for model in models]
    # each model views the pictures themselves (a view of the shown view would crop twice where a model crops)
    inputs = [model_inputs(model, originals, dataset, mean, std) for model in models]
    text = static_bytes(title)
    check_page_size(models, [sorted(set(w)) for w in wanted], [int(x.shape[-1]) for x in inputs], len(pictures),
                    heads, rows, max_bytes, fixed=sum(map(len, picture_urls(pictures))) + text)
    records: list[ModelRecord] = []
    for model, label, layers_wanted, model_input_ in zip(models, labels, wanted, inputs, strict=True):
        record = record_model(model, model_input_, label, layers=sorted(set(layers_wanted)), heads=heads,
                              threshold=threshold, detect_layer=detect_layer, batch_size=batch_size, device=device,
                              rows=rows)
        by_index = {layer.index: layer for layer in record.layers}
        record.layers = [by_index[i] for i in layers_wanted]  # aligned with the reference's layers
        records.append(record)
    meta, blobs = build_payload(records, pictures, captions=captions, title=title, max_bytes=max_bytes,
                                text_bytes=text)
    return Explorer(render_page(meta, blobs), meta)


__all__ = ["Explorer", "explore", "model_inputs"]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
