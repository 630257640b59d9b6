"""Presets of the registers study: the demo's models and recipe, and the paper's list of timm models.

* ``demo``: vit-micro with 0 and 4 registers trained (supervised) on synthetic scenes (the recipe below), plus
  randomly initialised timm ViT, Swin and PVT-v2 at small sizes: these show the plumbing on each geometry, never
  evidence (random weights are no model of any paper);
* ``demo-dino``: the demo's registers comparison under both objectives: vit-micro with 0 and 4 registers,
  supervised and DINO (the shipped ``dino-demo`` recipe, shortened), same synthetic scenes and seeds; kept
  apart from ``demo`` so that the demo stays within its minutes;
* ``paper``: DeiT-III, DINO, DINOv2 (with and without registers), DINOv3 (S/16, B/16), EVA-02 (S/14), SigLIP2
  (B/16), OpenCLIP, Swin and PVT-v2 at small and large sizes (vitscope's choice, after Darcet et al.'s families:
  seed 004 names no model), each with its high-norm thresholds
  (``PAPER_MODELS``), each loaded from ``WEIGHTS_DIR/<timm name>.safetensors`` (or ``.pth`` / ``.bin``), which the
  user downloads (vitscope never does); images: ImageNet validation.
"""

from __future__ import annotations

from pathlib import Path

from vitscope.studies.models import ModelEntry

PRESETS = ("demo", "demo-dino", "paper", "none")
OBJECTIVES = ("supervised", "dino")
# Shipped DINO recipes by scale; the demo shortens its recipe (DEMO_DINO) to minutes on a CPU.
DINO_CONFIGS = {"demo": "dino-demo", "paper": "dino-compact"}
DEMO_DINO = {"epochs": 3, "objective_options": {"knn_every": 3, "knn_bank": 2048}}
DEMO_TRAINING = {"epochs": 6, "batch_size": 128, "lr": 2e-3, "min_lr": 1e-5, "warmup_epochs": 1,
                 "weight_decay": 0.05, "grad_clip": 1.0}
# vit-compact for the trained registers comparison at full scale (same optimisation as the locality study's)
PAPER_TRAINING = {"epochs": 200, "batch_size": 128, "lr": 1e-3, "min_lr": 1e-5, "warmup_epochs": 10,
                  "weight_decay": 0.05, "grad_clip": 1.0}

DEMO_MODELS = [
    ModelEntry("timm-vit-random", "timm:vit_tiny_patch16_224", options={"img_size": 64, "patch_size": 8,
                                                                        "depth": 4}),
    ModelEntry("timm-swin-random", "timm:swin_tiny_patch4_window7_224",
               options={"img_size": 112, "depths": (2, 2, 2, 2), "embed_dim": 48, "num_heads": (2, 4, 8, 16)}),
    ModelEntry("timm-pvt-v2-random", "timm:pvt_v2_b0", options={"img_size": 64}),  # any input size: measured at 64
]

# High-norm thresholds per model, the first one forming the high-norm group of every comparison: ``auto``, the split
# of the separate-mode test (vitscope.metrics.high_norm), so that where a model has a separate mode its group is
# that mode's tokens. ``percentile:98`` is vitscope's (the reassessment's threshold is not in its seed). Darcet et
# al.'s absolute 150 was set on DINOv2's norm scale; the families added for 2026 (DINOv3, EVA-02, SigLIP2) have other
# scales and no published absolute value, so they are measured with the largest gap and the percentile only.
DARCET = ("auto", "percentile:98", "absolute:150")
PER_MODEL = ("auto", "percentile:98")
# label -> (timm name, load options, thresholds); input 224 px (DINOv2's patch-14 models are resampled to 224)
PAPER_MODELS = {
    "deit3-s16": ("deit3_small_patch16_224", {}, DARCET),
    "deit3-l16": ("deit3_large_patch16_224", {}, DARCET),
    "dino-s16": ("vit_small_patch16_224.dino", {}, DARCET),
    "dino-b16": ("vit_base_patch16_224.dino", {}, DARCET),
    "dinov2-s14": ("vit_small_patch14_dinov2", {"img_size": 224}, DARCET),
    "dinov2-s14-reg4": ("vit_small_patch14_reg4_dinov2", {"img_size": 224}, DARCET),
    "dinov2-l14": ("vit_large_patch14_dinov2", {"img_size": 224}, DARCET),
    "dinov2-l14-reg4": ("vit_large_patch14_reg4_dinov2", {"img_size": 224}, DARCET),
    "dinov3-s16": ("vit_small_patch16_dinov3.lvd1689m", {"img_size": 224}, PER_MODEL),  # RoPE, 4 registers
    "dinov3-b16": ("vit_base_patch16_dinov3.lvd1689m", {"img_size": 224}, PER_MODEL),
    "eva02-s14": ("eva02_small_patch14_224.mim_in22k", {}, PER_MODEL),  # RoPE, SwiGLU
    "siglip2-b16": ("vit_base_patch16_siglip_224.v2_webli", {}, PER_MODEL),  # no CLS: MAP pooling
    "openclip-b16": ("vit_base_patch16_clip_224", {}, DARCET),
    "openclip-l14": ("vit_large_patch14_clip_224", {}, DARCET),
    "swin-t": ("swin_tiny_patch4_window7_224", {}, DARCET),
    "swin-b": ("swin_base_patch4_window7_224", {}, DARCET),
    "pvt-v2-b2": ("pvt_v2_b2", {}, DARCET),
    "pvt-v2-b5": ("pvt_v2_b5", {}, DARCET),
}

