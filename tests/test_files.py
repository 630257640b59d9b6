"""One atomic writer and one owner of the run-folder layout."""

import pytest
import torch

from vitscope.files import atomic_path, atomic_write_bytes
from vitscope.models import create, load
from vitscope.run_folder import latest_pointer, model_file
from vitscope.train.checkpoint import save_checkpoint


def test_atomic_path_keeps_the_old_file_after_an_error(tmp_path):
    target = tmp_path / "deep" / "out.json"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError, match="disk on fire"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"old" and [p.name for p in target.parent.iterdir()] == ["out.json"]
    with atomic_path(target) as tmp:
        assert tmp.suffix == ".json" and tmp.parent == target.parent  # same suffix: writers that infer the format
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_run_folder_model_follows_every_checkpoint_and_load_reads_only_it(tmp_path):
    model = create("vit-micro")
    save_checkpoint(tmp_path, 3, model, {"step": 3})
    assert latest_pointer(tmp_path).read_text() == "step-000000003"
    loaded = load(str(tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(),
                                                  strict=True))
    model_file(tmp_path).unlink()  # a checkpoint alone is the trainer's state, not the run's model
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load(str(tmp_path))
