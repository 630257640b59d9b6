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
