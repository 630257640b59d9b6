"""What model, data and sample a locality verdict holds for, beside the paper's (``Judgement.scope``)."""

from __future__ import annotations

import re

from vitscope.claims import Claim
from vitscope.studies.locality.records import LocalityRun

DATASETS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "tiny-imagenet": "Tiny-ImageNet",
            "synthetic": "synthetic scenes", "imagefolder": "an image folder"}
PAPER_MODEL = "vit-compact"  # vitscope's preset of the paper's compact ViT (depth 8, width 192, 8 heads)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def paper_datasets(claim: Claim) -> list[str]:
    """The datasets the paper measured ``claim`` on (the ablation claims: CIFAR-100 only)."""
    return list(dict.fromkeys(re.findall(r"CIFAR-100|CIFAR-10|Tiny-ImageNet", claim.paper.dataset)))


def scope(claim: Claim, runs: list[LocalityRun], dataset: str) -> str:
    """'vit-micro, 6 epochs, 2 seeds per condition, CIFAR-10, 10,000 training images (the paper: compact ViT,
    CIFAR-100, one seed)'; says where the run matches the paper's model and data, and that the seed states no
    schedule."""
    if not runs:
        return ""
    configs = [r.train_config for r in runs]
    models = sorted({str(c.get("model", "?")) for c in configs})
    epochs = sorted({int(c["epochs"]) for c in configs if c.get("epochs") is not None})
    per: dict[str, set[int]] = {}
    for r in runs:
        per.setdefault(r.condition, set()).add(r.seed)
    seeds = min(len(s) for s in per.values())
    images = {r.train_images or c.get("train_images") for r, c in zip(runs, configs, strict=True)} - {None}
    data = DATASETS.get(dataset, dataset)
    ours = ", ".join([" or ".join(models), *([" or ".join(_plural(e, "epoch") for e in epochs)] if epochs else []),
                      _plural(seeds, "seed") + " per condition",
                      data, *([f"{' or '.join(f'{n:,}' for n in sorted(images))} training images"] if images else [])])
    theirs = paper_datasets(claim)
    same_model, same_data = models == [PAPER_MODEL], data in theirs
    if same_model and same_data:
        paper = "the paper's model and data; the seed states no schedule, and the paper ran one seed"
    else:
        paper = f"the paper: compact ViT, {' / '.join(theirs) or claim.paper.dataset}, one seed"
    return f"{ours} ({paper})"
