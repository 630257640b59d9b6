"""Token probes: what a single token carries, layer by layer (local: position, pixels; global: image class).

* **position**: logistic regression from a patch token to its patch index; top-1 and the mean distance (patch
  units) between the predicted and the true grid cell. Chance: the best constant guess over the group's held-out
  positions: the most frequent position (top-1), and the cell with the smallest mean distance to them (3.09
  patches on a uniform 8 x 8 grid, not a random guess's 4.14); no probe that beats it reads a mere prior.
* **pixels**: ridge regression from a patch token to its patch's normalised input pixels (3 p² values); MSE.
  Chance: predicting the mean training patch.
* **pixels-mlp**: the same target through a 2-layer MLP (``vitscope.probes.mlp``); MSE (chance as pixels).
* **class**: logistic regression from one token to the image's class; top-1. Chance: the majority class.

Groups: ``cls``, ``register<i>`` (one per register), ``patch-mean``, ``patch`` (any patch token) and any named
patch-token masks the caller gives (e.g. ``high-norm`` and ``normal`` tokens). Position and pixels are defined for
patch-token groups only. Images are split into fit and held-out halves (seeded, stratified by class, then
class-balanced); within a probe every group has the same number of tokens per split (the smallest group's, at most
``max_tokens``). Hyper-parameter sweeps on tokens hold out whole images, never single tokens.

Patch-group rows also carry ``units``: the held-out outcome per image (``images``, ``sums``, ``counts``: per-token
correctness, distance or squared error summed over each image's tokens), so that a comparison can resample images
(``vitscope.stats.compare`` with ``clusters``) rather than treat tokens of one image as independent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.analyze.inputs import model_batches
from vitscope.data import ImageDataset
from vitscope.metrics.locality import grid_distances
from vitscope.metrics.units import per_image
from vitscope.models.capture.sites import token_blocks
from vitscope.probes.baselines import best_constant_distance, majority_top1, mean_predictor_mse, random_twin
from vitscope.probes.features import LayerFeatures, depth_of, extract_features, parse_layers
from vitscope.probes.linear import fit_classifier, fit_regressor, stratified_split
from vitscope.probes.mlp import fit_mlp_regressor
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX, ProbeResult, row
from vitscope.probes.stage_features import extract_stage_features, is_hierarchical, stage_of_layers

PROBES = ("position", "pixels", "pixels-mlp", "class")
DEFAULT_PROBES = ("position", "pixels", "class")
PatchMask = Tensor | Mapping[int, Tensor | None]  # (N, patches) bool, or one per token layer (None: absent there)


@dataclass(frozen=True)
class TokenProbeSettings:
    """How ``probe_tokens`` probes: which ``probes``; at most ``max_tokens`` tokens per group and split;
    ``held_fraction`` of the images held out (``class_balanced``: the same count of every class on both sides);
    ``norm``: intermediate layers read after the final norm; ``baseline``: also a randomly initialised copy;
    ``label``: the model's name in the rows; ``fit_options`` go to ``fit_classifier`` (lrs, weight_decays, epochs,
    batch_size); the rest is how features are extracted (``batch_size``, ``device``, ``img_size``, ``cache``,
    ``progress``) and the ``seed`` of every split and fit."""

    probes: Sequence[str] = DEFAULT_PROBES
    max_tokens: int = 2048
    held_fraction: float = 0.5
    norm: bool = True
    baseline: bool = True
    label: str = "model"
    batch_size: int = 64
    device: torch.device | str = "cpu"
    img_size: int | None = None
    cache: Any = True
    seed: int = 0
    progress: bool = True
    fit_options: Mapping[str, Any] = field(default_factory=dict)
    class_balanced: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.probes) - set(PROBES)
        if unknown:
            raise ValueError(f"unknown token probes {sorted(unknown)}; use {', '.join(PROBES)}")


@dataclass(frozen=True)
class Score:
    """One probe outcome on one group: ``metric``, its ``value``, the held-out count ``n``, and for patch groups
    the per-image ``units`` that image-clustered comparisons resample (None otherwise)."""

    metric: str
    value: float
    n: int
    units: dict[str, list] | None = None


def patch_pixels(model: nn.Module, dataset: ImageDataset, grid: tuple[int, int], patch: int, batch_size: int,
                 img_size: int | None = None) -> Tensor:
    """The model's normalised input cut into patches: (N, rows * cols, 3 p²), row-major like the tokens."""
    out = []
    for images, _ in model_batches(model, dataset, batch_size, "cpu", img_size):
        b, c = images.shape[:2]
        cells = images[:, :, : grid[0] * patch, : grid[1] * patch].reshape(b, c, grid[0], patch, grid[1], patch)
        out.append(cells.permute(0, 2, 4, 1, 3, 5).reshape(b, grid[0] * grid[1], c * patch * patch))
    return torch.cat(out)


