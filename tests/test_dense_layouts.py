"""Dense layouts read from files the test writes: labels mapped as each layout documents, bad data named."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitscope.data.dense_layouts import load_dense


def _image(path, h=6, w=8):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), 100, np.uint8)).save(path)


def _mask(path, values, mode="L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    values = np.asarray(values, dtype=np.uint8)
    image = Image.fromarray(values)
    if mode == "P":  # a palette image whose indices are the labels (VOC's format)
        image = Image.new("P", (values.shape[1], values.shape[0]))
        image.putpalette([(i * 37) % 256 for i in range(768)])
        image.putdata(values.flatten().tolist())
    image.save(path)


def test_voc_palette_masks_keep_indices_and_255(tmp_path):
    base = tmp_path / "VOCdevkit" / "VOC2012"
    values = np.zeros((6, 8), np.uint8)
    values[0, 0], values[1, 1] = 15, 255
    _image(base / "JPEGImages" / "a.jpg")
    _mask(base / "SegmentationClass" / "a.png", values, "P")
    (base / "ImageSets" / "Segmentation").mkdir(parents=True)
    (base / "ImageSets" / "Segmentation" / "val.txt").write_text("a\n")
    data = load_dense("voc", tmp_path, "eval")
    assert data.num_classes == 21 and data.ignore_index == 255 and data.classes[15] == "person"
    assert data.targets[0][0, 0] == 15 and data.targets[0][1, 1] == 255 and data.images[0].shape == (3, 6, 8)


def test_ade20k_reduces_the_zero_label(tmp_path):
    base = tmp_path / "ADEChallengeData2016"
    _image(base / "images" / "training" / "x.jpg")
    _mask(base / "annotations" / "training" / "x.png", np.array([[0, 1, 150, 5]] * 6, np.uint8).repeat(2, 1))
    target = load_dense("ade20k", tmp_path, "train").targets[0]
    assert target[0, :8].tolist() == [255, 255, 0, 0, 149, 149, 4, 4]


def test_cityscapes_label_ids_become_train_ids(tmp_path):
    stem = "aachen_000000_000019"
    _image(tmp_path / "leftImg8bit" / "val" / "aachen" / f"{stem}_leftImg8bit.png")
    _mask(tmp_path / "gtFine" / "val" / "aachen" / f"{stem}_gtFine_labelIds.png",
          np.array([[7, 26, 0, 33] * 2] * 6, np.uint8))
    target = load_dense("cityscapes", tmp_path, "val").targets[0]
    assert target[0, :4].tolist() == [0, 13, 255, 18]


def test_segfolder_errors_name_the_file(tmp_path):
    (tmp_path / "classes.json").write_text(json.dumps({"classes": ["a", "b"], "ignore_index": 255}))
    _image(tmp_path / "images" / "train" / "one.png")
    _mask(tmp_path / "masks" / "train" / "one.png", np.array([[0, 1, 255, 1, 0, 0, 0, 0]] * 6, np.uint8))
    assert load_dense("segfolder", tmp_path, "train").targets[0][0, :3].tolist() == [0, 1, 255]
    _mask(tmp_path / "masks" / "train" / "one.png", np.full((6, 8), 7, np.uint8))
    with pytest.raises(ValueError, match=r"one.png: label value 7 is outside 0..1"):
        load_dense("segfolder", tmp_path, "train")
    _mask(tmp_path / "masks" / "train" / "one.png", np.zeros((5, 8), np.uint8))
    with pytest.raises(ValueError, match="one.png: target"):
        load_dense("segfolder", tmp_path, "train")
    _image(tmp_path / "images" / "train" / "two.png")
    with pytest.raises(ValueError, match="two.png: no target"):
        load_dense("segfolder", tmp_path, "train")


def test_nyu_csv_decodes_8_bit_train_and_16_bit_millimetre_test(tmp_path):
    (tmp_path / "data").mkdir()
    _image(tmp_path / "data" / "nyu2_train" / "s" / "1.jpg")
    Image.fromarray(np.full((6, 8), 255, np.uint8)).save(tmp_path / "data" / "nyu2_train" / "s" / "1.png")
    (tmp_path / "data" / "nyu2_train.csv").write_text("data/nyu2_train/s/1.jpg,data/nyu2_train/s/1.png\n")
    _image(tmp_path / "data" / "nyu2_test" / "0_colors.png")
    Image.fromarray(np.full((6, 8), 2500, np.uint16)).save(tmp_path / "data" / "nyu2_test" / "0_depth.png")
    (tmp_path / "data" / "nyu2_test.csv").write_text("data/nyu2_test/0_colors.png,data/nyu2_test/0_depth.png\n")
    assert float(load_dense("nyu", tmp_path, "train", task="depth").targets[0].max()) == pytest.approx(10.0)
    assert float(load_dense("nyu", tmp_path, "eval", task="depth").targets[0].max()) == pytest.approx(2.5)
    Image.fromarray(np.zeros((6, 8, 3), np.uint8)).save(tmp_path / "data" / "nyu2_test" / "0_depth.png")
    with pytest.raises(ValueError, match="0_depth.png: depth image mode RGB"):
        load_dense("nyu", tmp_path, "eval", task="depth")


def test_depthfolder_reads_npy_metres_and_needs_a_scale_for_png(tmp_path):
    _image(tmp_path / "images" / "val" / "a.png")
    (tmp_path / "depth" / "val").mkdir(parents=True)
    np.save(tmp_path / "depth" / "val" / "a.npy", np.full((6, 8), 3.25, np.float32))
    assert torch.equal(load_dense("depthfolder", tmp_path, "eval", task="depth").targets[0],
                       torch.full((6, 8), 3.25))
    _image(tmp_path / "images" / "val" / "b.png")
    Image.fromarray(np.full((6, 8), 1200, np.uint16)).save(tmp_path / "depth" / "val" / "b.png")
    with pytest.raises(ValueError, match="depth.json"):
        load_dense("depthfolder", tmp_path, "eval", task="depth")
    (tmp_path / "depth.json").write_text('{"scale": 0.001}')
    assert float(load_dense("depthfolder", tmp_path, "eval", task="depth").targets[1].max()) == pytest.approx(1.2)


def test_a_size_limit_draws_from_across_a_scene_grouped_listing(tmp_path):
    # NYU's train list is grouped by scene: the first 8 of 5 scenes x 8 frames are all one scene
    rows = []
    for scene in range(5):
        for frame in range(8):
            folder = tmp_path / "data" / "nyu2_train" / f"scene{scene}"
            folder.mkdir(parents=True, exist_ok=True)
            _image(folder / f"{frame}.jpg")
            Image.fromarray(np.full((6, 8), 10 * scene + frame, np.uint8)).save(folder / f"{frame}.png")
            rows.append(f"data/nyu2_train/scene{scene}/{frame}.jpg,data/nyu2_train/scene{scene}/{frame}.png")
    (tmp_path / "data" / "nyu2_train.csv").write_text("\n".join(rows) + "\n")
    picked = load_dense("nyu", tmp_path, "train", task="depth", limit=8)
    scenes = {Path(f).parent.name for f in picked.files}
    assert len(picked) == 8 and len(scenes) >= 3
    assert picked.settings["subset"] == {"count": 8, "of": 40, "seed": 0, "method": "seeded random"}
    assert picked.settings["eigen_crop"] is True  # NYU is scored in the Eigen crop unless told otherwise
    full = load_dense("nyu", tmp_path, "train", task="depth")
    assert picked.files == full.subset(8, seed=0).files  # the same draw as subsetting the loaded split
    assert picked.files != load_dense("nyu", tmp_path, "train", task="depth", limit=8, seed=1).files
    assert "subset" not in full.settings


def test_dense_images_go_through_the_guarded_decoder(tmp_path):
    """A segfolder image cut short mid-write is one error naming it (the guarded decoder refuses it before a
    decoder reads past its data), and a 16-bit photo is read at 8 bits (its high byte) instead of being clipped
    to white by PIL's RGB conversion."""
    (tmp_path / "classes.json").write_text(json.dumps({"classes": ["a", "b"], "ignore_index": 255}))
    _mask(tmp_path / "masks" / "train" / "one.png", np.zeros((6, 8), np.uint8))
    path = tmp_path / "images" / "train" / "one.png"
    path.parent.mkdir(parents=True)
    Image.fromarray(np.full((6, 8), 40000, np.uint16)).save(path)  # mode I;16
    image = load_dense("segfolder", tmp_path, "train").images[0]
    assert image.dtype == torch.uint8 and image.unique().tolist() == [40000 >> 8]
    _image(path)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="one.png"):
        load_dense("segfolder", tmp_path, "train")
