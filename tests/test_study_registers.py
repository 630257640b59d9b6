"""The registers study end to end at test size: files, resume after a real kill, --model entries, the report in
headless Chromium, and the CLI's one-line errors."""

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

from vitscope.cli import main
from vitscope.data import eval_batches
from vitscope.models import load
from vitscope.record import record_tokens
from vitscope.report.registers.page import build_report
from vitscope.studies.models import ModelEntry
from vitscope.studies.registers.study import RegistersStudy, _eval_set, run
from vitscope.studies.registers.verdicts import artifact_layers

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SRC = Path(__file__).resolve().parents[1] / "src"
SMALL_DINO = {"out_dim": 256, "hidden_dim": 64, "bottleneck_dim": 32, "n_local": 2}
FAST_PROBES = {"layers": "last", "max_tokens": 64, "min_group": 4,
               "fit_options": {"lrs": (0.05,), "weight_decays": (0.0,), "epochs": 20}}


def tiny_study(out: Path, **changes) -> RegistersStudy:
    options = {"preset": "none", "registers": [0, 2], "objectives": ["supervised", "dino"],
               "objective_options": SMALL_DINO, "model": "vit-micro", "epochs": 1, "train_images": 128,
               "eval_images": 24,
               "batch_size": 64, "device": "cpu", "out": str(out), "progress": False, "probes": FAST_PROBES,
               "plant": {"model": "reg0", "layer": 1, "count": 2, "scale": 20.0},
               "census": {"thresholds": ["percentile:98", "auto"], "attention_images": 8, "example_images": 4},
               "models": [ModelEntry("timm-vit", "timm:vit_small_patch16_224",
                                     options={"img_size": 32, "patch_size": 4, "depth": 2, "embed_dim": 48,
                                              "num_heads": 2}),
                          ModelEntry("timm-swin", "timm:swin_tiny_patch4_window7_224",
                                     options={"img_size": 32, "depths": (1, 1), "embed_dim": 16,
                                              "num_heads": (1, 2)})]}
    return RegistersStudy(**{**options, **changes})


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("registers")
    payload = run(tiny_study(out))
    build_report(out)
    return out, payload


def test_results_follow_the_shared_schema(finished_study):
    out, payload = finished_study
    saved = json.loads((out / "results.json").read_text())
    assert set(saved) >= {"schema_version", "kind", "settings", "rows", "provenance", "claims"}
    assert saved["kind"] == "registers-study" and saved["provenance"]["dataset"] == "synthetic"
    assert saved["schema_version"] == 2 and saved["claims"] == [j.to_json() for j in payload.claims]
    ids = [c["claim_id"] for c in saved["claims"]]
    assert ids == ["R1", "R2", "R3", "R4-texture", "R4-position", "R5-position", "R5-shape", "R6", "R6", "R7", "R7",
                   "R8-local", "R8-global", "R9", "R10"]  # R6 and R7 once per register pair (supervised, DINO)
    modes = [r for r in saved["rows"] if r["metric"] == "separate_mode"]  # every token layer, each its own test
    assert {(r["model"], r["layer"]) for r in modes if r["model"] == "reg0"} == {("reg0", layer) for layer in range(5)}
    assert [m["label"] for m in saved["models"]] == ["reg0", "reg2", "dino-reg0", "dino-reg2", "timm-vit",
                                                     "timm-swin", "reg0+planted"]
    swin = [r for r in saved["rows"] if r["model"] == "timm-swin"]  # per stage, on the stage's own geometry
    assert {r["stage"] for r in swin if r["metric"] == "attention_mass_on_high_norm"} == {1, 2}
    assert {(r["layer"], r["stage"]) for r in swin if r["metric"] == "position_top1"} == {(1, 1), (2, 2)}
    top1 = {r["layer"]: r["value"] for r in saved["rows"] if r["model"] == "chance" and r["group"] == "patch"
            and r.get("chance_for") == "timm-swin" and r["metric"] == "position_top1"}
    distance = {r["layer"]: r["value"] for r in saved["rows"] if r["model"] == "chance" and r["group"] == "patch"
                and r.get("chance_for") == "timm-swin" and r["metric"] == "position_distance"}
    # the best constant guess on each stage's own 8x8 and 4x4 grid: at least 1/64 and 1/16 right, and no farther
    # than a uniform guess on that grid (4.14 and 2.01 cells)
    assert set(top1) == set(distance) == {1, 2} and top1[1] >= 1 / 64 and top1[2] >= 1 / 16
    assert distance[1] <= 4.1366 and distance[2] <= 2.0081
    for row in saved["rows"]:
        assert {"model", "group", "metric", "value", "n"} <= set(row)
        if row["metric"] == "high_norm_fraction":
            assert row["threshold"] in ("percentile:98", "auto") and row["threshold_value"] is not None
    # the registers are two tokens after CLS and never in the patch grid
    reg2 = next(m for m in saved["models"] if m["label"] == "reg2")
    assert reg2["tokens"]["registers"] == [1, 2] and reg2["tokens"]["patches"]["start"] == 3
    groups = {r["group"] for r in saved["rows"] if r["model"] == "reg2" and r["metric"] == "class_top1"}
    assert {"cls", "register0", "register1", "patch", "patch-mean"} <= groups
    assert any(r["model"] == "chance" for r in saved["rows"])
    top1 = [r for r in saved["rows"] if r["metric"] == "top1"]
    assert {r["model"] for r in top1} == {"reg0", "reg2", "reg0+planted"}
    knn = {r["model"]: r["value"] for r in saved["rows"] if r["metric"] == "knn_top1"}
    assert set(knn) >= {"dino-reg0", "dino-reg2"} and all(0 <= v <= 1 for v in knn.values())
    dino = {m["label"]: m["training"] for m in saved["models"] if m["label"].startswith("dino")}
    assert {t["objective"] for t in dino.values()} == {"dino"} and dino["dino-reg2"]["registers"] == 2
    assert dino["dino-reg2"]["config"]["dataset_options"] == reg2["training"]["config"]["dataset_options"]
    assert dino["dino-reg2"]["config"]["seed"] == reg2["training"]["config"]["seed"]  # same data and seeds


