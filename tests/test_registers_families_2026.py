"""The registers study's 2026 families: DINOv3, EVA-02 and SigLIP2 rows with their thresholds, and the census on a
RoPE model with registers."""

import pytest
import torch

from vitscope.analyze.inputs import model_batches
from vitscope.data import synthetic_scenes
from vitscope.models import load
from vitscope.record import record_tokens
from vitscope.studies.models import ModelEntry
from vitscope.studies.registers.census import CensusSettings, run_census
from vitscope.studies.registers.presets import DARCET, PAPER_MODELS, PER_MODEL, paper_models


def test_paper_rows_for_the_new_families_with_their_thresholds(tmp_path):
    for name, _, _ in PAPER_MODELS.values():
        (tmp_path / f"{name.split('.')[0]}.safetensors").touch()
    entries = {e.label: e for e in paper_models(tmp_path)}
    want = {"dinov3-s16": "timm:vit_small_patch16_dinov3", "dinov3-b16": "timm:vit_base_patch16_dinov3",
            "eva02-s14": "timm:eva02_small_patch14_224", "siglip2-b16": "timm:vit_base_patch16_siglip_224"}
    for label, spec in want.items():
        assert entries[label].spec == spec and entries[label].thresholds == PER_MODEL
        assert "absolute:150" not in entries[label].thresholds  # DINOv2's scale, not theirs
    assert entries["dinov2-s14-reg4"].thresholds == DARCET
    again = ModelEntry(**entries["dinov3-s16"].to_dict())  # as a study's saved config reads back
    assert again == entries["dinov3-s16"]


def test_census_on_dinov3_counts_registers_as_prefix_tokens():
    torch.manual_seed(0)
    model = load("timm:vit_small_patch16_dinov3", img_size=64, depth=2, embed_dim=64, num_heads=2).eval()
    data = synthetic_scenes("eval", num_images=8)
    census = run_census(model, data, "dinov3", CensusSettings(thresholds=list(PER_MODEL), attention_images=4,
                                                              img_size=64), progress=False)
    assert census.tokens["cls"] == [0] and census.tokens["registers"] == [1, 2, 3, 4]
    assert census.tokens["patches"] == {"start": 5, "count": 16, "grid": [4, 4], "patch_size": 16}
    with torch.no_grad(), record_tokens(model, keep="norms") as rec:
        for images, _ in model_batches(model, data, 8, "cpu", 64):  # the census's own feeding
            model(images)
    patches = rec.norms[-1][:, 5:].double().flatten()  # the threshold is set on patch tokens only
    percentile = next(t for t in census.thresholds if t["spec"] == "percentile:98")
    assert percentile["value"] == pytest.approx(float(torch.quantile(patches, 0.98)), rel=1e-5)
    assert census.thresholds[0]["spec"] == "auto"  # the first, which forms the high-norm group
