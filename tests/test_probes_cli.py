"""`vitscope probe ...`: results in the shared schema, floors beside every number, one-line errors."""

import json

from vitscope.cli import main


def test_probe_knn_writes_the_shared_schema_with_floors(tmp_path, capsys):
    out = tmp_path / "knn"
    code = main(["probe", "knn", "--num-images", "16", "--train-images", "32", "--layers", "0,last", "--pool",
                 "mean", "--no-cache", "--out", str(out), "--device", "cpu"])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    assert set(payload) == {"schema_version", "kind", "settings", "rows", "provenance"}
    assert payload["kind"] == "knn" and payload["provenance"]["config"]["layers"] == "0,last"
    models = {r["model"] for r in payload["rows"]}
    assert models == {"vit-micro", "vit-micro (random init)", "chance"}
    assert {r["layer"] for r in payload["rows"]} == {0, 4}
    assert (out / "results.csv").read_text().startswith("model,layer,layer_kind,group,metric,value,n")
    assert (out / "knn_top1_by_layer.png").stat().st_size > 0
    # vit-micro has random weights: its "(random init)" row is a second draw, and the output says so
    assert "second, independent random draw" in payload["settings"]["random_weights"]
    assert "second, independent random draw" in capsys.readouterr().out


def test_bad_layer_is_one_line_and_exit_2(tmp_path, capsys):
    code = main(["probe", "tokens", "--layers", "0,9", "--num-images", "4", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "0..4" in err and "Traceback" not in err


def test_probe_depth_on_synthetic_scenes_writes_rows_with_and_without_cls(tmp_path):
    out = tmp_path / "depth"
    code = main(["probe", "depth", "--num-images", "4", "--train-images", "8", "--epochs", "1", "--layers", "last",
                 "--no-baseline", "--no-cache", "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {(r["model"], r.get("with_cls")) for r in rows if r["metric"] == "rmse"} == {
        ("vit-micro", False), ("vit-micro", True), ("chance", None)}


def test_results_of_a_run_folder_are_stored_there_and_reused_until_its_weights_change(tmp_path, capsys):
    import torch

    from vitscope.models import create, save_model

    run = tmp_path / "run"
    torch.manual_seed(0)
    model = create("vit-micro")
    save_model(model, run / "model.safetensors")
    argv = ["probe", "pib", "--model", str(run), "--num-images", "6", "--layers", "last", "--no-baseline",
            "--no-cache", "--out", str(tmp_path / "out")]
    assert main(argv) == 0 and "reused" not in capsys.readouterr().out
    stored = list((run / "probes").glob("pib-*.json"))
    assert len(stored) == 1
    assert main(argv) == 0 and "reused the stored result" in capsys.readouterr().out
    with torch.no_grad():
        model.blocks[0].mlp.fc1.weight.add_(1.0)
    save_model(model, run / "model.safetensors")  # a new checkpoint: a new key
    assert main(argv) == 0 and "reused" not in capsys.readouterr().out
    assert len(list((run / "probes").glob("pib-*.json"))) == 2


def test_a_random_models_twin_is_another_draw_from_the_same_initialisation():
    """The "(random init)" row of a random-weight model differs from the model's row because the twin is a second
    draw (different values) from the same initialisation (same spread per parameter), not a different scheme."""
    import torch

    from vitscope.models import create
    from vitscope.probes.baselines import random_twin

    torch.manual_seed(0)
    model = create("vit-micro")
    twin = random_twin(model, seed=0)
    drawn = [(name, a, b) for (name, a), (_, b) in zip(model.state_dict().items(), twin.state_dict().items(),
                                                       strict=True) if a.is_floating_point() and a.numel() > 64
             and float(a.std()) > 0]
    assert drawn and any(not torch.equal(a, b) for _, a, b in drawn)
    for name, a, b in drawn:
        assert 0.9 < float(b.std() / a.std()) < 1.1, name