def test_dino_runs_keep_registers_out_of_the_patch_grid_and_thresholds(finished_study):
    out, payload = finished_study
    model = next(m for m in payload.models if m["label"] == "dino-reg2")
    assert model["tokens"]["registers"] == [1, 2] and model["tokens"]["patches"]["start"] == 3
    teacher = load(str(out / "runs" / "dino-reg2" / "seed-0")).eval()
    assert teacher.num_registers == 2
    study = tiny_study(out)
    data = _eval_set(study)
    with torch.no_grad(), record_tokens(teacher, keep="norms") as rec:
        for images, _ in eval_batches(data, 64):
            teacher(images)
    patches = rec.norms[-1][:, 3:]  # brute force: the last layer's patch tokens only
    expected = float(torch.quantile(patches.double().flatten(), 0.98))
    threshold = next(t for t in model["thresholds"] if t["spec"] == "percentile:98")
    assert threshold["value"] == pytest.approx(expected, rel=1e-5)
    fraction = [r for r in payload.rows if r["model"] == "dino-reg2" and r["metric"] == "high_norm_fraction"
                and r["threshold"] == "percentile:98" and r["layer"] == 4][0]
    assert fraction["n"] == len(data) * 64  # registers and CLS never counted as patches


def test_planted_model_shows_the_known_answer(finished_study):
    _, payload = finished_study
    assert artifact_layers(payload.rows, "reg0+planted")[0] == 2  # planted after block 2: from token layer 2 on
    assert all(artifact_layers(payload.rows, m) == [] for m in ("reg0", "timm-vit"))
    claims = {j.claim_id: j for j in payload.claims}
    # planted and random models are never evidence: the census holds the four vit-micros trained here, clean, which
    # show nothing about pretrained models; the families' comparisons have no model with a mode to compare
    assert claims["R1"].verdict == "inconclusive" and "reg0+planted" not in claims["R1"].details["models"]
    assert set(claims["R1"].details["models"]) == {"reg0", "reg2", "dino-reg0", "dino-reg2"}
    assert claims["R2"].verdict == "inconclusive"
    assert claims["R3"].verdict == "not testable" and "no high-norm tokens in the claim's sense" in claims["R3"].reason
    assert claims["R4-texture"].verdict == "not testable"  # timm-swin has random weights: no Swin model measured
    assert all(claims[c].verdict == "not testable" and "no artifacts for registers to remove" in claims[c].reason
               for c in ("R6", "R7"))


