"""The engine's seams: config values type-checked by key, per-epoch hooks, snapshots, objectives by name."""

from pathlib import Path

import pytest
import torch

from vitscope.models import create
from vitscope.train import TrainConfig, load_config, train
from vitscope.train.engine import flatten_scalars, hook_scalars, resolve_hook
from vitscope.train.logging import read_metrics


@pytest.mark.parametrize("key,value,expected", [
    ("epochs", "three", "integer"), ("lr", "fast", "number"), ("batch_size", [1, 2], "integer"),
    ("epochs", True, "integer"), ("deterministic", "yes", "boolean"), ("model_options", [1], "mapping"),
    ("epoch_hooks", ["ok", 3], "list of strings"), ("keep_every", 1.5, "integer or null"),
])
def test_a_mistyped_value_names_the_key_the_type_and_the_value(key, value, expected):
    with pytest.raises(ValueError) as err:
        TrainConfig.from_dict({key: value})
    message = str(err.value)
    assert f"config key {key}" in message and expected in message and repr(value) in message


def test_mistyped_values_from_a_file_and_from_set(tmp_path):
    (tmp_path / "c.yaml").write_text("epochs: three\n")
    with pytest.raises(ValueError, match="config key epochs: expected integer, got 'three'"):
        load_config(tmp_path / "c.yaml")
    with pytest.raises(ValueError, match="config key lr: expected number"):
        load_config(None, ["lr=fast"])
    assert load_config(None, ["lr=1", "keep_every=null"]).lr == 1  # an integer is a fine number


def test_epoch_hooks_log_scalars_and_snapshots_are_kept(tmp_path):
    seen = []

    def alphas(model):
        seen.append(type(model).__name__)
        return {"alpha": torch.tensor([1.5, 1.25]), "depth": len(model.blocks)}

    cfg = TrainConfig.from_dict({
        "model": "vit-micro", "model_options": {"depth": 1, "embed_dim": 16, "num_heads": 2},
        "dataset_options": {"num_images": 64}, "eval_images": 32, "batch_size": 32, "epochs": 2, "keep_every": 2,
        "progress": False, "device": "cpu", "out": str(tmp_path / "run")})
    train(cfg, hooks=[alphas])
    epochs = [m for m in read_metrics(Path(cfg.out)) if m["kind"] == "epoch"]
    assert seen == ["VisionTransformer"] * 2 and [m["epoch"] for m in epochs] == [1, 2]
    assert epochs[0]["alpha/0"] == 1.5 and epochs[0]["alpha/1"] == 1.25 and epochs[0]["depth"] == 1
    assert [p.name for p in (Path(cfg.out) / "snapshots").iterdir()] == ["epoch-0002.safetensors"]


def test_hooks_by_name_and_flattening():
    assert resolve_hook("vitscope.models:count_parameters").__name__ == "count_parameters"
    with pytest.raises(ValueError, match="module:function"):
        resolve_hook("vitscope.models:nothing_here")
    with pytest.raises(TypeError, match="count_parameters returned int"):
        hook_scalars([resolve_hook("vitscope.models:count_parameters")], create("vit-micro", depth=1))
    assert flatten_scalars({"a": {"b": 1, "c": [2, 3]}, "d": torch.tensor(4.0)}) == {
        "a/b": 1.0, "a/c/0": 2.0, "a/c/1": 3.0, "d": 4.0}
