"""The demos demonstrate: at least two seeds per condition, exact zeros from the sparse demo's entmax-1.5 model,
dense targets on the demo's scenes that a trained backbone reads better than its random twin, a report that says
what it leaves out and why, and an index with every study's verdicts."""

import importlib

import pytest
import torch

from vitscope.cli.demo import DEMOS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_every_demo_runs_at_least_two_seeds_per_condition_and_locality_packs(monkeypatch, tmp_path):
    requested = {}
    for name, demo in DEMOS.items():
        module_name, function = demo.runner.split(":")
        module = importlib.import_module(module_name)
        study = next(n for n in dir(module) if n.startswith("run_") and n.endswith("_study"))

        def record(name=name, **options):
            requested[name] = options
            return tmp_path / "report.html"

        monkeypatch.setattr(module, study, record)
        getattr(module, function)(tmp_path / name, "cpu", 7, None)
    assert set(requested) == set(DEMOS)
    for name, options in requested.items():
        assert len(options["seeds"]) >= 2 and options["seeds"][0] == 7, name
    assert requested["locality"]["pack"] not in (None, 1, "1")  # the supervised trainer packs its runs


@pytest.mark.parametrize("sharpen", [6.0])
def test_the_sparse_demos_entmax_model_gives_exact_zeros_where_softmax_gives_none(sharpen):
    """The demo preset's own models (entmax-1.5 and softmax, from its train configs), with the query and key
    weights scaled by ``sharpen`` (the larger logits that training brings, planted): the study's attention
    statistics count >= 20 % exact zeros in a layer of the entmax model and none for softmax."""
    from vitscope.data import load_dataset
    from vitscope.models import create
    from vitscope.studies.sparse.measure import attention_statistics
    from vitscope.studies.sparse.study import SparseStudy

    study = SparseStudy(preset="demo")
    scenes = load_dataset("synthetic", None, "eval", num_images=16, cue="texture")
    zeros = {}
    for condition in ("entmax15", "softmax"):
        cfg = study.train_config(condition, 0, "cpu")
        torch.manual_seed(0)
        model = create(cfg.model, **cfg.model_options)
        with torch.no_grad():
            for block in model.blocks:
                dim = block.attn.qkv.weight.shape[1]
                block.attn.qkv.weight[: 2 * dim] *= sharpen  # queries and keys
        stats = attention_statistics(model, scenes, 16, torch.device("cpu"), progress=False)
        zeros[condition] = torch.tensor(stats["zeros"]).mean(1)  # per layer, mean over heads
    assert float(zeros["entmax15"].max()) >= 0.2, zeros
    assert float(zeros["softmax"].max()) == 0.0


def test_a_trained_backbone_segments_the_demo_scenes_better_than_its_random_twin():
    """The demo's segmentation set (its texture scenes, background + 8 texture classes): a linear head on a
    backbone trained briefly on these scenes beats the same head on its random twin, which is at chance."""
    import tempfile

    from vitscope.data.dense_layouts import load_dense
    from vitscope.models import load
    from vitscope.probes.dense.probe import dense_probe
    from vitscope.probes.dense.settings import DenseProbeSettings
    from vitscope.train import TrainConfig, train

    with tempfile.TemporaryDirectory() as folder:
        cfg = TrainConfig(model="vit-micro", dataset="synthetic",
                          dataset_options={"num_images": 1024, "cue": "texture"}, eval_images=64, epochs=3,
                          batch_size=64, lr=5e-3, warmup_epochs=0.5, cutmix_alpha=0.0, device="cpu", out=folder,
                          progress=False)
        train(cfg)
        model = load(folder)
    sets = [load_dense("synthetic-texture", None, split, synthetic_images=n) for split, n in (("train", 128),
                                                                                              ("eval", 32))]
    # 300 steps at one learning rate, measured: mIoU 8.1 vs twin 5.1, chance 5.1 (8 epochs of 128 images, 64 steps
    # with the default sweep, left the twin at 6.4 and the trained backbone at 7.0)
    result = dense_probe(model, *sets, "last", DenseProbeSettings(with_cls=(False,), steps=300, lrs=(1e-2,),
                                                                  weight_decays=(1e-4,), progress=False, cache=False,
                                                                  label="trained"))
    miou = {r["model"]: r["value"] for r in result.rows if r["metric"] == "miou"}
    assert miou["trained"] > miou["trained (random init)"] + 1.0, miou
    assert miou["trained"] > miou["chance"] + 1.0, miou


def test_the_sparse_headline_states_zeros_per_layer_and_what_the_demo_leaves_out():
    from vitscope.report.sparse.page import left_out, zero_line

    runs = [{"condition": "softmax", "attention": {"zeros": [[0.0, 0.0], [0.0, 0.0]]}},
            {"condition": "entmax15", "attention": {"zeros": [[0.2, 0.4], [0.5, 0.7]]}},
            {"condition": "entmax15", "attention": {"zeros": [[0.4, 0.2], [0.5, 0.5]]}}]
    line = zero_line({"runs": runs})
    assert "<b>softmax</b> 0%, 0%" in line and "<b>entmax15</b> 30%, 55%" in line  # mean over heads and seeds
    demo = {"settings": {"preset": "demo"}, "summary": [{"group": "seg:synthetic-texture", "metric": "miou"}]}
    text = left_out(demo)
    assert "depth" in text and "Point-in-Box" in text and "chance 100 %" in text
    assert left_out({"settings": {"preset": "compact"}, "summary": []}) == ""


def test_the_registers_demo_with_two_seeds_plants_in_its_first_seeds_model():
    from vitscope.studies.registers.study import RegistersStudy

    study = RegistersStudy(preset="demo", seeds=[3, 4])
    labels = [m.label for m in study.all_models()]
    assert study.plant["model"] == "reg0-seed3" and {"reg0-seed3", "reg0-seed4", "reg4-seed4"} <= set(labels)
