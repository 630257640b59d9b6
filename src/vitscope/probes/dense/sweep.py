"""The dense heads' learning-rate and weight-decay sweep, as DINOv2's linear evaluation chooses them: every pair of
the grid is trained on the training split less a held-out part and scored there; each head keeps its best pair.

The held-out part is the last ``held_fraction`` of the training images in file order (for the frames of a video, a
contiguous stretch, so no near-duplicate of a held-out frame is fitted); the evaluation images are never used.
Every candidate of every head trains in one pass (``fit_heads`` with one (lr, weight decay) per head), on the
same batches and loss points. The score is mIoU for segmentation and the mean per-image RMSE for depth (lower is
better); ties keep the smaller learning rate, then the smaller weight decay.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from vitscope.probes.dense.evaluate import depth_values, segment_confusions
from vitscope.probes.dense.heads import fit_heads
from vitscope.probes.dense.intervals import miou_of
from vitscope.probes.dense.modules import DenseHead, HeadInputs

Pair = tuple[float, float]  # (learning rate, weight decay)


@dataclass
class SweepResult:
    """``chosen[(key, with_cls)]`` the pair each head keeps; ``scores`` one row per candidate (key, with_cls, lr,
    weight decay, held-out score); ``fit_images``/``held_images`` the split's sizes; ``metric`` the score."""

    chosen: dict[tuple[Hashable, bool], Pair]
    scores: list[dict[str, Any]] = field(default_factory=list)
    fit_images: int = 0
    held_images: int = 0
    metric: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "fit_images": self.fit_images, "held_images": self.held_images,
                "chosen": [{"key": _name(key), "with_cls": cls, "lr": lr, "weight_decay": wd}
                           for (key, cls), (lr, wd) in self.chosen.items()],
                "scores": self.scores}


def held_out_split(count: int, fraction: float) -> tuple[list[int], list[int]]:
    """(fit, held-out) image indices: the last ``fraction`` of ``count`` images held out (at least one each)."""
    if count < 2:
        raise ValueError(f"a learning-rate sweep needs at least 2 training images to hold some out; got {count} "
                         "(pass one learning rate and one weight decay)")
    held = min(count - 1, max(1, round(count * fraction)))
    return list(range(count - held)), list(range(count - held, count))


def subset(inputs: HeadInputs, index: Sequence[int]) -> HeadInputs:
    """The head inputs of images ``index``."""
    return HeadInputs(inputs.patches[list(index)], inputs.grid, None if inputs.cls is None else inputs.cls[list(index)])


def sweep(inputs: dict[Hashable, HeadInputs], targets: Sequence[Tensor], task: str, grid: Sequence[Pair], *,
          held_fraction: float, options: dict[str, Any], depth_options: dict[str, Any] | None = None,
          predict: Callable[[DenseHead, HeadInputs, Sequence[tuple[int, int]]], Any] | None = None) -> SweepResult:
    """Choose each head's pair (module docstring). ``inputs`` by key (e.g. (backbone, layer)) over every training
    image, ``targets`` theirs; ``options`` go to ``fit_heads`` (num_classes, ignore_index, with_cls, steps,
    batch_size, seed, loss points, ...); ``predict(head, inputs, sizes)`` yields depth maps (depth only);
    ``depth_options`` the depth scores' crop and range."""
    grid = [(float(lr), float(wd)) for lr, wd in grid]
    if len(grid) == 1:
        with_cls = options.get("with_cls", (False,))
        return SweepResult({(key, cls): grid[0] for key in inputs for cls in with_cls}, metric="none (one pair)")
    fit, held = held_out_split(len(targets), held_fraction)
    fitted = {key: subset(one, fit) for key, one in inputs.items()}
    # the candidates of one key share one HeadInputs: one standardiser, one read of each batch
    candidates = {(key, pair): fitted[key] for key in inputs for pair in grid}
    hyper = {((key, pair), cls): pair for key, pair in candidates for cls in options.get("with_cls", (False,))}
    heads = fit_heads(candidates, [targets[i] for i in fit], task, hyper=hyper, **options)
    held_targets = [targets[i] for i in held]
    num_classes, ignore_index = options.get("num_classes", 0), options.get("ignore_index")
    metric = "miou" if task == "segmentation" else "rmse"
    result = SweepResult({}, [], len(fit), len(held), f"held-out {metric}")
    for key, one in inputs.items():
        names = [name for name in heads if name[0][0] == key]
        scores = _held_scores([heads[n] for n in names], subset(one, held), held_targets, task, num_classes,
                              ignore_index, depth_options or {}, predict)
        best: dict[bool, tuple[float, Pair]] = {}
        for ((_, pair), cls), score in zip(names, scores, strict=True):
            result.scores.append({"key": _name(key), "with_cls": cls, "lr": pair[0], "weight_decay": pair[1],
                                  metric: score, "final_loss": heads[(key, pair), cls].fit_summary.final_loss})
            signed = score if task == "segmentation" else -score
            if cls not in best or signed > best[cls][0] or (signed == best[cls][0] and pair < best[cls][1]):
                best[cls] = (signed, pair)
        result.chosen.update({(key, cls): pair for cls, (_, pair) in best.items()})
    return result


def _held_scores(heads: list[DenseHead], inputs: HeadInputs, targets: list[Tensor], task: str, num_classes: int,
                 ignore_index: int | None, depth_options: dict[str, Any], predict: Any) -> list[float]:
    if task == "segmentation":
        return [float(miou_of(conf.sum(0))) for conf in segment_confusions(heads, inputs, targets, num_classes,
                                                                             ignore_index)]
    sizes = [tuple(t.shape[-2:]) for t in targets]
    values, _ = depth_values(heads, lambda head: predict(head, inputs, sizes), targets, **depth_options)
    return [float(row.nanmean()) for row in values["rmse"]]


def _name(key: Hashable) -> Any:
    """A key as JSON shows it: (backbone, layer) as a list."""
    return list(key) if isinstance(key, tuple) else key
