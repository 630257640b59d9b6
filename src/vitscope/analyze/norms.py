"""Token norms over a dataset and high-norm token detection, streamed (norms only, never the tokens).

A high-norm fraction alone is no finding: ``percentile:98`` marks 2 % of patch tokens in any model, and ``auto``
marks the tokens above the largest gap of the upper tail whether or not that gap is wide. Every result therefore
carries the registers study's test of a *separate* high-norm mode on the detection layer and on every layer, each
on its own norms (``vitscope.metrics.high_norm.separate_mode``), and ``threshold_meaning`` says what the threshold
marks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from vitscope.analyze.inputs import model_batches
from vitscope.atomic_io import write_csv, write_json
from vitscope.data import ImageDataset
from vitscope.metrics.high_norm import ModeCheck, separate_mode
from vitscope.metrics.norms import Threshold, high_norm_threshold, parse_threshold
from vitscope.models.capture.token_map import token_map
from vitscope.record import record_tokens

DEFINITIONS = {
    "norm": "L2 norm of a block's output token, before the final norm",
    "high-norm": "a patch token whose norm exceeds the threshold, set on the detection layer's patch tokens",
    "percentile:Q": "Q-th percentile of the patch-token norms of the data",
    "absolute:T": "fixed threshold T",
    "auto": "the split at the largest gap in the upper tail of the log norms (0.1-10 % of tokens above)",
    "separate mode": "that gap is empty over at least one interquartile range of the log norms, with 5 or more tokens "
                     "and at most 10 % above, at 2x the median patch norm or more (vitscope.metrics.high_norm; "
                     "vitscope's test, the seeds name none): high-norm tokens as a population of their own, not a "
                     "tail; tested on each layer's own norms",
}


def threshold_meaning(spec: str) -> str:
    """What a threshold spec marks, in words: a percentile marks its share by construction."""
    kind, value = parse_threshold(spec)
    if kind == "percentile":
        return (f"the {value:g}th percentile of the detection layer's patch-token norms, which marks "
                f"{100 - value:g}% of them by construction")
    if kind == "absolute":
        return f"a fixed norm of {value:g}"
    return ("the split at the largest gap in the upper tail of the detection layer's log patch-token norms, which "
            "marks some tokens whether or not the gap is wide")


@dataclass
class NormsResult:
    """Per block: token norms (images, tokens); the token map; the threshold and the detection layer."""

    norms: list[Tensor]
    names: list[str]
    tokens: dict[str, Any]
    threshold: Threshold
    detect_layer: int  # 0-based index into ``norms``
    mode: ModeCheck | None = None  # the separate-high-norm-mode test on the detection layer's patch tokens

    @property
    def prefix(self) -> int:
        return self.tokens.get("num_prefix_tokens", 0)

    def high_norm(self, layer: int | None = None) -> Tensor:
        """(images, patches) boolean map of high-norm patch tokens at ``layer`` (default: detection layer)."""
        layer = self.detect_layer if layer is None else layer
        return self.norms[layer][:, self.prefix :] > self.threshold.value

    def summary(self) -> list[dict[str, Any]]:
        rows = []
        cls, regs = self.tokens.get("cls", []), self.tokens.get("registers", [])
        for i, (name, norms) in enumerate(zip(self.names, self.norms, strict=True)):
            patches = norms[:, self.prefix :].flatten() if self.tokens["kind"] == "plain" else norms.flatten()
            rows.append({
                "layer": i + 1, "block": name, "patch_norm_mean": float(patches.mean()),
                "patch_norm_p50": float(patches.median()), "patch_norm_max": float(patches.max()),
                "high_norm_fraction": float((patches > self.threshold.value).float().mean()),
                "separate_mode": separate_mode(patches).separate,  # the layer's own split, not the threshold's
                "cls_norm_mean": float(norms[:, cls].mean()) if cls else None,
                "register_norm_mean": float(norms[:, regs].mean()) if regs else None,
            })
        return rows


@torch.no_grad()
def measure_norms(model: nn.Module, dataset: ImageDataset, *, threshold: str = "percentile:98",
                  detect_layer: int = -1, batch_size: int = 64, device: torch.device | str = "cpu",
                  img_size: int | None = None, progress: bool = True) -> NormsResult:
    """Record every block's token norms over ``dataset`` and set the high-norm threshold on the patch
    tokens of ``detect_layer``, a 0-based block index (-1, the default: the last block)."""
    parse_threshold(threshold)  # a bad spec fails before any image is processed
    model = model.to(device).eval()
    bar = tqdm(total=len(dataset), unit="img", desc="norms", disable=not progress, dynamic_ncols=True)
    with record_tokens(model, keep="norms") as rec:
        for images, _ in model_batches(model, dataset, batch_size, device, img_size):
            model(images)
            bar.update(len(images))
    bar.close()
    norms = [n.cpu() for n in rec.norms]
    tokens = token_map(model)
    if not -len(norms) <= detect_layer < len(norms):
        raise ValueError(f"detection layer {detect_layer + 1} (token layer numbering) is past this model's "
                         f"{len(norms)} blocks; use 1..{len(norms)} or 'last'")
    layer = detect_layer % len(norms)
    prefix = tokens.get("num_prefix_tokens", 0)
    patches = norms[layer][:, prefix:]
    return NormsResult(norms, rec.names, tokens, high_norm_threshold(patches, threshold), layer,
                       separate_mode(patches))


def write_norms(out: str | Path, result: NormsResult, provenance: dict[str, Any], max_maps: int = 16
                ) -> dict[str, Path]:
    """Write ``norms.json`` (threshold, per-layer summary, positions, per-image maps) and ``norms.csv``."""
    out = Path(out)
    summary = result.summary()
    payload: dict[str, Any] = {
        "schema_version": provenance["schema_version"], "tokens": result.tokens,
        "threshold": {"spec": result.threshold.spec, "value": result.threshold.value,
                      "detection_layer": result.detect_layer + 1, "meaning": threshold_meaning(result.threshold.spec)},
        "separate_mode": result.mode.as_dict() | {"description": result.mode.describe()} if result.mode else None,
        "layers": summary, "definitions": DEFINITIONS, "provenance": provenance,
    }
    if result.tokens["kind"] == "plain":
        grid = result.tokens["patches"]["grid"]
        high = result.high_norm()
        payload["high_norm_positions"] = high.sum(0).view(*grid).tolist()  # count per patch position
        payload["high_norm_maps"] = [m.view(*grid).int().tolist() for m in high[:max_maps]]
    return {"json": write_json(out / "norms.json", payload), "csv": write_csv(out / "norms.csv", summary)}
