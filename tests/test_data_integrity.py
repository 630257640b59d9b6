"""Subsets are seeded class-stratified samples; the decode cache follows every file; broken archives say so."""

import os
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vitscope.data import ImageDataset, load_dataset
from vitscope.data.dataset import stratified_indices


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))


def class_sorted(counts: list[int]) -> ImageDataset:
    """A dataset in class-sorted order (as image folders are read), image k holding the value k."""
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)]).long()
    images = torch.arange(len(labels)).remainder(256).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2)
    return ImageDataset("toy", "train", images.contiguous(), labels, [str(c) for c in range(len(counts))],
                        (0.5,) * 3, (0.5,) * 3, extras={"index": torch.arange(len(labels))})


def test_subset_is_stratified_not_the_first_classes():
    data = class_sorted([500] * 10)
    sub = data.subset(1000)
    assert torch.bincount(sub.labels, minlength=10).tolist() == [100] * 10  # today's code: [500, 500, 0, ...]
    assert torch.equal(sub.labels, data.labels[sub.extras["index"]])  # extras follow the images
    assert sub.selection["method"] == "class-stratified" and sub.selection["seed"] == 0
    assert sub.selection["count"] == 1000 and sub.selection["of"] == 5000


def test_same_seed_same_images_other_seed_other_images():
    data = class_sorted([50] * 4)
    a, b, c = data.subset(40, seed=3), data.subset(40, seed=3), data.subset(40, seed=4)
    assert torch.equal(a.extras["index"], b.extras["index"])
    assert a.selection["indices_sha1"] == b.selection["indices_sha1"] != c.selection["indices_sha1"]
    assert not torch.equal(a.extras["index"], c.extras["index"])
    assert torch.equal(a.extras["index"], torch.sort(a.extras["index"]).values)  # dataset order kept


def test_fewer_images_than_classes_spreads_over_seeded_classes():
    data = class_sorted([10] * 10)
    picked = {tuple(sorted(data.subset(3, seed=s).labels.tolist())) for s in range(20)}
    assert all(len(set(p)) == 3 for p in picked)  # one image each from three classes
    assert len(picked) > 1  # not always the same (first) classes


def test_bad_subset_size_is_refused():
    with pytest.raises(ValueError, match="subset size -5"):
        class_sorted([3, 3]).subset(-5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.data())
def test_stratified_quotas_against_exact_shares(counts, data):
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)]).long()
    count = data.draw(st.integers(1, len(labels)))
    seed = data.draw(st.integers(0, 2**31 - 1))
    index = stratified_indices(labels, count, seed)
    assert len(index) == count == len(set(index.tolist()))
    got = torch.bincount(labels[index], minlength=len(counts)).tolist()
    for n, k in zip(counts, got, strict=True):
        share = count * n / len(labels)
        assert int(share) <= k <= int(share) + 1 and k <= n  # floor or ceil of the exact share


def write_png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (value, value, value)).save(path, format="PNG")


def make_tree(root: Path) -> Path:
    for split in ("train", "test"):
        for ci, name in enumerate(("cat", "dog", "emu")):
            for k in range(2):
                write_png(root / split / name / f"{k}.png", 40 * ci + k)
    return root


def test_cache_follows_every_file_of_the_tree(tmp_path):
    root = make_tree(tmp_path / "pets")
    first = load_dataset("imagefolder", root, "train")
    assert first.num_classes == 3 and len(first) == 6
    # change one image in place, keeping the folder's own mtime and size: the cache must notice
    stat = os.stat(root)
    write_png(root / "train" / "dog" / "0.png", 200)
    os.utime(root, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = load_dataset("imagefolder", root, "train")
    assert int(changed.images[2, 0, 0, 0]) == 200
    shutil.rmtree(root / "train" / "emu")
    os.utime(root, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    fewer = load_dataset("imagefolder", root, "train")
    assert fewer.classes == ["cat", "dog"] and len(fewer) == 4


def test_cache_is_never_served_for_a_tree_that_is_gone(tmp_path):
    root = make_tree(tmp_path / "pets")
    load_dataset("imagefolder", root, "train")
    shutil.rmtree(root)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset("imagefolder", root, "train")


def test_truncated_archive_names_the_file_and_the_fix(tmp_path):
    src = make_tree(tmp_path / "src" / "pets")
    for k in range(40):  # enough incompressible bytes that a cut lands inside the stream
        (src / "train" / "cat" / f"noise{k}.bin").write_bytes(os.urandom(4096))
    archive = tmp_path / "pets.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(src, arcname="pets")
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"pets\.tar\.gz is truncated or corrupt.*re-download it or re-create it"):
        load_dataset("imagefolder", archive, "train")
