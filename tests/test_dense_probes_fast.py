"""Point-sampled dense losses, tiled evaluation and the memory of a depth probe (issue 25)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitscope.data.dense import synthetic_dense
from vitscope.models import create
from vitscope.probes.dense.heads import depth_bins
from vitscope.probes.dense.points import PointSampler, depth_at, logits_at, point_cross_entropy, point_silog, rows_at
from vitscope.probes.dense.probe import dense_probe, fit_dense_head, iter_predictions, silog_loss
from vitscope.probes.dense.settings import DenseProbeSettings
from vitscope.probes.dense.tiles import predict_full


def _labels(generator: torch.Generator) -> list[torch.Tensor]:
    """Class maps of 3 images of 24 x 36 whose valid (not 255) fractions differ: 1, ~0.5 and ~0.1."""
    labels = [torch.randint(0, 5, (24, 36), generator=generator) for _ in range(3)]
    labels[1][:, 18:] = 255
    labels[2][:, 4:] = 255
    return labels


def test_point_sampled_cross_entropy_is_unbiased_for_the_full_resolution_loss(one_thread):
    generator = torch.Generator().manual_seed(0)
    labels = _labels(generator)
    logits = torch.randn(3, 5, 6, 9, generator=generator) * 2
    labels[2][labels[2] != 255] = 0
    logits[2, 0] += 8  # the images differ in how hard their pixels are: the third (few valid pixels) is easy
    full = F.cross_entropy(F.interpolate(logits, size=(24, 36), mode="bilinear", align_corners=False),
                           torch.stack(labels), ignore_index=255)
    sampler = PointSampler(labels, "segmentation", 255, 64, torch.Generator().manual_seed(1))
    draws, unweighted = [], []
    for _ in range(300):
        points = sampler.batch([0, 1, 2])
        sampled = logits_at(logits, points.grid)
        draws.append(point_cross_entropy(sampled.transpose(1, 2), points))
        per_point = F.cross_entropy(sampled, points.values, reduction="none")
        unweighted.append(per_point.mean())  # every image weighted alike: biased when valid counts differ
    draws, unweighted = torch.stack(draws), torch.stack(unweighted)
    standard_error = draws.std() / len(draws) ** 0.5
    # unbiased: the mean of 300 draws lies within 4 standard errors (about 1 % of the loss here) of the full loss
    assert abs(draws.mean() - full) < 4 * standard_error
    assert abs(unweighted.mean() - full) > 10 * standard_error  # the test can tell a biased estimator
    assert all(bool((p.values != 255).all()) for p in [sampler.batch([1, 2])])  # only valid pixels drawn


def test_point_sampled_silog_matches_the_full_loss_up_to_its_small_bias(one_thread):
    generator = torch.Generator().manual_seed(2)
    depth = [torch.rand(30, 40, generator=generator) * 9 + 0.5 for _ in range(2)]
    depth[1][:, :30] = 0  # no measurement on three quarters of the second image
    logits = torch.randn(2, 256, 5, 5, generator=generator)
    bins = depth_bins(1e-3, 10.0)
    full = silog_loss(depth_at(F.interpolate(logits, size=(30, 40), mode="bilinear", align_corners=False), bins),
                      torch.stack(depth))
    sampler = PointSampler(depth, "depth", None, 256, torch.Generator().manual_seed(3))
    draws = []
    for _ in range(200):
        points = sampler.batch([0, 1])
        draws.append(point_silog(depth_at(logits_at(logits, points.grid), bins), points))
    draws = torch.stack(draws)
    # the two moments are unbiased; the square root of their combination is biased by O(1 / points) only
    assert abs(draws.mean() - full) < 4 * draws.std() / len(draws) ** 0.5 + 0.002 * full


def test_points_read_the_same_values_as_the_full_resolution_upsampling():
    logits = torch.randn(1, 7, 5, 6)
    labels = [torch.zeros(17, 23, dtype=torch.long)]
    points = PointSampler(labels, "segmentation", None, 300, torch.Generator().manual_seed(0)).batch([0])
    full = F.interpolate(logits, size=(17, 23), mode="bilinear", align_corners=False)[0].flatten(1)
    x, y = points.grid[0, 0].unbind(-1)
    flat = (((y + 1) * 17 - 1) / 2).round().long() * 23 + (((x + 1) * 23 - 1) / 2).round().long()
    torch.testing.assert_close(logits_at(logits, points.grid)[0], full[:, flat], atol=1e-5, rtol=0)
    table = logits.flatten(2).transpose(1, 2)  # channel-last (1, rows * cols, C), as training reads it
    torch.testing.assert_close(rows_at(table, points.corners((5, 6)))[0].T, full[:, flat], atol=1e-5, rtol=0)


@pytest.mark.parametrize("task", ["segmentation", "depth"])
def test_tiled_prediction_equals_untiled_exactly(task):
    channels = 9 if task == "segmentation" else 256
    logits = torch.randn(channels, 14, 14, generator=torch.Generator().manual_seed(4)) * 3
    bins = depth_bins(1e-3, 10.0)
    for size in [(97, 131), (13, 9)]:
        untiled = predict_full(logits, size, task, bins, tile_values=1 << 40)
        for tile_values in (channels * size[1] * 7, 1):  # 7 rows per tile; one row per tile
            assert torch.equal(predict_full(logits, size, task, bins, tile_values), untiled)
        reference = F.interpolate(logits[None], size=size, mode="bilinear", align_corners=False)
        if task == "segmentation":  # the upsampling itself is F.interpolate's to rounding
            top2 = reference[0].topk(2, dim=0).values
            clear = (top2[0] - top2[1]) > 1e-4
            assert torch.equal(untiled[clear], reference[0].argmax(0)[clear])
        else:
            torch.testing.assert_close(untiled, depth_at(reference, bins)[0], atol=1e-4, rtol=1e-5)


def test_tiled_probe_predictions_equal_untiled_exactly(one_thread):
    generator = torch.Generator().manual_seed(5)
    maps = torch.randn(4, 6, 3, 4, generator=generator)
    depth = [torch.rand(21, 28, generator=generator) * 5 + 0.5 for _ in range(4)]
    head = fit_dense_head(maps, depth, "depth", epochs=2, batch_size=4, loss_points=32)
    tiled = list(iter_predictions(head, maps, [(21, 28)] * 4, "depth", tile_values=256 * 28 * 2))
    untiled = list(iter_predictions(head, maps, [(21, 28)] * 4, "depth", tile_values=1 << 40))
    assert all(torch.equal(a, b) for a, b in zip(tiled, untiled, strict=True))


def _pixel_backbone() -> torch.nn.Module:
    """vit-micro whose tokens are its patches' pixels and position: patch embedding = identity on the 48 pixel
    values, a one-hot row and column, blocks with zero residual branches (a backbone that keeps what the labels
    depend on, unmixed; its random twin mixes it)."""
    torch.manual_seed(0)
    model = create("vit-micro")
    with torch.no_grad():
        proj = model.patch_embed.proj
        proj.weight.zero_()
        proj.bias.zero_()
        proj.weight.view(64, -1)[:48].copy_(torch.eye(48))
        model.pos_embed.zero_()  # (1, 1 + 64, 64): dims 48-55 one-hot the patch row, 56-63 its column
        grid = torch.arange(64)
        model.pos_embed[0, 1:, 48:56] = F.one_hot(grid // 8, 8).float()
        model.pos_embed[0, 1:, 56:64] = F.one_hot(grid % 8, 8).float()
        for block in model.blocks:
            for module in block.modules():
                if isinstance(module, torch.nn.Linear) and module.out_features == 64:
                    module.weight.zero_()
                    module.bias.zero_()
    return model


@pytest.mark.parametrize("task,metric", [("segmentation", "miou"), ("depth", "rmse")])
def test_both_losses_rank_a_pixel_backbone_and_a_random_one_alike(task, metric, one_thread, tmp_path):
    model = _pixel_backbone()
    train, held = synthetic_dense(task, "train", 32), synthetic_dense(task, "eval", 16)
    scores = {}
    for points in ("full", 256):
        result = dense_probe(model, train, held, "last", DenseProbeSettings(
            with_cls=(False,), epochs=6, norm=False, cache=tmp_path, progress=False, loss_points=points))
        assert result.settings["loss_points"] == points
        scores[points] = [result.value(4, metric=metric, model=name, with_cls=False)
                          for name in ("model", "model (random init)")]
    better = (lambda a, b: a > b) if metric == "miou" else (lambda a, b: a < b)
    assert better(*scores["full"]) == better(*scores[256]), scores
    gap = abs(scores["full"][0] - scores["full"][1])
    assert all(abs(scores["full"][i] - scores[256][i]) < gap for i in (0, 1)), scores  # losses agree closer


def test_depth_probe_peak_memory_is_flat_in_images_and_batch_size(tmp_path: Path):
    script = textwrap.dedent("""
        import json, resource, sys
        import torch
        from vitscope.probes.dense.probe import fit_dense_head, iter_predictions
        images, batch = int(sys.argv[1]), int(sys.argv[2])
        torch.manual_seed(0)
        maps = torch.randn(images, 32, 14, 14)
        depth = [torch.rand(480, 640) * 9 + 0.5 for _ in range(images)]
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        head = fit_dense_head(maps, depth, "depth", epochs=1, batch_size=batch, loss_points=1024)
        for pred in iter_predictions(head, maps, [(480, 640)] * images, "depth"):
            assert pred.shape == (480, 640) and bool(pred.isfinite().all())
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"base_kb": base, "peak_kb": peak}))
    """)
    path = tmp_path / "memory.py"
    path.write_text(script)
    env_src = str(Path(__file__).resolve().parents[1] / "src")
    runs = {}
    for images, batch in [(1, 1), (3, 3)]:
        out = subprocess.run([sys.executable, str(path), str(images), str(batch)], capture_output=True, text=True,
                             env={"PYTHONPATH": env_src, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                             timeout=300, check=True)
        runs[images] = json.loads(out.stdout.strip().splitlines()[-1])
    # the depth labels themselves (1.2 MB per image) are the only part that should grow with the number of images;
    # a (batch, 256 bins, 480, 640) volume (before: in training and per evaluated image) adds 315 MB per image of
    # the batch, several times over with the softmax and the gradients. Flat: the working set (a few 16 MB tiles,
    # the step's points) can show once beside the import's peak, which hides it in the smaller run.
    labels_mb = (3 - 1) * 480 * 640 * 4 / 2**20
    growth_mb = (runs[3]["peak_kb"] - runs[1]["peak_kb"]) / 1024
    assert growth_mb < labels_mb + 120, runs


def test_cli_loss_points_is_recorded_and_a_bad_value_is_one_line(tmp_path, capsys, one_thread):
    from vitscope.cli import main

    code = main(["probe", "segment", "--loss-points", "many", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "'many'" in err and "Traceback" not in err
    out = tmp_path / "full"
    code = main(["probe", "segment", "--num-images", "2", "--train-images", "4", "--epochs", "1", "--no-baseline",
                 "--no-cache", "--with-cls", "no", "--loss-points", "full", "--out", str(out)])
    assert code == 0
    assert json.loads((out / "results.json").read_text())["settings"]["loss_points"] == "full"


@pytest.mark.parametrize("task", ["segmentation", "depth"])
def test_heads_of_two_backbones_in_one_pass_equal_heads_trained_apart(task, one_thread):
    from vitscope.probes.dense.heads import fit_heads
    from vitscope.probes.dense.modules import HeadInputs

    generator = torch.Generator().manual_seed(7)
    maps = {name: torch.randn(6, 5, 3, 4, generator=generator) for name in ("model", "twin")}
    if task == "segmentation":
        targets = [torch.randint(0, 4, (15, 20), generator=generator) for _ in range(6)]
        options = {"num_classes": 4}
    else:
        targets = [torch.rand(15, 20, generator=generator) * 5 + 0.5 for _ in range(6)]
        options = {}
    common = {"epochs": 3, "batch_size": 4, "loss_points": 64, "with_cls": (False,), **options}
    joint = fit_heads({(name, 0): HeadInputs.from_maps(m) for name, m in maps.items()}, targets, task, **common)
    for name, m in maps.items():
        alone = fit_heads({0: HeadInputs.from_maps(m)}, targets, task, **common)[0, False]
        together = joint[(name, 0), False]
        for a, b in zip(alone.parameters(), together.parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
