"""The registers study's verdicts on constructed rows: results planted to follow every claim of seed 004 read
'reproduced' for every judged claim, each family judged by its own direction; the rules around them (R1's
families, R6/R7's precondition, the held-out minimum, per-layer modes) against known answers."""

import numpy as np
import pytest

from vitscope.claims import claims_of
from vitscope.studies.registers.measured import family, register_pairs
from vitscope.studies.registers.verdicts import MIN_HELD_OUT, artifact_layers, judge_claims

RNG = np.random.default_rng(0)
IMAGES = 40  # images whose held-out tokens the group rows hold
HELD = 400  # held-out images of the CLS classifiers


def model(label, spec, parameters, *, weights=None, kind="plain", cls_name="VisionTransformer", registers=0,
          training=None, images=2 * HELD):
    return {"label": label, "entry": {"spec": spec, "weights": weights, "options": {}}, "planted": None,
            "training": training, "parameters": parameters, "num_images": images,
            "tokens": {"family": cls_name, "kind": kind, "registers": list(range(1, registers + 1))}}


def unit_row(label, layer, group, metric, per_image):
    """A row whose per-image outcomes are ``per_image`` (one list of per-token values per image)."""
    sums, counts = [float(np.sum(v)) for v in per_image], [len(v) for v in per_image]
    return {"model": label, "layer": layer, "layer_kind": "token", "group": group, "metric": metric,
            "value": sum(sums) / sum(counts), "n": sum(counts),
            "units": {"images": list(range(len(per_image))), "sums": sums, "counts": counts}}


def mode_rows(label, layers, modes, share=0.02, patches=256):
    """separate_mode rows for token layers 1..layers, a mode of ``share`` at each layer in ``modes``."""
    rows = []
    for layer in range(1, layers + 1):
        row = {"model": label, "layer": layer, "layer_kind": "token", "group": "patch", "metric": "separate_mode",
               "value": float(layer in modes), "n": 2 * HELD * patches, "mode_fraction": share if layer in modes
               else 0.0}
        if layer in modes:
            inside = RNG.binomial(patches, share, 2 * HELD).astype(float)
            row["units"] = {"images": list(range(2 * HELD)), "sums": inside.tolist(), "counts": [patches] * 2 * HELD}
        rows.append(row)
    return rows


def groups(label, layer, metric, high, normal, spread=0.05, tokens=4):
    """high-norm and normal rows at ``layer`` with per-token values around ``high`` and ``normal``."""
    def draw(mean):
        return [list(mean + spread * RNG.standard_normal(tokens)) for _ in range(IMAGES)]

    return [unit_row(label, layer, "high-norm", metric, draw(high)),
            unit_row(label, layer, "normal", metric, draw(normal))]