# The paper-scale command and our estimate of its cost (one forward pass per model; read by the report's opening)
PAPER_SCALE = ("vitscope study registers --preset paper --weights-dir WEIGHTS --dataset imagefolder "
               "--data-dir /data/imagenet-val --eval-images 5000 --out registers-paper",
               f"about 1 hour on one GPU (H200 or A100 class) for the census of the {len(PAPER_MODELS)} pretrained "
               "models on 5,000 images (an estimate)")
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".bin")


def _weights_file(folder: Path, name: str) -> Path | None:
    for stem in (name, name.split(".")[0]):
        for suffix in WEIGHT_SUFFIXES:
            if (folder / f"{stem}{suffix}").is_file():
                return folder / f"{stem}{suffix}"
    return None


def paper_models(weights_dir: str | Path | None) -> list[ModelEntry]:
    """The paper preset's models with their local weights; a missing file is an error naming every one."""
    if weights_dir is None:
        raise ValueError("the paper preset needs --weights-dir DIR holding <timm name>.safetensors for each of "
                         + ", ".join(name for name, _, _ in PAPER_MODELS.values()))
    folder = Path(weights_dir).expanduser()
    entries, missing = [], []
    for label, (name, options, thresholds) in PAPER_MODELS.items():
        found = _weights_file(folder, name)
        if found is None:
            missing.append(f"{name}.safetensors")
        else:
            entries.append(ModelEntry(label, f"timm:{name.split('.')[0]}", str(found), dict(options),
                                      thresholds=thresholds))
    if missing:
        raise ValueError(f"{folder} lacks the weights {', '.join(missing)}; download them from the timm hub "
                         "(model.safetensors of each timm/<name> repository, renamed) or use --model LABEL=SPEC@FILE")
    return entries


def condition_name(objective: str, registers: int) -> str:
    """A trained run's label without its seed: ``reg4`` (supervised) or ``dino-reg4``."""
    return f"reg{registers}" if objective == "supervised" else f"{objective}-reg{registers}"


def parse_condition(name: str) -> tuple[str, int]:
    """(objective, registers) of a label made by ``condition_name``."""
    objective, _, count = name.rpartition("reg")
    return (objective.removesuffix("-") or "supervised"), int(count)


def preset_models(preset: str, weights_dir: str | Path | None = None) -> list[ModelEntry]:
    """The models a preset brings besides those it trains."""
    if preset == "demo":
        return list(DEMO_MODELS)
    if preset == "paper":
        return paper_models(weights_dir)
    return []

# the demo's probe fits: one learning rate, no sweep, 60 epochs (the probes' default sweep is 9 fits of 100)
DEMO_PROBES = {"layers": "2,last", "max_tokens": 512, "probes": ["position", "pixels", "class"],
               "fit_options": {"lrs": (0.05,), "weight_decays": (0.0,), "epochs": 60}}
DEMO_PLANT = {"model": "reg0", "layer": 1, "count": 2, "scale": 20.0}
