"""Dataset layouts on disk and in archives, the decode cache, and errors that show the expected layout."""

import pickle
import shutil
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitscope.data import load_dataset

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))


def write_png(path: Path, value: int, size: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = torch.full((3, size, size), value, dtype=torch.uint8)
    image[0, 0, 0] = 255 - value
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(path, format="PNG")


def make_image_folder(root: Path, classes=("cat", "dog", "emu"), per_class=3, eval_name="test") -> Path:
    for split in ("train", eval_name):
        for ci, name in enumerate(classes):
            for k in range(per_class):
                write_png(root / split / name / f"{k}.png", 20 * ci + k)
    return root


def test_image_folder_tree_and_split_names(tmp_path):
    root = make_image_folder(tmp_path / "pets")
    train = load_dataset("imagefolder", root, "train")
    assert len(train) == 9 and train.classes == ["cat", "dog", "emu"] and train.images.shape == (9, 3, 8, 8)
    assert train.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert int(train.images[4, 1, 3, 3]) == 21  # dog, image 1
    test = load_dataset("imagefolder", root, "test")
    assert test.split == "eval" and len(test) == 9


@pytest.mark.parametrize("kind", ["zip", "tar.gz", "tar"])
def test_archives_with_a_single_top_folder(tmp_path, kind):
    src = make_image_folder(tmp_path / "src" / "pets", eval_name="val")
    archive = tmp_path / f"pets.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for file in src.rglob("*.png"):
                zf.write(file, file.relative_to(src.parent).as_posix())
    else:
        with tarfile.open(archive, "w:gz" if kind == "tar.gz" else "w") as tf:
            tf.add(src, arcname="pets")
    folder = load_dataset("imagefolder", src, "eval")
    packed = load_dataset("imagefolder", archive, "eval")
    assert torch.equal(folder.images, packed.images) and torch.equal(folder.labels, packed.labels)


def test_decoded_once_then_read_from_cache(tmp_path, monkeypatch):
    root = make_image_folder(tmp_path / "pets")
    first = load_dataset("imagefolder", root, "train")
    calls = []
    import vitscope.data.sources as sources

    monkeypatch.setattr(sources, "_read", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    again = load_dataset("imagefolder", root, "train")
    assert not calls and torch.equal(first.images, again.images)


def test_cifar_pickle_layout(tmp_path):
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), b"labels": list(range(4))}
        (base / name).write_bytes(pickle.dumps(batch))
    names = [n.encode() for n in ("airplane automobile bird cat deer dog frog horse ship truck".split())]
    (base / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}))
    train = load_dataset("cifar10", tmp_path, "train")
    test = load_dataset("cifar10", tmp_path, "test")
    assert len(train) == 20 and len(test) == 4 and train.classes[0] == "airplane" and train.num_classes == 10
    assert train.images.shape == (20, 3, 32, 32)


def test_tiny_imagenet_layout_keeps_boxes(tmp_path):
    root = tmp_path / "tiny-imagenet-200"
    wnids = [f"n{i:08d}" for i in range(200)]
    (root).mkdir()
    (root / "wnids.txt").write_text("\n".join(wnids))
    for w in wnids[:200]:
        write_png(root / "train" / w / "images" / f"{w}_0.JPEG", 7)
        (root / "train" / w / f"{w}_boxes.txt").write_text(f"{w}_0.JPEG\t1\t2\t5\t6\n")
    write_png(root / "val" / "images" / "val_0.JPEG", 9)
    (root / "val" / "val_annotations.txt").write_text(f"val_0.JPEG\t{wnids[3]}\t0\t1\t4\t7\n")
    train = load_dataset("tiny-imagenet", tmp_path, "train")
    val = load_dataset("tiny-imagenet", tmp_path, "val")
    assert len(train) == 200 and train.num_classes == 200
    assert val.labels.tolist() == [3] and val.extras["boxes"].tolist() == [[0.0, 1.0, 4.0, 7.0]]


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset("cifar10", tmp_path / "missing", "train")
    (tmp_path / "flat").mkdir()
    write_png(tmp_path / "flat" / "a.png", 1)
    with pytest.raises(ValueError, match=r"no train/ and val/ \(or test/\) split.*flat/train/<class>/"):
        load_dataset("imagefolder", tmp_path / "flat", "train")
    wrong = make_image_folder(tmp_path / "three")
    with pytest.raises(ValueError, match="has 3 classes but cifar10 has 10"):
        load_dataset("cifar10", wrong, "train")
    broken = make_image_folder(tmp_path / "broken")
    (broken / "train" / "dog" / "bad.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="bad.png"):
        load_dataset("imagefolder", broken, "train")
    with pytest.raises(ValueError, match="needs a data directory"):
        load_dataset("cifar100", None, "train")


@pytest.mark.skipif(not (SHARED / "cifar10_jpg.tar.gz").exists(), reason="../shared/data is not present")
def test_real_cifar10_archive_eval_split(tmp_path):
    data = load_dataset("cifar10", SHARED / "cifar10_jpg.tar.gz", "eval")
    assert len(data) == 10_000 and data.num_classes == 10 and data.images.shape[1:] == (3, 32, 32)
    assert torch.bincount(data.labels).tolist() == [1000] * 10
    shutil.rmtree(tmp_path / "cache")


def test_a_tree_with_only_a_train_split_is_not_descended_into(tmp_path):
    root = tmp_path / "only-train"
    for k in range(2):
        write_png(root / "train" / "solo" / f"{k}.png", 10 + k)
    data = load_dataset("imagefolder", root, "train")
    assert len(data) == 2 and data.classes == ["solo"]
    with pytest.raises(ValueError, match="no test/ or val/ folder"):
        load_dataset("imagefolder", root, "eval")


def test_the_data_line_states_each_decision_once():
    from vitscope.data.choice import describe_choice

    same = {"stream": False, "mode": "auto", "reason": "cifar10 from /d/c.tar.gz is read in memory"}
    line = describe_choice({"train": same, "eval": dict(same)})
    assert line == "data train and eval in memory (cifar10 from /d/c.tar.gz is read in memory)"
    assert line.count("read in memory") == 1
    streamed = {"stream": True, "mode": "auto", "reason": "decoded size 9.00 GB >= memory_budget_gb 4"}
    assert describe_choice({"train": streamed, "eval": same}) == (
        "data train streamed (decoded size 9.00 GB >= memory_budget_gb 4); "
        "eval in memory (cifar10 from /d/c.tar.gz is read in memory)")
