"""The sparse-attention study end to end at test size: files, report, a real kill and resume, --model."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vitscope.claims import claims_of
from vitscope.cli import main
from vitscope.data import ImageDataset
from vitscope.studies.runner import RunSpec
from vitscope.studies.sparse.results_file import SparseResults
from vitscope.studies.sparse.study import RECORD, SparseStudy, parse_condition, probe_sets, run, torchrun_command

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SRC = Path(__file__).resolve().parents[1] / "src"
TINY = {
    "preset": "demo", "epochs": 1, "conditions": ["softmax", "entmax15", "specialization"],
    "probe_train_images": 64, "probe_eval_images": 32, "device": "cpu",
    "progress": False,
    "training": {"dataset_options": {"num_images": 128}, "eval_images": 32, "batch_size": 64,
                 "objective_options": {"knn_bank": 128, "n_local": 2}},
    "models": [{"label": "given-micro", "spec": "vit-micro"}],
    "seg": {"synthetic": None}, "depth": {"synthetic": None},  # both dense paths (the demo itself: texture masks)
    "measure": {"layers": "0,last", "diffusion_tokens": 128, "random_baseline": False, "example_images": 2,
                "fit_options": {"lrs": [0.1], "weight_decays": [0.0], "epochs": 20}, "dense_layers": "0,last",
                "dense_epochs": 3, "dense_images": {"train": 32, "eval": 16}},
}


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    start = time.monotonic()
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the study exited ({process.returncode}) before {path} appeared")
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def killed_then_finished(tmp_path_factory):
    """A study SIGKILLed while training its second run, then run again to the end. Returns (out, mtimes of the
    first run's files before the kill)."""
    root = tmp_path_factory.mktemp("sparse")
    out = root / "study"
    settings = root / "settings.json"
    settings.write_text(json.dumps(TINY | {"out": str(out)}))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    code = ("import json, sys; from vitscope.studies.sparse.study import SparseStudy, run; "
            "run(SparseStudy(**json.load(open(sys.argv[1]))))")
    process = subprocess.Popen([sys.executable, "-c", code, str(settings)], env=env)
    try:
        first = RunSpec("softmax", 0).folder(out)
        second = RunSpec("entmax15", 0).folder(out)
        _wait_for(first / RECORD, process)
        _wait_for(second / "config.json", process)  # the second run has started training
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert not (out / "results.json").exists()
    before = {p.name: p.stat().st_mtime_ns for p in (first / RECORD, first / "model.safetensors")}
    run(SparseStudy(**TINY | {"out": str(out)}))
    return out, before


def test_resumes_after_a_kill_without_redoing_finished_runs(killed_then_finished):
    out, before = killed_then_finished
    first = RunSpec("softmax", 0).folder(out)
    assert {p.name: p.stat().st_mtime_ns for p in (first / RECORD, first / "model.safetensors")} == before
    for condition in ("softmax", "entmax15", "specialization", "given-micro"):
        assert (RunSpec(condition, 0).folder(out) / RECORD).is_file()
    summary = json.loads((RunSpec("entmax15", 0).folder(out) / "summary.json").read_text())
    assert summary["objective"] == "dino" and summary["epochs"] == 1


def test_results_files(killed_then_finished):
    out, _ = killed_then_finished
    payload = json.loads((out / "results.json").read_text())
    assert {"schema_version", "kind", "settings", "rows", "provenance", "claims", "differences"} <= set(payload)
    assert payload["kind"] == "sparse-study" and payload["schema_version"] == 2
    results = SparseResults.read(out)
    runs = {r["condition"]: r for r in results.runs}
    assert set(runs) == {"softmax", "entmax15", "specialization", "given-micro"}
    assert runs["entmax15"]["normaliser"] == "entmax15" and runs["softmax"]["normaliser"] == "softmax"
    assert runs["entmax15"]["source"]["trained"]["model_options"] == {"attention": "entmax15", "num_registers": 0}
    assert runs["specialization"]["source"]["trained"]["model_options"]["cls_specialization"] is True
    assert runs["specialization"]["parameters"] > runs["softmax"]["parameters"]  # the CLS path's own weights
    assert runs["given-micro"]["source"]["given"]["spec"] == "vit-micro"
    assert runs["entmax15"]["image"]["linear_protocol"] == "dino-last4"  # DINO's ViT-S protocol, every preset
    assert 0 <= runs["entmax15"]["image"]["linear_top1_last-cls"] <= 1  # the other protocol, the claim's reading
    rows = results.rows
    for condition in runs:
        metrics = {r["metric"] for r in rows if r["model"] == condition}
        assert {"linear_top1", "knn_top1", "diffusion_top1", "diffusion_cosine", "attention_zeros",
                "attention_support", "attention_mad", "attention_entropy"} <= metrics
        assert {r["layer"] for r in rows if r["model"] == condition and r["metric"] == "diffusion_cosine"} == {0, 4}
        assert len([r for r in rows if r["model"] == condition and r["metric"] == "attention_zeros"]) == 4 * 4
    for metric, group in (("miou", "seg:synthetic"), ("rmse", "depth:synthetic"), ("pib", "attention")):
        found = [r for r in rows if r["model"] == "entmax15" and r["metric"] == metric and r.get("group") == group]
        assert found, (metric, group)
    miou = {(r["layer"], r["with_cls"]) for r in rows if r["model"] == "entmax15" and r["metric"] == "miou"}
    assert miou == {(0, False), (0, True), (4, False), (4, True)}  # layer-wise, with and without CLS
    assert {r["layer"] for r in rows if r["model"] == "softmax" and r["metric"] == "pib"} == {1, 2, 3, 4}
    softmax_zeros = [r["value"] for r in rows if r["model"] == "softmax" and r["metric"] == "attention_zeros"]
    assert softmax_zeros == [0.0] * 16  # a softmax never gives an exact zero
    support = [r["value"] for r in rows if r["model"] == "softmax" and r["metric"] == "attention_support"]
    assert support == [64.0] * 16  # every one of the 8 x 8 patch keys
    table = list(csv.DictReader((out / "results.csv").open()))
    assert len(table) == len(rows)
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert {"model", "metric", "mean", "std", "seeds"} <= set(summary[0])
    # every registry claim of seed 001 once, in order; one seed per side is never a finding
    claims = {j.claim_id: j for j in results.claims}
    assert list(claims) == [c.id for c in claims_of("sparse")]
    for cid in ("S4", "S4-specialization", "S3", "S8-specialization"):
        assert claims[cid].verdict == "inconclusive" and "2" in claims[cid].reason, (cid, claims[cid].reason)
    # S11 is a property each run shows or not (a census): the one entmax run's zeros decide it
    zeros = claims["S11"].details["fractions"]
    assert claims["S11"].kind == "census" and len(zeros) == 1
    assert claims["S11"].verdict == ("reproduced" if min(zeros.values()) > 0 else "not reproduced")
    assert claims["S4-reg4"].verdict == "not testable" and "softmax+reg4" in claims["S4-reg4"].reason
    assert claims["S5"].verdict == "not testable" and "VOC" in claims["S5"].reason
    assert claims["S1"].verdict == "not judged" and "defines no measure" in claims["S1"].reason
    assert "vit-micro pretrained with DINO for 1 epoch on synthetic" in claims["S4"].scope
    # every other difference shown without a verdict (vitscope's own diffusion measures among them)
    shown = {(d.condition, d.measure) for d in results.differences}
    assert {("entmax15", "diffusion_cosine"), ("given-micro", "linear_top1"), ("specialization", "seg:synthetic"),
            ("entmax15", "depth:synthetic")} <= shown
    assert (RunSpec("entmax15", 0).folder(out) / "examples.safetensors").is_file()


def test_cli_model_label_spec_and_report(killed_then_finished, tmp_path, capsys):
    out, _ = killed_then_finished
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("features"))
    # the runs were trained with the test's settings, not the demo preset's: the CLI's defaults are refused, in one
    # line naming a changed setting, rather than reported as what was run
    code = main(["study", "sparse", "--conditions", "softmax,entmax15", "--model", "given-micro=vit-micro",
                 "--device", "cpu", "--out", str(copy)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "was started with" in err and "another --out" in err
    # the given model's record is present and of the same model, so the CLI reuses it and writes the report again
    code = main(["study", "sparse", "--conditions", "", "--model", "given-micro=vit-micro", "--device", "cpu",
                 "--out", str(copy)])
    assert code == 0
    assert "report:" in capsys.readouterr().out
    settings = json.loads((copy / "results.json").read_text())["settings"]
    assert [m["label"] for m in settings["models"]] == ["given-micro"]
    assert main(["study", "sparse", "--model", "no-equals-sign", "--out", str(tmp_path / "x")]) == 2
    assert "LABEL=SPEC" in capsys.readouterr().err


def test_given_models_with_random_weights_are_named_so(killed_then_finished):
    """The fixture's given preset (random weights) is labelled so in the figures' curves and in the opening; the
    same entry with a weights file is not (the rule is ``has_random_weights``)."""
    from vitscope.report.openings import sparse_opening
    from vitscope.report.sparse.page import _curves, shown_names

    out, _ = killed_then_finished
    results = json.loads((out / "results.json").read_text())
    assert shown_names(results) == {"given-micro": "given-micro (random weights)"}
    curves = _curves(results, "attention_mad", "attention", "heads")
    assert "given-micro (random weights)" in curves and "given-micro" not in curves and "softmax" in curves
    opening = sparse_opening(results)
    assert "beside the given models given-micro (random weights), differing only" in opening
    given = next(r for r in results["runs"] if r["condition"] == "given-micro")["source"]["given"]
    given["weights"] = "micro.safetensors"
    assert shown_names(results) == {} and "given-micro" in _curves(results, "attention_mad", "attention", "heads")
    assert "given-micro (the weights given)" in sparse_opening(results)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_report_renders_in_headless_chromium(killed_then_finished, tmp_path):
    from vitscope.report.sparse.page import build_report

    out, _ = killed_then_finished
    report = build_report(out)
    text = report.read_text()
    assert "src=\"http" not in text and "<script" not in text  # self-contained
    for heading in ("The paper's claims, judged", "Paper-style table", "Semantic diffusion per layer",
                    "Layer-wise segmentation mIoU",
                    "Attention sparsity per layer",
                    "PCA maps", "CLS attention per head", "Settings", "Provenance"):
        assert heading in text
    assert "69.50" in text and "70.06" in text and "paper: ImageNet-1k, DINO (v1) ViT-S/16" in text  # labelled
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,3000",
                    report.as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000  # figures were decoded and painted


def test_conditions_and_folders():
    assert parse_condition("entmax15") == ("entmax15", 0, False)
    assert parse_condition("entmax:1.3+reg4") == ("entmax:1.3", 4, False)
    assert parse_condition("softmax+reg16") == ("softmax", 16, False)
    assert RunSpec("entmax:1.3+reg4", 0).folder("o") == Path("o/runs/entmax_1.3+reg4/seed-0")
    with pytest.raises(ValueError, match="unknown attention normaliser"):
        parse_condition("relu+reg4")
    with pytest.raises(ValueError, match="preset"):
        SparseStudy(preset="huge")
    with pytest.raises(ValueError, match="unknown layout"):
        SparseStudy(seg={"pascal": "/data/voc"})
    demo = SparseStudy()  # the demo segments its own texture scenes; depth cannot discriminate there
    assert (demo.seg, demo.depth, demo.measure.pib) == ({"synthetic-texture": None}, {}, False)
    with pytest.raises(ValueError, match="unique"):
        SparseStudy(models=[{"label": "softmax", "spec": "vit-micro"}])
    study = SparseStudy(conditions=["sparsemax+reg4"])
    cfg = study.train_config("sparsemax+reg4", 3, "cpu")
    assert cfg.objective == "dino" and cfg.seed == 3
    assert cfg.model_options == {"attention": "sparsemax", "num_registers": 4}
    assert cfg.out.endswith("runs/sparsemax+reg4/seed-3")
    spec = SparseStudy(conditions=["specialization"]).train_config("specialization", 0, "cpu")
    assert spec.model_options == {"attention": "softmax", "num_registers": 0, "cls_specialization": True}
    assert SparseStudy(preset="paper").conditions == ["softmax", "entmax15", "softmax+reg4", "specialization"]
    assert SparseStudy(preset="compact").measure.linear_protocol == "dino-last4"
    with pytest.raises(ValueError, match="linear_protocol"):
        SparseStudy(measure={"linear_protocol": "last4"})


def test_gpus_per_run_trains_each_run_under_torchrun():
    command = torchrun_command(Path("runs/x/study-config.json"), 8)
    assert command[1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node=8" in command
    assert command[-5:] == ["-m", "vitscope.cli", "train", "--config", "runs/x/study-config.json"]
    launch = SparseStudy(gpus_per_run=8, launcher="slurm").launch()
    assert launch.slurm["gpus_per_node"] == 8 and launch.device == "cuda"


def test_report_prints_each_claim_with_its_size_scale_and_power(killed_then_finished):
    from vitscope.report.sparse.page import build_report

    out, _ = killed_then_finished
    text = build_report(out).read_text()
    section = text[text.index("The paper's claims, judged"):text.index("Paper-style table")]
    for cid in ("S1", "S4", "S4-reg4", "S9", "S11", "S12"):
        assert f"<b>{cid}</b>" in section, cid
    for label in ("measured", "why", "scale", "the paper"):
        assert f"<i>{label}</i>" in section
    assert "needs &gt;= 2 seeds per side" in section  # the test's one seed per side
    assert "not the paper&#x27;s setting: this run vit-micro" in section
    differences = text[text.index("Measured differences without a paper claim"):text.index("Semantic diffusion per")]
    assert "vitscope&#x27;s semantic diffusion (a)" in differences and "<th>95 % interval</th>" in differences


def test_a_timm_model_is_measured_at_img_size(tmp_path, monkeypatch):
    """A given timm model (no top-level grid_size, forward_features a tensor) measured at --img-size: its record
    holds its 2 x 2 grid at 32 px (224 px: 14 x 14), and its examples the last layer's patch tokens for the PCA
    maps, equal to the probes' reader."""
    from safetensors.torch import load_file, save_file

    import vitscope.cli.study.sparse as sparse_cli
    from vitscope.models import load
    from vitscope.probes.features import extract_features
    from vitscope.report.sparse.page import build_report

    seen = {}
    monkeypatch.setattr(sparse_cli, "run_sparse_study", lambda **options: seen.update(options) or tmp_path)
    assert main(["study", "sparse", "--conditions", "", "--model", "t=timm:vit_tiny_patch16_224", "--img-size", "32",
                 "--out", str(tmp_path / "cli")]) == 0
    assert [m.options for m in seen["models"]] == [{"img_size": 32}]  # the CLI hands the size to every --model
    out, weights = tmp_path / "study", tmp_path / "tiny.safetensors"
    model = load("timm:vit_tiny_patch16_224", img_size=32).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    settings = TINY | {"conditions": [], "models": [{"label": "t", "spec": "timm:vit_tiny_patch16_224",
                                                     "weights": str(weights), "options": {"img_size": 32}}],
                       "seg": {}, "depth": {}, "out": str(out)}
    run(SparseStudy(**settings))
    record = json.loads((RunSpec("t", 0).folder(out) / RECORD).read_text())
    assert record["grid_size"] == [2, 2] and record["num_prefix_tokens"] == 1
    examples = load_file(str(RunSpec("t", 0).folder(out) / "examples.safetensors"))
    _, eval_set = probe_sets(SparseStudy(**settings), None)
    count = len(examples["images"])
    first = ImageDataset(eval_set.name, eval_set.split, eval_set.images[:count], eval_set.labels[:count],
                         eval_set.classes, eval_set.mean, eval_set.std, eval_set.root)
    assert torch.equal(examples["images"], first.images)
    want = next(iter(extract_features(model, first, "last", cache=False, progress=False).values()))
    assert examples["patches_last"].shape == (count, 4, 192)
    torch.testing.assert_close(examples["patches_last"], want.patches.float(), atol=1e-4, rtol=1e-4)
    assert "PCA maps" in build_report(out).read_text() and (out / "figures" / "pca_maps.png").is_file()
