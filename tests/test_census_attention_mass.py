"""The census's attention rows, streamed without keeping any map, equal what full maps give: the mass on high-norm
keys per head and query (``mass_on_high_norm``) averaged, for softmax (queries and keys, image by image), entmax-1.5
(probabilities batch by batch), registers and timm's attention."""

import pytest
import torch

from vitscope.analyze.inputs import model_batches
from vitscope.data import synthetic_scenes
from vitscope.metrics.high_norm import high_norm_mask, mass_on_high_norm
from vitscope.models import create, load
from vitscope.record import record_attention, record_tokens
from vitscope.studies.registers.census import CensusSettings, run_census


def first_images(model, data, count):
    return next(model_batches(model, data, count, "cpu"))[0]


def token_norms_of(model, data):
    """Token norms per token layer (0 = the input of block 1), over every image, as the census defines them."""
    embedded = []
    hook = model.blocks[0].register_forward_pre_hook(lambda _m, args: embedded.append(args[0].norm(dim=-1)))
    try:
        with torch.no_grad(), record_tokens(model, keep="norms") as rec:
            model(first_images(model, data, len(data)))
    finally:
        hook.remove()
    return [torch.cat(embedded)] + rec.norms


def reference_rows(model, data, norms, threshold, prefix, count):
    """Per attention layer (1-based): the CLS- and patch-query mass and the key share, from every layer's full maps
    (``record_attention(keep="maps")``) of the first ``count`` images; and the last layer's maps averaged over
    heads."""
    with torch.no_grad(), record_attention(model, keep="maps") as rec:
        model(first_images(model, data, count))
    out = {}
    for index, probs in enumerate(rec.maps):  # attention layer l reads token layer l - 1
        mass = mass_on_high_norm(probs.double(), high_norm_mask(norms[index][:count], threshold, prefix), prefix)
        out[index + 1] = {"cls-query": float(mass["cls"].mean()), "patch-query": float(mass["patch"].mean()),
                          "high-norm": float(mass["share"].mean())}
    return out, rec.maps[-1].double().mean(dim=1)


@pytest.mark.parametrize("spec", ["vit-micro", "vit-micro+entmax", "vit-micro+registers", "timm"])
def test_streamed_attention_rows_equal_the_full_maps(spec):
    torch.manual_seed(0)
    if spec == "timm":
        model = load("timm:vit_small_patch16_224", img_size=64).eval()
    else:
        options = {"vit-micro+entmax": {"attention": "entmax15"}, "vit-micro+registers": {"num_registers": 2}}
        model = create("vit-micro", **options.get(spec, {})).eval()
    data = synthetic_scenes("eval", num_images=12)
    settings = CensusSettings(thresholds=["percentile:90"], attention_images=5, batch_size=4)  # 5 images: 2 batches
    census = run_census(model, data, "m", settings, progress=False)
    prefix = census.tokens["num_prefix_tokens"]
    expected, last = reference_rows(model, data, token_norms_of(model, data), census.thresholds[0]["value"],
                                    prefix, 5)
    got = {(r["layer"], r["group"]): r["value"] for r in census.rows
           if r["metric"] in ("attention_mass_on_high_norm", "key_share")}
    assert {layer for layer, _ in got} == set(expected)
    for layer, groups in expected.items():
        for group, value in groups.items():
            if group != "cls-query" or prefix:
                assert got[(layer, group)] == pytest.approx(value, abs=1e-6), (layer, group)
    shown = census.tensors["cls_attention_last"]
    reference = last[:, 0] if prefix else last.mean(dim=1)
    assert torch.allclose(shown.double(), reference[: len(shown)], atol=1e-6)