def classifiers(label, layer, flips=2, top1=0.8, groups=("cls (high-norm images)", "cls+high-norm")):
    """Two per-image classifiers that agree on every held-out image but ``flips`` of them (one each way)."""
    alone = (RNG.random(HELD) < top1).astype(float)
    other = alone.copy()
    other[:flips] = 1.0 - other[:flips]
    other[:flips // 2] = 1.0
    other[flips // 2: flips] = 0.0
    alone[:flips // 2] = 0.0
    alone[flips // 2: flips] = 1.0
    out = []
    for group, values in zip(groups, (alone, other), strict=True):
        row = unit_row(label, layer, group, "image_top1", [[v] for v in values])
        row["units"]["images"] = list(range(HELD, 2 * HELD))
        out.append(row)
    return out


def planted_study():
    """Models and rows that follow every claim of seed 004."""
    models = [model("vit-l", "timm:vit_large_patch16_224", 304_000_000, weights="vit_l.safetensors"),
              model("vit-s", "timm:vit_small_patch16_224", 22_000_000, weights="vit_s.safetensors"),
              model("dino-s16", "timm:vit_small_patch16_224", 22_000_000,
                    weights="w/vit_small_patch16_224.dino.safetensors"),
              model("dino-b16", "timm:vit_base_patch16_224.dino", 86_000_000),
              model("swin-t", "timm:swin_tiny_patch4_window7_224", 28_000_000, weights="swin.safetensors",
                    kind="hierarchical", cls_name="SwinTransformer"),
              model("pvt", "timm:pvt_v2_b2", 25_000_000, weights="pvt.safetensors", kind="hierarchical",
                    cls_name="PyramidVisionTransformerV2"),
              model("dinov2-l14", "timm:vit_large_patch14_dinov2", 304_000_000, weights="d.safetensors"),
              model("dinov2-l14-reg4", "timm:vit_large_patch14_reg4_dinov2", 304_000_000, weights="r.safetensors",
                    registers=4)]
    rows = []
    for label in ("vit-l", "vit-s"):  # plain ViTs: background, no local texture, the image class, nothing beyond CLS
        rows += mode_rows(label, 12, {10, 11, 12})
        rows += groups(label, 12, "patch_local_variance", 0.002, 0.02, spread=0.002, tokens=30)
        rows += groups(label, 12, "pixels_mse", 0.9, 0.4) + groups(label, 12, "class_top1", 0.7, 0.3, spread=0.3)
        rows += classifiers(label, 12)
    for label in ("dino-s16", "dino-b16"):
        rows += mode_rows(label, 12, set())
    rows += mode_rows("swin-t", 12, {12}) + groups("swin-t", 12, "pixels_mse", 0.3, 0.6) \
        + groups("swin-t", 12, "position_top1", 0.2, 0.6, spread=0.3)  # Swin: texture high, position quiet
    rows += mode_rows("pvt", 12, {12}) + groups("pvt", 12, "position_top1", 0.7, 0.3, spread=0.3) \
        + groups("pvt", 12, "pixels_mse", 0.8, 0.5)  # PVT: position known, shape poor
    rows += mode_rows("dinov2-l14", 24, {20, 24}, share=0.03) + mode_rows("dinov2-l14-reg4", 24, set())
    without, with_ = classifiers("dinov2-l14", 24, groups=("cls", "cls"))  # the same answers but on 2 images
    rows += [without, dict(with_, model="dinov2-l14-reg4")]
    return models, rows


def test_results_that_follow_every_claim_reproduce_every_judged_claim():
    models, rows = planted_study()
    found = judge_claims(rows, models, "planted rows")
    assert [j.claim_id for j in found] == [c.id for c in claims_of("registers")]  # each claim once, in order
    for j in found:
        if j.claim_id == "R10":
            assert j.verdict == "not judged"
        else:
            assert j.verdict == "reproduced", (j.claim_id, j.reason, j.scope)
            assert j.scope and "planted rows" in j.scope
    by_id = {j.claim_id: j for j in found}
    assert by_id["R1"].details["models"] == {"vit-s": True, "dino-s16": False, "dino-b16": False, "swin-t": True,
                                            "pvt": True}
    assert set(by_id["R2"].details["models"]) == {"dino-s16", "dino-b16"}
    assert by_id["R3"].family == "plain" and set(by_id["R3"].details["models"]) == {"vit-l", "vit-s"}
    assert by_id["R3"].unit == "images" and by_id["R3"].difference < 0
    assert by_id["R4-texture"].family == "swin" and by_id["R4-texture"].difference < 0
    assert by_id["R5-shape"].family == "pvt" and by_id["R5-shape"].difference > 0
    assert by_id["R6"].a == "dinov2-l14-reg4" and by_id["R6"].b == "dinov2-l14" and by_id["R6"].unit == "images"
    assert by_id["R7"].kind == "equivalence" and "within the equivalence margin" in by_id["R7"].size
    # two models' held-out images, paired, each image one cluster across both models
    assert by_id["R9"].kind == "equivalence" and by_id["R9"].n_a == HELD


def test_no_family_gets_another_familys_direction():
    """A Swin whose high-norm tokens carry texture as the paper says reproduces R4; the same rows under a plain ViT
    (whose high-norm tokens the seed says cannot rebuild their patch) fail R8-local, and never count for R4."""
    models, rows = planted_study()
    swin_as_plain = [dict(m, tokens={**m["tokens"], "family": "VisionTransformer", "kind": "plain"})
                     if m["label"] == "swin-t" else m for m in models]
    only = [m for m in swin_as_plain if m["label"] == "swin-t"]
    by_id = {j.claim_id: j for j in judge_claims(rows, only)}
    assert by_id["R8-local"].verdict == "not reproduced"  # lower pixel error on high-norm tokens: a plain ViT fails
    assert by_id["R4-texture"].verdict == "not testable" and "no Swin model" in by_id["R4-texture"].reason


def test_absence_needs_pretrained_models_and_r1_several_families():
    models, rows = planted_study()
    clean = [m for m in models if m["label"] in ("dino-s16",)]
    one = {j.claim_id: j for j in judge_claims(rows, clean)}["R1"]
    assert one.verdict == "inconclusive" and "(here: dino)" in one.reason  # one clean family refutes nothing
    rows += mode_rows("vit-b", 12, set())
    two = clean + [model("vit-b", "timm:vit_base_patch16_224", 86_000_000, weights="b.safetensors")]
    assert {j.claim_id: j for j in judge_claims(rows, two)}["R1"].verdict == "not reproduced"
    large = [model("big", "timm:vit_large_patch16_224", 304_000_000, weights="l.safetensors")]
    rows += mode_rows("big", 24, {20})
    assert {j.claim_id: j for j in judge_claims(rows, large)}["R1"].verdict == "not testable"  # no small model


def test_runs_trained_here_count_when_they_grow_a_mode_not_when_they_do_not():
    dino = {"objective": "dino", "registers": 0, "seed": 0, "knn_top1": 0.3}
    runs = [model("dino-reg0", "runs/dino-reg0", 5_000_000, training=dino),
            model("reg0", "runs/reg0", 5_000_000, training=dict(dino, objective="supervised"))]
    rows = mode_rows("dino-reg0", 4, set()) + mode_rows("reg0", 4, set())
    by_id = {j.claim_id: j for j in judge_claims(rows, runs)}
    assert by_id["R2"].verdict == "inconclusive" and "models trained here" in by_id["R2"].reason
    assert by_id["R1"].verdict == "inconclusive"
    grown = mode_rows("dino-reg0", 4, {4}) + mode_rows("reg0", 4, {3})
    by_id = {j.claim_id: j for j in judge_claims(grown, runs)}
    assert by_id["R2"].verdict == "not reproduced" and by_id["R1"].verdict == "reproduced"


def test_planted_and_random_models_are_never_evidence():
    models, rows = planted_study()
    fake = [dict(m, planted={"layer": 1}) if m["label"] == "vit-s" else m for m in models]
    assert "vit-s" not in {j.claim_id: j for j in judge_claims(rows, fake)}["R1"].details["models"]
    random = [dict(m, entry={"spec": "vit-micro", "weights": None, "options": {}}) if m["label"] == "vit-s" else m
              for m in models]
    assert "vit-s" not in {j.claim_id: j for j in judge_claims(rows, random)}["R1"].details["models"]


def test_registers_need_a_model_that_had_artifacts():
    models, rows = planted_study()
    clean = [r for r in rows if not (r["model"] == "dinov2-l14" and r["metric"] == "separate_mode")]
    clean += mode_rows("dinov2-l14", 24, set())
    by_id = {j.claim_id: j for j in judge_claims(clean, models)}
    for cid in ("R6", "R7"):
        assert by_id[cid].verdict == "not testable" and "no artifacts for registers to remove" in by_id[cid].reason


def test_trained_pairs_are_judged_per_seed():
    def run(label, registers, seed, top1, fraction):
        m = model(label, f"runs/{label}", 5_000_000, registers=registers,
                  training={"objective": "supervised", "registers": registers, "seed": seed, "top1": top1})
        return m, mode_rows(label, 4, {4} if fraction else set(), share=fraction)

    jitter = {(0, 0): 0.001, (0, 1): -0.001, (0, 2): 0.0, (0, 3): 0.0005}
    built = [run(f"reg{r}-seed{s}", r, s, 0.60 + 0.003 * s + 0.001 * r + jitter.get((r, s), 0.0),
                 0.03 + 0.002 * s if r == 0 else 0.0) for r in (0, 4) for s in range(4)]
    models, rows = [m for m, _ in built], [r for _, rs in built for r in rs]
    (pair,) = register_pairs(models)
    assert pair.kind == "trained" and pair.seeds == [0, 1, 2, 3]
    by_id = {j.claim_id: j for j in judge_claims(rows, models)}
    assert by_id["R6"].verdict == "reproduced" and by_id["R6"].n_a == 4 and by_id["R6"].unit == "seeds"
    assert by_id["R7"].verdict == "reproduced" and by_id["R7"].difference == pytest.approx(0.004 - 0.000125)


def test_small_groups_and_unprobed_layers_are_not_evidence():
    models, rows = planted_study()
    few = [dict(r, n=MIN_HELD_OUT - 1) if r["metric"] == "pixels_mse" and r["model"] == "swin-t" else r for r in rows]
    j = {j.claim_id: j for j in judge_claims(few, models)}["R4-texture"]
    assert j.verdict == "not testable" and f"needs {MIN_HELD_OUT} or more" in j.reason
    moved = [dict(r, layer=11) if r["metric"] == "separate_mode" and r["model"] == "pvt" else r for r in rows
             if not (r["metric"] == "separate_mode" and r["model"] == "pvt" and r["layer"] == 11)]
    j = {j.claim_id: j for j in judge_claims(moved, models)}["R5-position"]
    assert j.verdict == "not testable" and "at its mode layers [11]" in j.reason  # the mode is where nothing was probed


def test_artifact_layers_read_each_layers_own_test():
    """A layer is an artifact layer only where its own norms have a separate mode: no threshold carried from the
    detection layer (issue 46 item 7), and a model with no mode anywhere has none."""
    rows = mode_rows("m", 6, {3, 5}) + [{"model": "m", "layer": 4, "layer_kind": "token", "group": "patch",
                                         "metric": "high_norm_fraction", "threshold": "auto", "value": 0.4, "n": 10}]
    assert artifact_layers(rows, "m") == [3, 5]
    assert artifact_layers(mode_rows("flat", 6, set()), "flat") == []


def test_families_and_pairs():
    models, _ = planted_study()
    assert {m["label"]: family(m) for m in models} == {
        "vit-l": "plain", "vit-s": "plain", "dino-s16": "dino", "dino-b16": "dino", "swin-t": "swin", "pvt": "pvt",
        "dinov2-l14": "plain", "dinov2-l14-reg4": "plain"}
    (pair,) = register_pairs(models)
    assert (pair.without, pair.with_, pair.kind) == (["dinov2-l14"], ["dinov2-l14-reg4"], "given")
    other_size = [dict(m, entry={**m["entry"], "options": {"img_size": 518}}) if m["label"] == "dinov2-l14-reg4"
                  else m for m in models]
    assert register_pairs(other_size) == []  # another input size is another measurement, not a pair


def test_the_interval_resamples_images_not_tokens():
    """Whole images right or wrong: the family's interval is wider than one that treats tokens as independent."""
    models, rows = planted_study()
    rows = [r for r in rows if not (r["metric"] == "class_top1" and r["model"] in ("vit-l", "vit-s"))]
    per_image = [[1.0] * 4 if RNG.random() < 0.9 else [0.0] * 4 for _ in range(IMAGES)]
    normal = [[1.0] * 4 if RNG.random() < 0.5 else [0.0] * 4 for _ in range(IMAGES)]
    rows += [unit_row("vit-s", 12, "high-norm", "class_top1", per_image),
             unit_row("vit-s", 12, "normal", "class_top1", normal)]
    j = {j.claim_id: j for j in judge_claims(rows, models)}["R8-global"]
    assert j.unit == "images" and j.n_a == IMAGES and "cluster-robust t over images" in j.method
    naive = 1.96 * np.sqrt(sum(np.var(np.ravel(g)) / (4 * IMAGES) for g in (per_image, normal)))
    assert (j.ci95_high - j.ci95_low) / 2 > 1.5 * naive


def test_the_real_vit_small_claims_are_current_and_read_only_what_the_summaries_allow(tmp_path):
    """docs/results/real-vit-small/claims.json is what benchmarks/real_vit_small_claims.py makes of the stored
    results; a layer whose largest norm reaches twice its median stops it (a mode cannot be ruled out there)."""
    import importlib.util
    import json
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("real_claims", root / "benchmarks" / "real_vit_small_claims.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = root / "docs" / "results" / "real-vit-small"
    shutil.copy(page / "results.json", tmp_path / "results.json")
    made = json.loads(script.main(tmp_path).read_text())
    assert made == json.loads((page / "claims.json").read_text())
    assert {c["claim_id"]: c["verdict"] for c in made} == {"R1": "inconclusive", "R3": "not testable",
                                                          "R8-local": "not testable", "R8-global": "not testable",
                                                          "R9": "not testable"}
    stored = json.loads((page / "results.json").read_text())
    stored["norms"]["cifar10"]["per_layer"][0]["patch_norm_max"] = 3 * stored["norms"]["cifar10"]["per_layer"][0][
        "patch_norm_p50"]
    (tmp_path / "results.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="cannot be ruled out"):
        script.main(tmp_path)