def _sample(mask: Tensor, images: Tensor, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``count`` (image, patch) pairs drawn without replacement from ``mask`` restricted to ``images``."""
    allowed = torch.zeros(len(mask), dtype=torch.bool)
    allowed[images] = True
    pairs = (mask & allowed[:, None]).nonzero()
    pick = pairs[torch.randperm(len(pairs), generator=generator)[:count]]
    return pick[:, 0], pick[:, 1]


def balanced(images: Tensor, labels: Tensor, seed: int) -> Tensor:
    """A seeded subset of ``images`` with the same count of every class present (the smallest class's)."""
    labels = labels[images]
    present = labels.unique()
    count = min(int((labels == c).sum()) for c in present)
    generator = torch.Generator().manual_seed(seed)
    keep = [images[labels == c][torch.randperm(int((labels == c).sum()), generator=generator)[:count]]
            for c in present]
    return torch.cat(keep).sort().values


def _layer_mask(mask: PatchMask, layer: int) -> Tensor | None:
    """The group's mask at ``layer``; None where a per-layer mapping says the group is absent at that layer."""
    if isinstance(mask, Mapping):
        if layer not in mask:
            raise ValueError(f"a per-layer patch mask has no entry for token layer {layer}; give one per layer "
                             "(None where the group is absent)")
        return None if mask[layer] is None else mask[layer].bool().cpu()
    return torch.as_tensor(mask).bool().cpu()


class _Prober:
    """Runs the probes of one model over its features; fit/held-out images and pixel targets are shared."""

    def __init__(self, labels: Tensor, pixels: Tensor | None, grid: tuple[int, int], fit: Tensor, held: Tensor,
                 settings: TokenProbeSettings):
        self.labels, self.pixels, self.grid, self.fit, self.held = labels, pixels, grid, fit, held
        self.max_tokens, self.probes, self.seed = settings.max_tokens, settings.probes, settings.seed
        self.device = settings.device
        self.options = {"seed": settings.seed, "device": settings.device, **settings.fit_options}
        self.distances = grid_distances(grid)

    def samples(self, masks: dict[str, Tensor]) -> dict[str, dict[str, tuple[Tensor, Tensor]]]:
        """Per patch group, per split, (image, patch) index pairs of the common size."""
        counts = [int((m[split]).sum()) for m in masks.values() for split in (self.fit, self.held)]
        size = min([self.max_tokens, *counts])
        generator = torch.Generator().manual_seed(self.seed)
        return {name: {"fit": _sample(m, self.fit, size, generator), "held": _sample(m, self.held, size, generator)}
                for name, m in masks.items()}

    def local(self, tokens: Tensor, picks: dict[str, tuple[Tensor, Tensor]]) -> list[Score]:
        """Position and pixel metrics of one patch group (with per-image units, but for the MLP's MSE)."""
        rows = []
        (fi, fp), (hi, hp) = picks["fit"], picks["held"]
        if len(fi) < 2 or len(hi) < 1:
            return rows
        x_fit, x_held = tokens[fi, fp].float(), tokens[hi, hp].float()
        if "position" in self.probes:
            clf = fit_classifier(x_fit, fp, self.distances.shape[0], groups=fi, **self.options)
            predicted = clf.predict(x_held).cpu()
            for metric, per_token in (("position_top1", (predicted == hp).double()),
                                      ("position_distance", self.distances[predicted, hp].double())):
                rows.append(Score(metric, float(per_token.mean()), len(hi), per_image(per_token, hi)))
        if "pixels" in self.probes and self.pixels is not None:
            reg = fit_regressor(x_fit, self.pixels[fi, fp], seed=self.seed, device=self.device, groups=fi)
            error = ((reg.predict(x_held).cpu().double() - self.pixels[hi, hp].double()) ** 2).mean(1)
            rows.append(Score("pixels_mse", float(error.mean()), len(hi), per_image(error, hi)))
        if "pixels-mlp" in self.probes and self.pixels is not None:
            mlp = fit_mlp_regressor(x_fit, self.pixels[fi, fp], seed=self.seed, device=self.device)
            rows.append(Score("pixels_mlp_mse", mlp.mse(x_held, self.pixels[hi, hp]), len(hi)))
        return rows

    def global_(self, x: Tensor, images: tuple[Tensor, Tensor]) -> list[Score]:
        """Image-class top-1 from one token per image: ``x`` (N, D); ``images`` the fit and held-out rows."""
        if "class" not in self.probes:
            return []
        fit, held = images
        num_classes = int(self.labels.max()) + 1
        clf = fit_classifier(x[fit].float(), self.labels[fit], num_classes, **self.options)
        return [Score("class_top1", clf.top1(x[held].float(), self.labels[held]), len(held))]

    def chance(self, picks: dict[str, tuple[Tensor, Tensor]] | None, images: tuple[Tensor, Tensor]) -> list[Score]:
        """The trivial predictors' scores: the best constant position, the mean patch, the majority class."""
        rows = []
        if picks is not None:
            (fi, fp), (hi, hp) = picks["fit"], picks["held"]
            if "position" in self.probes and len(hi) and len(fi):
                rows.append(Score("position_top1", majority_top1(hp, hp), len(hi)))  # the best constant guess
                rows.append(Score("position_distance", best_constant_distance(hp, hp, self.distances), len(hi)))
            if self.pixels is not None and len(hi) and len(fi):
                trivial = mean_predictor_mse(self.pixels[fi, fp], self.pixels[hi, hp])
                rows += [Score(f"{name.replace('-', '_')}_mse", trivial, len(hi)) for name in ("pixels", "pixels-mlp")
                         if name in self.probes]
        if "class" in self.probes:
            rows.append(Score("class_top1", majority_top1(self.labels[images[0]], self.labels[images[1]]),
                              len(images[1])))
        return rows


def probe_tokens(model: nn.Module, dataset: ImageDataset, layers: str | Sequence[int | str] = "0,last",
                 settings: TokenProbeSettings | None = None, *, patch_groups: Mapping[str, PatchMask] | None = None,
                 **options: Any) -> ProbeResult:
    """Probe single tokens of ``model`` on ``dataset`` at token ``layers`` (0 = embedding, l = block l).

    Hierarchical models (Swin, PVT-v2) are probed on each layer's own stage grid (position over that grid, pixels
    over the stage's stride, ``vitscope.probes.stage_features``); their rows carry ``stage``, and they have no CLS.

    ``patch_groups`` maps a group name to a patch mask (N, patches) over ``dataset`` (or one per layer), e.g.
    high-norm tokens and matched normal ones; the ``patch`` group (every patch token) is always probed.
    ``baseline`` adds the same probes on a randomly initialised copy; chance rows are always added.
    ``settings`` (``TokenProbeSettings``) say how; keyword ``options`` override its fields one by one
    (``probe_tokens(model, data, "0", probes=("position",), baseline=False)``).
    """
    names = {f.name for f in fields(TokenProbeSettings)}
    if set(options) - names:
        raise TypeError(f"probe_tokens got unknown options {sorted(set(options) - names)}; use {sorted(names)}")
    if options.get("fit_options") is None:
        options.pop("fit_options", None)
    settings = replace(settings or TokenProbeSettings(), **options)
    probes, held_fraction, norm = settings.probes, settings.held_fraction, settings.norm
    label, batch_size, device, img_size = settings.label, settings.batch_size, settings.device, settings.img_size
    seed, class_balanced, fit_options = settings.seed, settings.class_balanced, settings.fit_options
    hierarchical = is_hierarchical(model)
    wanted = parse_layers(layers, len(token_blocks(model)) if hierarchical else depth_of(model))
    extract = extract_stage_features if hierarchical else extract_features
    stages = stage_of_layers(model) if hierarchical else {}
    fit, held = stratified_split(dataset.labels, held_fraction, seed)
    if class_balanced:
        fit, held = balanced(fit, dataset.labels, seed), balanced(held, dataset.labels, seed + 1)
    not_measured = _one_class(dataset, fit, held, probes)
    if not_measured:
        probes = tuple(p for p in probes if p != "class")
        settings = replace(settings, probes=probes)
    models = [(label, model)] + ([(label + RANDOM_SUFFIX, random_twin(model, seed))] if settings.baseline else [])
    rows: list[dict[str, Any]] = []
    pixels: dict[tuple[tuple[int, int], int], Tensor | None] = {}  # (grid, patch) -> targets, shared by models
    for name, backbone in models:
        features = extract(backbone, dataset, wanted, norm=norm, batch_size=batch_size, device=device,
                           img_size=img_size, cache=settings.cache, progress=settings.progress)
        probers: dict[tuple[tuple[int, int], int], _Prober] = {}
        for layer in wanted:
            geometry = (features[layer].grid, features[layer].patch_size)  # one per stage in hierarchical models
            if geometry not in pixels:
                pixels[geometry] = patch_pixels(backbone, dataset, *geometry, batch_size, img_size) \
                    if {"pixels", "pixels-mlp"} & set(probes) else None
            if geometry not in probers:
                probers[geometry] = _Prober(dataset.labels, pixels[geometry], geometry[0], fit, held, settings)
            found = _probe_layer(probers[geometry], features[layer], name, patch_groups or {},
                                 include_chance=name == label)
            rows += [r | {"stage": stages[layer]} for r in found] if hierarchical else found
    described = {"model": label, "layers": wanted, "probes": list(probes), "max_tokens": settings.max_tokens,
                 "held_fraction": held_fraction, "class_balanced": class_balanced, "norm": norm, "seed": seed,
                 "fit_images": len(fit), "held_images": len(held), "fit_options": dict(fit_options),
                 "groups": sorted({r["group"] for r in rows})}
    if not_measured:
        described["not_measured"] = not_measured
    return ProbeResult("tokens", rows, described)


def _one_class(dataset: ImageDataset, fit: Tensor, held: Tensor, probes: Sequence[str]) -> dict[str, str]:
    """``{"class": why}`` when the class probe cannot tell a model from chance: the fitted or the held-out images
    hold one class, so the majority guess (and any probe, trained or random) scores 1.0. A ValueError naming the
    fix when ``class`` is the only probe asked for; {} when it can discriminate or was not asked for."""
    if "class" not in probes:
        return {}
    counts = {side: len(dataset.labels[images].unique()) for side, images in (("fit", fit), ("held-out", held))}
    if min(counts.values()) >= 2:
        return {}
    why = (f"the class probe needs images of two or more classes to fit and to hold out; {dataset.name!r} gives "
           f"{counts['fit']} and {counts['held-out']}, so every predictor, chance included, would score top-1 1.0")
    if set(probes) == {"class"}:
        raise ValueError(f"{why}; give a dataset with two or more class folders, or probe position,pixels")
    return {"class": why + "; not measured"}


def _probe_layer(prober: _Prober, features: LayerFeatures, name: str, patch_groups: Mapping[str, PatchMask],
                 include_chance: bool) -> list[dict[str, Any]]:
    layer, n_images, n_patches = features.layer, len(features.tokens), features.patches.shape[1]
    masks = {"patch": torch.ones(n_images, n_patches, dtype=torch.bool)}
    for group, mask in patch_groups.items():
        mask = _layer_mask(mask, layer)
        if mask is None:
            continue
        if tuple(mask.shape) != (n_images, n_patches):
            raise ValueError(f"patch mask {group!r} has shape {tuple(mask.shape)}; it must be (images, patches) = "
                             f"({n_images}, {n_patches}) for this dataset and model")
        masks[group] = mask
    # a group with no token on the fitting or the held-out side (a model without high-norm tokens) has nothing to fit
    # or score: it gets no rows, and does not shrink every group's common size (and the images) to 0
    masks = {group: mask for group, mask in masks.items()
             if int(mask[prober.fit].sum()) and int(mask[prober.held].sum())}
    picks = prober.samples(masks)
    images = _common_images(prober, picks)
    singles: dict[str, Tensor] = {}
    if features.has_cls:
        singles["cls"] = features.cls
    for r in range(features.num_registers):
        singles[f"register{r}"] = features.registers[:, r]
    singles["patch-mean"] = features.patch_mean()
    out = []

    def add(model: str, group: str, scores: list[Score]) -> None:
        for score in scores:
            out.append(row(model=model, layer=layer, layer_kind="token", group=group, metric=score.metric,
                           value=score.value, n=score.n) | ({"units": score.units} if score.units is not None else {}))

    for group, pick in picks.items():
        patch_images = (pick["fit"][0], pick["held"][0])
        x = features.patches
        local = prober.local(x, pick)
        tokens_per_image = (x[pick["fit"][0], pick["fit"][1]], x[pick["held"][0], pick["held"][1]])
        add(name, group, local + _class_on_tokens(prober, tokens_per_image, patch_images))
        if include_chance:
            add(CHANCE, group, prober.chance(pick, patch_images))
    for group, x in singles.items():
        add(name, group, prober.global_(x, images))
        if include_chance:
            add(CHANCE, group, prober.chance(None, images))
    return out


def _common_images(prober: _Prober, picks: dict[str, dict[str, tuple[Tensor, Tensor]]]) -> tuple[Tensor, Tensor]:
    """Fit and held-out images for one-token-per-image groups, as many as a patch group's tokens (or all)."""
    size = min(len(prober.fit), len(prober.held), *(len(p["held"][0]) for p in picks.values()))
    size = max(size, 2)
    generator = torch.Generator().manual_seed(prober.seed + 1)
    fit = prober.fit[torch.randperm(len(prober.fit), generator=generator)[:size]]
    held = prober.held[torch.randperm(len(prober.held), generator=generator)[:size]]
    return fit, held


def _class_on_tokens(prober: _Prober, tokens: tuple[Tensor, Tensor], images: tuple[Tensor, Tensor]
                     ) -> list[Score]:
    """Image class from single patch tokens of a group (``tokens`` fit/held (M, D); ``images`` their images)."""
    if "class" not in prober.probes or len(tokens[0]) < 2 or not len(tokens[1]):
        return []
    num_classes = int(prober.labels.max()) + 1
    clf = fit_classifier(tokens[0].float(), prober.labels[images[0]], num_classes, groups=images[0], **prober.options)
    correct = (clf.predict(tokens[1].float()).cpu() == prober.labels[images[1]]).double()
    return [Score("class_top1", float(correct.mean()), len(images[1]), per_image(correct, images[1]))]
