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