def test_report_prints_every_claim_with_its_verdict_family_and_scope(finished_study):
    out, payload = finished_study
    text = (out / "report.html").read_text()
    start = text.index("The reassessment's claims")
    section = text[start:text.index("<h2>", start)]
    assert section.count("<li>") == len(payload.claims), section.count("<li>")
    assert "R4-texture</b> [Swin]" in section and "R5-shape</b> [PVT]" in section
    assert "Holds for:</i> 4 models measured here on synthetic" in section
    assert "resamples images, never tokens" in section and "largest gap" in section
    assert "small models do not" not in text.lower() and "Published findings" not in text


def test_a_probe_group_under_the_minimum_is_not_shown_as_evidence(finished_study):
    """The planted model's high-norm groups hold few held-out tokens at this size: the report says 'too few'
    rather than print their top-1 (issue 46 item 21)."""
    out, payload = finished_study
    small = [r for r in payload.rows if r["model"] == "reg0+planted" and r["group"] == "high-norm"
             and r["metric"] == "position_top1"]
    assert small and all(r["n"] < 16 for r in small)
    text = (out / "report.html").read_text()
    planted = text[text.index("<h3>reg0+planted, token layer"):]
    assert f"too few ({small[0]['n']} &lt; 16)" in planted.split("</table>")[0]


def test_preset_none_trains_only_what_is_asked():
    """--preset none --model X trains nothing (issue 46 item 20); --registers trains what it names."""
    named = RegistersStudy(preset="none", models=[ModelEntry("x", "vit-micro")], progress=False)
    assert named.registers == [] and named.trained() == []
    asked = RegistersStudy(preset="none", registers=[0, 4], progress=False)
    assert [label for label, *_ in asked.trained()] == ["reg0", "reg4"]


def test_the_report_says_which_models_have_random_weights(finished_study):
    """The untagged timm architectures are random and the report says so, in its opening and titles; the same entry
    given a weights file or a pretrained tag is not called random (the rule is ``has_random_weights``)."""
    from vitscope.report.openings import registers_opening
    from vitscope.report.registers.page import _scale_note
    from vitscope.report.registers.tables import title
    from vitscope.studies.registers.results import RegistersResults

    out, payload = finished_study
    text = (out / "report.html").read_text()
    assert "timm-vit, timm-swin with random weights" in text
    assert "seeded initialisation): timm-vit, timm-swin;" in text and "Given with their weights" not in text
    assert "timm-vit (timm:vit_small_patch16_224, random weights)" in text
    assert {m["label"] for m in payload.models if "random weights" in title(m)} == {"timm-vit", "timm-swin"}
    results = json.loads((out / "results.json").read_text())
    for change in ({"weights": "vit.safetensors"}, {"spec": "timm:vit_small_patch16_224.augreg_in21k"}):
        for model in results["models"]:
            if model["label"] == "timm-vit":
                model["entry"] = {**model["entry"], **change}
        opening = registers_opening(results)
        assert "timm-vit with the weights given" in opening and "timm-swin with random weights" in opening
        assert "whether the given models have high-norm tokens in a separate mode" in opening
        note = _scale_note(RegistersResults.from_json(results))
        assert "Given with their weights: timm-vit." in note and "initialisation): timm-swin;" in note


def test_rerun_reuses_every_measurement(finished_study):
    out, _ = finished_study
    before = {p: p.stat().st_mtime_ns for p in out.glob("models/*/census.json")}
    run(tiny_study(out))
    assert {p: p.stat().st_mtime_ns for p in out.glob("models/*/census.json")} == before and len(before) == 7


