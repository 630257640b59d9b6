"""Streamed datasets: the ImageNet layout (labels, boxes), WebDataset shards, crops cut in workers (equal to the
in-memory path's, independent of the worker count), the stream: auto choice, clear layout errors, and a
streamed DINO run killed and resumed to the weights of an uninterrupted one."""

import json
import pickle
from pathlib import Path

import pytest
import torch
import webdataset as wds
from safetensors.torch import load_file
from torchvision.io import encode_jpeg, encode_png

from test_dino import TINY_DINO, assert_two_ranks_match_one_process
from test_train import kill_and_resume, launch, wait_for_checkpoint
from vitscope.data import ImageDataset, load_dataset
from vitscope.data.augment import image_uniforms
from vitscope.data.choice import open_for_training
from vitscope.data.multicrop import (
    MultiCropSpec,
    crop_and_resize,
    cut_views,
    multicrop,
    photometric_views,
    resized_crop_boxes,
    view_uniforms,
)
from vitscope.data.stream import StreamedDataset, eval_view
from vitscope.data.stream_sources import open_streamed
from vitscope.data.worker_crops import MultiCropCutter, PadCropCutter, cropped_batches
from vitscope.train import TrainConfig, train

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")  # torchvision 0.29

WNIDS = ("n01440764", "n02102040")


def random_image(seed: int, height: int, width: int) -> torch.Tensor:
    """A smooth random image (JPEG keeps it close), uint8 (3, H, W)."""
    g = torch.Generator().manual_seed(seed)
    small = torch.rand(1, 3, 4, 4, generator=g)
    return (torch.nn.functional.interpolate(small, size=(height, width), mode="bilinear")[0] * 255).to(torch.uint8)


def voc_xml(boxes: list[tuple[str, int, int, int, int]], width: int, height: int) -> str:
    objects = "".join(f"<object><name>{n}</name><bndbox><xmin>{a}</xmin><ymin>{b}</ymin><xmax>{c}</xmax>"
                      f"<ymax>{d}</ymax></bndbox></object>" for n, a, b, c, d in boxes)
    return f"<annotation><size><width>{width}</width><height>{height}</height></size>{objects}</annotation>"


def make_imagenet(root: Path, per_class: int = 4) -> Path:
    """train/<wnid>/*.JPEG of mixed sizes; flat val/ with LOC_val_solution.csv; XML boxes for val 0 and 1."""
    for c, wnid in enumerate(WNIDS):
        (root / "train" / wnid).mkdir(parents=True)
        for i in range(per_class):
            image = random_image(100 * c + i, 40 + 4 * (i % 3), 48 + 8 * (i % 2))
            (root / "train" / wnid / f"{wnid}_{i}.JPEG").write_bytes(encode_jpeg(image).numpy().tobytes())
    (root / "val").mkdir()
    rows = ["ImageId,PredictionString"]
    for i in range(4):
        name = f"ILSVRC2012_val_{i + 1:08d}"
        (root / "val" / f"{name}.JPEG").write_bytes(encode_jpeg(random_image(900 + i, 36, 44)).numpy().tobytes())
        wnid = WNIDS[(i + 1) % 2]
        rows.append(f"{name},{wnid} 5 6 20 30 {wnid} 1 1 8 8")
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    (root / "val" / "ILSVRC2012_val_00000001.xml").write_text(voc_xml([(WNIDS[1], 11, 12, 30, 33)], 44, 36))
    (root / "val" / "ILSVRC2012_val_00000002.xml").write_text(
        voc_xml([(WNIDS[0], 1, 1, 10, 10), (WNIDS[0], 2, 3, 40, 30)], 44, 36))
    return root


def make_shards(root: Path, images: list[torch.Tensor], labels: list[int], per_shard: int = 3) -> Path:
    """WebDataset shards train/shard-00000N.tar of lossless PNGs plus .cls labels, and classes.txt."""
    (root / "train").mkdir(parents=True)
    for start in range(0, len(images), per_shard):
        with wds.TarWriter(str(root / "train" / f"shard-{start // per_shard:06d}.tar")) as sink:
            for i in range(start, min(start + per_shard, len(images))):
                sink.write({"__key__": f"s{i:05d}", "png": encode_png(images[i]).numpy().tobytes(),
                            "cls": str(labels[i]).encode()})
    (root / "classes.txt").write_text("cat\ndog\nfox\n")
    return root


