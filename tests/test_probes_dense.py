"""Dense probes: planted features give the known answer; the whole path runs on synthetic scenes."""

import pytest
import torch

from vitscope.data.dense import DenseDataset, synthetic_dense
from vitscope.models import create
from vitscope.probes.dense.probe import dense_probe, fit_dense_head, predict_dense, score_dense
from vitscope.probes.dense.settings import DenseProbeSettings


def _bands(n: int, classes: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Label maps made of horizontal bands one patch (4 px) high, and features that one-hot encode them."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, classes, (n, 8), generator=generator)
    maps = torch.nn.functional.one_hot(rows, classes).float().permute(0, 2, 1)[..., None].expand(-1, -1, -1, 8)
    masks = [r.repeat_interleave(4)[:, None].expand(32, 32).clone() for r in rows]
    return maps.contiguous(), masks


def test_features_that_encode_the_label_give_miou_100_with_ignored_pixels():
    maps, masks = _bands(24, 3, seed=0)
    for mask in masks:
        mask[0, :5] = 255  # ignored pixels may hold anything
    head = fit_dense_head(maps, masks, "segmentation", num_classes=3, ignore_index=255, epochs=30, lr=0.05,
                          batch_size=8)
    data = DenseDataset("bands", "eval", "segmentation", [torch.zeros(3, 32, 32, dtype=torch.uint8)] * 24, masks,
                        ["a", "b", "c"], 255)
    scores = score_dense(predict_dense(head, maps, [(32, 32)] * 24, "segmentation"), data)
    assert scores["miou"] == 100.0 and scores["pixel_accuracy"] == 100.0


def test_features_that_encode_log_depth_give_rmse_near_zero():
    levels = torch.tensor([1.0, 2.0, 4.0, 8.0])
    which = torch.arange(4).repeat(6)
    features = torch.cat([torch.nn.functional.one_hot(which, 4).float(), levels[which].log()[:, None]], dim=1)
    maps = features[:, :, None, None].expand(-1, -1, 4, 4).contiguous()
    depth = [torch.full((8, 8), float(levels[w])) for w in which]
    head = fit_dense_head(maps, depth, "depth", epochs=100, lr=0.05, batch_size=24)
    data = DenseDataset("levels", "eval", "depth", [torch.zeros(3, 8, 8, dtype=torch.uint8)] * 24, depth)
    scores = score_dense(predict_dense(head, maps, [(8, 8)] * 24, "depth"), data)
    assert scores["rmse"] < 0.1 and scores["delta1"] == 1.0


def test_synthetic_segmentation_and_depth_with_registers_and_cls_concat():
    torch.manual_seed(0)
    model = create("vit-micro", num_registers=2)
    train, held = synthetic_dense("segmentation", "train", 12), synthetic_dense("segmentation", "eval", 6)
    result = dense_probe(model, train, held, "last", DenseProbeSettings(epochs=2, baseline=False, cache=False,
                                                                              progress=False))
    assert {(r.get("with_cls"), r["model"]) for r in result.rows if r["metric"] == "miou"} == {
        (False, "model"), (True, "model"), (None, "chance")}
    assert 0 <= result.value(4, metric="miou", with_cls=True) <= 100
    depth = dense_probe(model, synthetic_dense("depth", "train", 8), synthetic_dense("depth", "eval", 4), "0",
                        DenseProbeSettings(with_cls=(True,), epochs=2, cache=False, progress=False))
    assert depth.value(0, metric="rmse", model="chance") > 0
    assert depth.value(0, metric="rmse", model="model (random init)") > 0


def test_mask_of_another_size_names_the_file():
    with pytest.raises(ValueError, match="a.png: target"):
        DenseDataset("x", "train", "segmentation", [torch.zeros(3, 4, 4, dtype=torch.uint8)],
                     [torch.zeros(4, 5, dtype=torch.long)], ["a"], files=["a.png"])


def test_windows_cover_the_image_and_stitch_back_exactly():
    from vitscope.probes.dense.windows import eval_windows, stitch, train_crops, window_starts

    assert window_starts(10, 4, 3) == [0, 3, 6] and window_starts(11, 4, 3) == [0, 3, 6, 7]
    assert window_starts(3, 4, 3) == [0]
    image = torch.arange(3 * 20 * 30, dtype=torch.float32).reshape(3, 20, 30).remainder(251).to(torch.uint8)
    data = DenseDataset("x", "eval", "segmentation", [image], [torch.zeros(20, 30, dtype=torch.long)], ["a"])
    view, placements, shapes = eval_windows(data, 20, 8, 5)  # short side 20: already that size
    assert shapes == [(20, 30)] and view.images.shape[1:] == (3, 8, 8)
    # stitching the windows' own pixels averages overlaps back to the image itself
    restored = stitch(view.images.float(), [p[1:] for p in placements], shapes[0], (20, 30))
    torch.testing.assert_close(restored, image.float())
    crops = train_crops(DenseDataset("x", "train", "segmentation", [image], [torch.arange(600).reshape(20, 30)],
                                     ["a"]), 10, 8, per_image=3)
    assert len(crops) == 3 and all(t.shape == (8, 8) for t in crops.targets)
    # labels are resized nearest-neighbour only: every crop value is one of the original labels
    assert set(torch.cat([t.flatten() for t in crops.targets]).tolist()) <= set(range(600))


def test_sliding_window_probe_on_synthetic_scenes():
    model = create("vit-micro")
    train, held = synthetic_dense("segmentation", "train", 6, image_size=48), synthetic_dense(
        "segmentation", "eval", 3, image_size=48)
    result = dense_probe(model, train, held, "last", DenseProbeSettings(
        with_cls=(False,), epochs=1, size=40, crops_per_image=2, baseline=False, cache=False, progress=False))
    assert 0 <= result.value(4, metric="miou", with_cls=False) <= 100
    assert "sliding window" in result.settings["geometry"]


def _depth_set(split: str, maps: list[torch.Tensor]) -> DenseDataset:
    return DenseDataset("planted", split, "depth", [torch.zeros(3, *m.shape, dtype=torch.uint8) for m in maps], maps)


def test_the_trivial_depth_floor_averages_the_pixels_the_scores_count():
    """A constant 5 m scene with one 60 m pixel (beyond the 10 m maximum), one inf and one 0.0005 m label: the
    scores leave those out, so the mean training depth is 5 m and the constant predictor's RMSE is 0 (it was 19.0,
    or NaN with the inf)."""
    train = [torch.full((32, 32), 5.0) for _ in range(4)]
    train[0][3, 4], train[1][7, 7], train[2][0, 0] = 60.0, float("inf"), 5e-4
    held = [torch.full((32, 32), 5.0) for _ in range(2)]
    torch.manual_seed(0)
    result = dense_probe(create("vit-micro"), _depth_set("train", train), _depth_set("eval", held), "0",
                         DenseProbeSettings(with_cls=(False,), epochs=1, baseline=False, cache=False, progress=False))
    assert result.value(0, metric="rmse", model="chance") == pytest.approx(0.0, abs=1e-6)
    assert result.value(0, metric="abs_rel", model="chance") == pytest.approx(0.0, abs=1e-6)


def test_training_losses_and_points_use_the_scores_validity_mask():
    from vitscope.metrics.dense import depth_valid
    from vitscope.probes.dense.points import PointSampler
    from vitscope.probes.dense.probe import silog_loss

    target = torch.rand(16, 16, generator=torch.Generator().manual_seed(0)) * 4 + 1
    target[0, :4] = torch.tensor([60.0, float("inf"), 5e-4, 0.0])
    pred = torch.rand(16, 16, generator=torch.Generator().manual_seed(1)) * 4 + 1
    valid = depth_valid(target, 1e-3, 10.0)
    assert int(valid.sum()) == 16 * 16 - 4

    def reference(keep):  # sqrt(mean g^2 - 0.85 (mean g)^2) over the kept pixels, g = log pred - log target
        g = pred[keep].double().log() - target[keep].double().log()
        return float(((g * g).mean() - 0.85 * g.mean() ** 2).sqrt())

    assert float(silog_loss(pred, target)) == pytest.approx(reference(valid), rel=1e-5)  # NYU's (1e-3, 10] m
    points = PointSampler([target], "depth", None, 2000, torch.Generator().manual_seed(2)).batch([0])
    assert bool(depth_valid(points.values, 1e-3, 10.0).all())
    wider = depth_valid(target, 1e-3, 100.0)  # a dataset's own range: the 60 m pixel counts
    assert float(silog_loss(pred, target, 1e-3, 100.0)) == pytest.approx(reference(wider), rel=1e-5)
    far = PointSampler([target], "depth", None, 4000, torch.Generator().manual_seed(2), (1e-3, 100.0)).batch([0])
    assert bool((far.values == 60.0).any()) and bool(depth_valid(far.values, 1e-3, 100.0).all())