def test_killed_dino_study_resumes_where_it_stopped(tmp_path):
    """DINO runs through the shared runner: kill the study while it trains, then finish it reusing what was done."""
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "vitscope.cli", "study", "registers", "--preset", "none", "--registers", "0,2",
               "--objectives", "dino", "--dino-config", "dino-demo", "--train-model", "vit-micro", "--epochs", "1",
               "--train-images", "128", "--eval-images", "24", "--no-probes", "--device", "cpu",
               "--thresholds", "auto", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = out / "runs" / "dino-reg0" / "seed-0" / "summary.json"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.exists(), "the study never finished its first DINO run"
    killed_early = not (out / "results.json").exists()
    stamp = first.stat().st_mtime_ns
    payload = run(RegistersStudy(preset="none", registers=[0, 2], objectives=["dino"], dino_config="dino-demo",
                                 model="vit-micro", epochs=1, train_images=128, eval_images=24,
                                 probes={"enabled": False}, census={"thresholds": ["auto"]}, device="cpu",
                                 out=str(out), progress=False))
    assert first.stat().st_mtime_ns == stamp  # the finished run was reused, not trained again
    assert [m["label"] for m in payload.models] == ["dino-reg0", "dino-reg2"]
    assert all(m["training"]["knn_top1"] is not None for m in payload.models)
    assert killed_early or pytest.skip("the study finished before the kill landed")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_report_renders_in_headless_chromium(finished_study, tmp_path):
    out, _ = finished_study
    report = out / "report.html"
    text = report.read_text()
    assert "src=\"http" not in text and "<script" not in text  # self-contained
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-background-networking", f"--user-data-dir={tmp_path / 'p'}",
                          "--virtual-time-budget=3000", "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-500:]
    page = dom.stdout
    for heading in ("claims (seed 004)", "Detector and probes on planted outliers", "Registers comparison",
                    "Token probes", "Attention maps with and without registers", "Terms, used once", "Provenance",
                    "per stage", "kNN top-1 (teacher)"):
        assert heading in page
    assert page.count("<img") >= 8 and "reg0+planted" in page and "not testable" in page
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'q'}", f"--screenshot={shot}", "--window-size=1200,4000",
                    report.as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000  # figures were decoded and painted


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "nolabel"], "LABEL=SPEC"),
    (["--registers", "0,four"], "--registers"),
    (["--objectives", "dino,byol"], "--objectives"),
    (["--plant", "reg0"], "LABEL:LAYER"),
    (["--thresholds", "median"], "percentile:Q"),
    (["--preset", "paper", "--dataset", "imagefolder", "--weights-dir", "/nonexistent"], "lacks the weights"),
    (["--preset", "paper"], "ImageNet validation"),
])
def test_cli_errors_are_one_line(argv, message, capsys, tmp_path):
    assert main(["study", "registers", "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def _one_model_study(out: Path, entry: ModelEntry) -> RegistersStudy:
    return RegistersStudy(preset="none", registers=[], models=[entry], eval_images=8, device="cpu", out=str(out),
                          progress=False, probes={"enabled": False}, census={"thresholds": ["auto"]})


def test_a_label_reused_for_another_model_is_measured_again(tmp_path):
    """The cache is keyed by what determines the measurement, not the label: vit-micro then vit-compact under one
    label gives vit-compact's census (its parameter count), not the earlier vit-micro one read back."""
    run(_one_model_study(tmp_path, ModelEntry("a", "vit-micro")))
    payload = run(_one_model_study(tmp_path, ModelEntry("a", "vit-compact")))
    compact = sum(p.numel() for p in load("vit-compact").parameters())
    assert payload.models[0]["entry"]["spec"] == "vit-compact" and payload.models[0]["parameters"] == compact


def test_other_weights_in_the_same_file_are_measured_again(tmp_path):
    from vitscope.models import save_model

    weights = tmp_path / "w.safetensors"
    torch.manual_seed(0)
    save_model(load("vit-micro"), weights)
    first = run(_one_model_study(tmp_path / "study", ModelEntry("a", str(weights))))
    torch.manual_seed(1)
    save_model(load("vit-micro"), weights)  # same path and label, other weights
    second = run(_one_model_study(tmp_path / "study", ModelEntry("a", str(weights))))
    norms = [[r["value"] for r in payload.rows if r["metric"] == "norm_mean"] for payload in (first, second)]
    assert norms[0] and norms[0] != norms[1]


def test_img_size_sets_every_given_models_input(tmp_path):
    # DINOv2's patch-14 models default to 518 px (37 x 37 patches); --img-size 56 must measure them on 4 x 4 patches
    out = tmp_path / "sized"
    argv = ["study", "registers", "--preset", "none", "--registers", "", "--model", "d=timm:vit_small_patch14_dinov2",
            "--img-size", "56", "--eval-images", "4", "--no-probes", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    record = json.loads((out / "models" / "d" / "census.json").read_text())
    assert record["entry"]["options"]["img_size"] == 56
    assert list(record["tokens"]["patches"]["grid"]) == [56 // 14, 56 // 14]
