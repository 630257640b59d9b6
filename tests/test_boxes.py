"""Box layouts read from files the test writes: VOC and ImageNet validation XML."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

from vitscope.data.boxes import load_box_dataset

XML = """<annotation><size><width>{w}</width><height>{h}</height></size>{objects}</annotation>"""
OBJECT = "<object><name>{name}</name><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax>" \
         "</bndbox></object>"


def _write(image_path, xml_path, objects, w=40, h=20):
    for path in (image_path, xml_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(image_path)
    xml_path.write_text(XML.format(w=w, h=h, objects="".join(OBJECT.format(**o) for o in objects)))


def test_voc_xml_boxes_are_scaled_padded_and_labelled_by_the_largest(tmp_path):
    base = tmp_path / "VOCdevkit" / "VOC2012"
    _write(base / "JPEGImages" / "a.jpg", base / "Annotations" / "a.xml",
           [{"name": "cat", "x0": 1, "y0": 1, "x1": 10, "y1": 10}, {"name": "dog", "x0": 11, "y0": 1, "x1": 40,
                                                                     "y1": 20}])
    _write(base / "JPEGImages" / "b.jpg", base / "Annotations" / "b.xml",
           [{"name": "person", "x0": 21, "y0": 11, "x1": 40, "y1": 20}])
    (base / "ImageSets" / "Main").mkdir(parents=True)
    (base / "ImageSets" / "Main" / "val.txt").write_text("a\nb\n")
    data = load_box_dataset("voc", tmp_path, "eval", image_size=80)
    assert data.images.shape == (2, 3, 80, 80) and data.classes[data.labels[0]] == "dog"
    assert data.classes[data.labels[1]] == "person"
    boxes = data.extras["boxes"]
    assert boxes.shape == (2, 2, 4)
    # the 40 x 20 images are viewed as timm evaluates them: shorter side 20 -> 80 (x 4), centre 80 of 160 (x - 40)
    assert all(math.isnan(v) for v in boxes[0, 0].tolist())  # cat, x 0..10 -> 0..40: cut away by the crop
    torch.testing.assert_close(boxes[0, 1], torch.tensor([0.0, 0.0, 80.0, 80.0]))  # dog, x 10..40, y 0..20
    torch.testing.assert_close(boxes[1, 0], torch.tensor([40.0, 40.0, 80.0, 80.0]))  # person, x 20..40, y 10..20
    assert all(math.isnan(v) for v in boxes[1, 1].tolist())


def test_imagenet_validation_xml_beside_or_apart(tmp_path):
    _write(tmp_path / "val" / "n01" / "v1.JPEG", tmp_path / "bbox_val" / "v1.xml",
           [{"name": "n02", "x0": 1, "y0": 1, "x1": 40, "y1": 20}])
    _write(tmp_path / "val" / "v2.JPEG", tmp_path / "val" / "v2.xml", [{"name": "n01", "x0": 1, "y0": 1, "x1": 5,
                                                                        "y1": 5}])
    data = load_box_dataset("imagenet", tmp_path, "eval", image_size=40)
    assert data.classes == ["n01", "n02"] and data.labels.tolist() == [1, 0]
    (tmp_path / "val" / "v3.JPEG").write_bytes((tmp_path / "val" / "v2.JPEG").read_bytes())
    with pytest.raises(ValueError, match="v3.JPEG: no annotation"):
        load_box_dataset("imagenet", tmp_path, "eval")