def test_imagenet_layout_labels_and_boxes(tmp_path):
    root = make_imagenet(tmp_path / "imagenet")
    train_set = open_streamed("imagenet", root, "train")
    assert train_set.classes == list(WNIDS) and train_set.labels.tolist() == [0] * 4 + [1] * 4
    assert train_set.decode(1).shape == (3, 44, 56)  # each image keeps its own size
    half = train_set.subset(4, seed=1)  # class-stratified, sharing the reader
    assert half.labels.tolist() == [0, 0, 1, 1] and half.selection["count"] == 4
    assert all(torch.equal(half.decode(i), train_set.decode(int(half.items[i]))) for i in range(4))
    val = open_streamed("imagenet", root, "eval", image_size=24)
    assert val.labels.tolist() == [1, 0, 1, 0]  # the first wnid of each CSV row
    boxes = val.extras["boxes"]
    # XML (1-based inclusive) -> pixel edges; image 3 has no XML, so its boxes come from the CSV
    assert boxes[0, 0].tolist() == [10, 11, 30, 33] and boxes[0, 1].isnan().all()
    assert boxes[1].tolist() == [[0, 0, 10, 10], [1, 2, 40, 30]]
    assert boxes[2].tolist() == [[4, 5, 20, 30], [0, 0, 8, 8]]
    views = val.images_at(torch.arange(4))  # 36 x 44 -> shorter side 24 / 0.875 = 27 -> centre 24 x 24
    resized = torch.nn.functional.interpolate(val.decode(2)[None].float(), size=(27, 33), mode="bilinear",
                                              antialias=True, align_corners=False)[0]
    assert views.shape == (4, 3, 24, 24) and (views[2].float() - resized[:, 2:26, 4:28]).abs().max() <= 1
    square = random_image(5, 24, 24)  # an image already at the side is evaluated as it is, like in memory
    assert torch.equal(eval_view(square, 24), square)
    # val sorted into class folders gives the same labels
    for image, label in zip(sorted((root / "val").glob("*.JPEG")), val.labels.tolist(), strict=True):
        (root / "val" / WNIDS[label]).mkdir(exist_ok=True)
        image.rename(root / "val" / WNIDS[label] / image.name)
    regrouped = open_streamed("imagenet", root, "eval")
    assert sorted(regrouped.labels.tolist()) == sorted(val.labels.tolist())
    # in memory: the same listing and views (shorter side 22 / 0.875 = 25, centre crop), boxes moved with them
    memory = load_dataset("imagenet", make_imagenet(tmp_path / "again"), "eval", image_size=22)
    assert isinstance(memory, ImageDataset) and memory.images.shape == (4, 3, 22, 22)
    assert torch.equal(memory.images, open_streamed("imagenet", tmp_path / "again", "eval", image_size=22)
                       .images_at(torch.arange(4)))
    mask = torch.zeros(3, 36, 44, dtype=torch.uint8)  # box [1, 2, 40, 30] of image 1 (36 x 44) drawn, then viewed
    mask[:, 2:30, 1:40] = 255
    seen = eval_view(mask, 22, 0.875)[0] > 127
    rows, cols = seen.any(1).nonzero(), seen.any(0).nonzero()
    drawn = [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]
    assert memory.extras["boxes"][1, 1].tolist() == pytest.approx(drawn, abs=1)


