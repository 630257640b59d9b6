"""One atomic writer and one owner of the run-folder layout."""

import io
import sys

import pytest
import torch

from vitscope.atomic_io import atomic_path, atomic_write_bytes
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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:  # tqdm shows its bar only on a terminal (disable=None)
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_decoding_an_archive_sized_folder_shows_progress_on_a_terminal_only(tmp_path, monkeypatch, terminal):
    from PIL import Image

    import vitscope.data.image_trees as files

    for i in range(3):
        Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / f"{i}.png")
    monkeypatch.setattr(files, "PROGRESS_FROM", 2)  # as if the folder held CIFAR's 60k images
    stream = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    images = files.decode_images(files.FileTree(tmp_path), ["0.png", "1.png", "2.png"])
    assert images.shape == (3, 3, 8, 8) and images[2, 0, 0, 0] == 80
    shown = stream.getvalue()
    assert (f"decoding {tmp_path.name}" in shown and "/3 " in shown and "img/s" in shown) is terminal