def test_bad_layouts_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"no class folders under .*train.*LOC_synset_mapping"):
        open_streamed("imagenet", tmp_path, "train")
    root = make_imagenet(tmp_path / "imagenet")
    (root / "LOC_val_solution.csv").unlink()
    with pytest.raises(ValueError, match=r"val holds images without class folders.*LOC_val_solution.csv"):
        open_streamed("imagenet", root, "eval")
    (root / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nother,n01440764 1 1 2 2\n")
    with pytest.raises(ValueError, match=r"ILSVRC2012_val_00000001.JPEG: no row"):
        open_streamed("imagenet", root, "eval")
    (root / "train" / WNIDS[0] / "broken.JPEG").write_bytes(b"not a jpeg")
    broken = open_streamed("imagenet", root, "train")
    with pytest.raises(ValueError, match=r"cannot decode image .*broken.JPEG"):
        broken.decode(0)
    with pytest.raises(ValueError, match=r"no shards for the train split .*train/\*\.tar"):
        open_streamed("shards", tmp_path / "imagenet", "train")
    archive = tmp_path / "data.tar.gz"
    archive.write_bytes(b"")
    with pytest.raises(ValueError, match="unpack it"):
        open_streamed("imagefolder", archive, "train")
    with pytest.raises(ValueError, match="cannot stream"):
        open_for_training("synthetic", None, "train", stream="true", memory_budget_gb=4)
    with pytest.raises(ValueError, match="stream='maybe' is unknown"):
        TrainConfig(stream="maybe")


def test_shards_read_labels_and_pixels_and_pickle_for_workers(tmp_path):
    images = [random_image(i, 20, 24) for i in range(7)]
    labels = [i % 3 for i in range(7)]
    root = make_shards(tmp_path / "shards", images, labels)
    dataset = open_streamed("shards", root, "train")
    assert len(dataset) == 7 and dataset.labels.tolist() == labels and dataset.classes == ["cat", "dog", "fox"]
    assert all(torch.equal(dataset.decode(i), images[i]) for i in (0, 3, 6))  # across shard boundaries
    copy = pickle.loads(pickle.dumps(dataset))
    assert torch.equal(copy.decode(5), images[5])
    # a shard whose sample lacks its class file
    with wds.TarWriter(str(root / "train" / "shard-000009.tar")) as sink:
        sink.write({"__key__": "nolabel", "png": encode_png(images[0]).numpy().tobytes()})
    with pytest.raises(ValueError, match=r"shard-000009.tar: sample nolabel has no .cls member"):
        open_streamed("shards", root, "train")


def test_worker_crops_equal_the_in_memory_path_and_ignore_worker_count(tmp_path):
    images = [random_image(i, 40, 40) for i in range(6)]
    root = make_shards(tmp_path / "shards", images, [0, 1, 2, 0, 1, 2])
    dataset = open_streamed("shards", root, "train")
    spec = MultiCropSpec(24, 12, 2, blur_sigma=(0.1, 1.0))
    batches = [torch.tensor([4, 0, 2]), torch.tensor([5, 1, 3])]
    runs = {w: list(cropped_batches(dataset, MultiCropCutter(spec), 7, 3, batches, workers=w)) for w in (0, 2)}
    for (a, la, ia), (b, lb, ib) in zip(runs[0], runs[2], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) and torch.equal(la, lb)
        assert torch.equal(ia, ib)
    full = torch.stack(images)
    for (crops, labels, index), batch in zip(runs[0], batches, strict=True):
        assert torch.equal(index, batch) and labels.tolist() == [[0, 1, 2, 0, 1, 2][i] for i in batch]
        u = view_uniforms(7, 3, batch, spec)
        x = full[batch].float() / 255
        reference = [crop_and_resize(x, resized_crop_boxes(u[:, 16 * v : 16 * v + 4], 40, 40, spec.global_scale
                                                           if v < 2 else spec.local_scale),
                                     spec.global_size if v < 2 else spec.local_size).clamp(0, 1)
                     for v in range(spec.num_views)]  # one view at a time, as the in-memory path cut them before
        assert all(torch.equal(a, b) for a, b in zip(cut_views(x, u, spec), reference, strict=True))
        for crop, ref in zip(crops, reference, strict=True):
            assert (crop.float() / 255 - ref).abs().max() <= 0.5 / 255 + 1e-6
        views = photometric_views([c.float() / 255 for c in crops], u, spec, (0.5,) * 3, (0.25,) * 3)
        in_memory = multicrop(full[batch], batch, 7, 3, spec, (0.5,) * 3, (0.25,) * 3)
        assert all((v - m).abs().max() < 0.1 for v, m in zip(views, in_memory, strict=True))
    # another epoch or seed cuts other crops
    other = next(iter(cropped_batches(dataset, MultiCropCutter(spec), 7, 4, batches[:1], workers=0)))[0]
    assert not torch.equal(other[0], runs[0][0][0][0])


def test_supervised_crop_is_the_padded_image_at_a_per_image_offset():
    image = random_image(3, 20, 20)
    cutter = PadCropCutter(20, 4)
    padded = torch.nn.functional.pad(image, (4,) * 4)
    offsets = set()
    for index in range(40):
        crop = cutter(image, 0, 1, index)
        u = image_uniforms(0, 1, torch.tensor([index]), 2)[0]
        dy, dx = int(u[0] * 9), int(u[1] * 9)
        assert torch.equal(crop, padded[:, dy : dy + 20, dx : dx + 20])
        offsets.add((dy, dx))
        assert torch.equal(crop, cutter(image, 0, 1, index))
    assert len(offsets) > 20 and all(0 <= v <= 8 for o in offsets for v in o)
    assert PadCropCutter(16, 0)(random_image(1, 30, 40), 0, 0, 0).shape == (3, 16, 16)  # resized first


def test_auto_keeps_small_sets_in_memory_and_streams_large_ones(tmp_path):
    root = make_imagenet(tmp_path / "imagenet")
    kept, decision = open_for_training("imagenet", str(root), "train", stream="auto", memory_budget_gb=1.0,
                                       image_size=32)
    assert isinstance(kept, ImageDataset) and not decision["stream"]
    assert decision["decoded_bytes"] == 8 * 3 * 32 * 32 and "<" in decision["reason"]
    streamed, decision = open_for_training("imagenet", str(root), "train", stream="auto", memory_budget_gb=1e-5)
    assert isinstance(streamed, StreamedDataset) and decision["stream"] and ">=" in decision["reason"]
    assert 8 * 3 * 40 * 48 <= decision["decoded_bytes"] <= 8 * 3 * 48 * 56  # from the images' headers
    forced, decision = open_for_training("imagenet", str(root), "train", stream="true", memory_budget_gb=100)
    assert isinstance(forced, StreamedDataset) and decision["reason"] == "stream: true in the config"
    synthetic, decision = open_for_training("synthetic", None, "train", stream="auto", memory_budget_gb=4,
                                            num_images=8)
    assert isinstance(synthetic, ImageDataset) and not decision["stream"]
    assert TrainConfig(stream=True).stream == "true" and TrainConfig(stream=False).stream == "false"


def test_streamed_dino_resumes_after_sigkill_to_the_uninterrupted_weights(tmp_path):
    root = make_imagenet(tmp_path / "imagenet", per_class=8)
    common = {**TINY_DINO, "dataset": "imagenet", "data_dir": str(root), "dataset_options": {"image_size": 32},
              "stream": True, "batch_size": 4, "eval_images": None, "deterministic": True,
              "checkpoint_every_steps": 1, "epochs": 2,
              "objective_options": {**TINY_DINO["objective_options"], "knn_bank": 16}}
    reference = TrainConfig.from_dict({**common, "out": str(tmp_path / "reference"), "data_workers": 0})
    train(reference)
    meta = json.loads((Path(reference.out) / "config.json").read_text())
    assert meta["data"]["train"]["stream"] and meta["config"]["stream"] == "true"
    # the victim decodes in 2 worker processes (same crops, so the same weights) and is killed mid-epoch: its
    # checkpoints come every step and an epoch has 4, so it resumes from step 2 or 3 of 8
    victim = TrainConfig.from_dict({**common, "out": str(tmp_path / "victim"), "data_workers": 2})
    proc = launch(victim, tmp_path)
    wait_for_checkpoint(Path(victim.out), proc, min_step=2, timeout=180)
    kill_and_resume(Path(victim.out), proc)
    assert json.loads((Path(victim.out) / "summary.json").read_text())["steps"] == 8
    ours, theirs = (load_file(str(Path(run.out) / "model.safetensors")) for run in (victim, reference))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_streamed_dino_on_two_gloo_ranks_gives_the_centre_and_loss_of_one_process(tmp_path):
    """Crops cut in DataLoader workers are seeded by (seed, epoch, image index), not by rank: 2 ranks with half
    the batch each see the crops of 1 process with the whole batch."""
    root = make_imagenet(tmp_path / "imagenet", per_class=8)
    common = {**TINY_DINO, "dataset": "imagenet", "data_dir": str(root), "dataset_options": {"image_size": 32},
              "stream": True, "data_workers": 1, "batch_size": 8, "eval_images": None, "epochs": 1,
              "log_every_steps": 1, "objective_options": {**TINY_DINO["objective_options"], "knn_bank": 16}}
    assert_two_ranks_match_one_process(TrainConfig.from_dict({**common, "out": str(tmp_path / "single")}),
                                       TrainConfig.from_dict({**common, "out": str(tmp_path / "double")}),
                                       tmp_path, log_lines=2)


def test_streamed_supervised_run_and_objectives_that_need_whole_images(tmp_path):
    from vitscope.train.batches import batch_source
    from vitscope.train.distributed import DistContext
    from vitscope.train.objective import Objective

    root = make_imagenet(tmp_path / "imagenet")
    cfg = TrainConfig.from_dict({"model": "vit-micro", "model_options": {"depth": 1, "embed_dim": 32, "num_heads": 2},
                                 "dataset": "imagenet", "data_dir": str(root), "dataset_options": {"image_size": 32},
                                 "stream": "true", "data_workers": 0, "batch_size": 4, "epochs": 1,
                                 "warmup_epochs": 0, "progress": False, "device": "cpu", "out": str(tmp_path / "run")})
    summary = train(cfg)
    assert summary["steps"] == 2 and summary["train_images"] == 8 and 0 <= summary["eval"]["top1"] <= 1
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["eval"]["stream"]

    class WholeImages(Objective):  # the base class cuts nothing in workers
        setup = trainable = exported = loss = evaluate = restore = None

    streamed = open_streamed("imagenet", root, "train")
    with pytest.raises(ValueError, match="needs whole images.*stream: false"):
        batch_source(streamed, WholeImages(cfg), cfg, DistContext(0, 1, torch.device("cpu"), False))
