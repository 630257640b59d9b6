"""DINOv2's depth-head order (bins on the patch grid upsampled x4, then the depth resized) against references."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from vitscope.probes.dense.bin_norm import depth_from_bins
from vitscope.probes.dense.depth_grid import DEPTH_UPSAMPLE, grid_depth, resize_depth
from vitscope.probes.dense.heads import depth_bins
from vitscope.probes.dense.modules import HeadInputs
from vitscope.probes.dense.points import PointSampler, cells_at, rows_at
from vitscope.probes.dense.probe import dense_probe, fit_dense_head, iter_predictions
from vitscope.probes.dense.settings import DenseProbeSettings


def _reference_depth(table: torch.Tensor, bins: torch.Tensor, factor: int = DEPTH_UPSAMPLE) -> torch.Tensor:
    """F.interpolate of the logits, then probes.bin_norm's depth per head: (B, f rows, f cols, heads)."""
    logits = F.interpolate(table.permute(0, 3, 1, 2), scale_factor=factor, mode="bilinear", align_corners=False)
    return torch.stack([depth_from_bins(chunk, bins) for chunk in logits.split(len(bins), dim=1)], -1)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), rows=st.integers(1, 6), cols=st.integers(1, 6), heads=st.integers(1, 3),
       nbins=st.integers(2, 12), factor=st.sampled_from([1, 2, 4]), seed=st.integers(0, 10**6))
def test_grid_depth_equals_interpolate_then_bins_with_its_gradient(batch, rows, cols, heads, nbins, factor, seed):
    generator = torch.Generator().manual_seed(seed)
    table = torch.randn(batch, rows, cols, heads * nbins, generator=generator, dtype=torch.float64)
    table.requires_grad_(True)
    bins = torch.linspace(1e-3, 10.0, nbins, dtype=torch.float64)
    ours, reference = grid_depth(table, bins, factor), _reference_depth(table, bins, factor)
    torch.testing.assert_close(ours, reference, atol=1e-12, rtol=1e-12)
    weights = torch.randn(ours.shape, generator=generator, dtype=torch.float64)
    (grad,) = torch.autograd.grad(ours, table, weights)
    (expected,) = torch.autograd.grad(reference, table, weights)
    torch.testing.assert_close(grad, expected, atol=1e-11, rtol=1e-10)


def test_grid_depth_passes_gradcheck():
    table = torch.randn(2, 3, 4, 2 * 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    bins = torch.linspace(0.5, 4.0, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: grid_depth(t, bins), (table.requires_grad_(True),))


def test_the_head_predicts_what_dinov2s_bnhead_computes(one_thread):
    """DINOv2's BNHead (upsample=4): features resized x4, batch norm, 1x1 conv to 256 bins, ReLU + 0.1 over the
    sum, the weighted bin centres, the depth resized to the label; built here from torch modules in that order."""
    generator = torch.Generator().manual_seed(2)
    maps = torch.randn(3, 8, 5, 6, generator=generator) * 2 + 1
    depth = [torch.rand(37, 45, generator=generator) * 8 + 0.5 for _ in range(3)]
    head = fit_dense_head(maps, depth, "depth", epochs=2, batch_size=3, loss_points=64)
    standardiser = head.standardiser
    norm = nn.BatchNorm2d(8, eps=1e-5).eval()
    with torch.no_grad():
        norm.running_mean.copy_(standardiser.mean)
        norm.running_var.copy_(standardiser.scale.double().pow(-2).sub(1e-5).float())
        norm.weight.copy_(head.gamma)
        norm.bias.copy_(head.beta)
    conv = nn.Conv2d(8, 256, kernel_size=1)
    with torch.no_grad():
        conv.weight.copy_(head.linear.weight[:, :, None, None])
        conv.bias.copy_(head.linear.bias)
    bins = depth_bins(1e-3, 10.0)
    with torch.no_grad():
        features = F.interpolate(maps, scale_factor=4, mode="bilinear", align_corners=False)
        logits = conv(norm(features))
        weights = logits.relu() + 0.1
        expected = torch.einsum("ikmn,k->imn", weights / weights.sum(1, keepdim=True), bins)[:, None]
        expected = F.interpolate(expected, size=(37, 45), mode="bilinear", align_corners=False)[:, 0]
    ours = torch.stack(list(iter_predictions(head, maps, [(37, 45)] * 3, "depth")))
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-5)


def test_points_read_the_resized_depth_map_exactly():
    depth = torch.rand(2, 12, 16, 3, generator=torch.Generator().manual_seed(3)) * 9
    labels = [torch.ones(41, 50) for _ in range(2)]
    points = PointSampler(labels, "depth", None, 500, torch.Generator().manual_seed(4)).batch([0, 1])
    sampled = cells_at(depth.flatten(1, 2), points.corners((12, 16)))  # (B, K, heads)
    for h in range(3):
        full = resize_depth(depth[..., h], (41, 50))
        expected = full[torch.arange(2)[:, None], points.rows, points.cols]
        torch.testing.assert_close(sampled[..., h], expected, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(sampled, rows_at(depth.flatten(1, 2), points.corners((12, 16))))


def test_the_x4_grid_is_trained_and_recorded_and_label_resolution_stays_available(one_thread, tmp_path):
    from vitscope.data.dense import synthetic_dense
    from vitscope.models import create

    torch.manual_seed(0)
    model = create("vit-micro")
    train, held = synthetic_dense("depth", "train", 8), synthetic_dense("depth", "eval", 4)
    results = {}
    for resolution in ("x4", "label"):
        results[resolution] = dense_probe(model, train, held, "last", DenseProbeSettings(
            with_cls=(False,), epochs=2, cache=tmp_path, baseline=False, progress=False, bin_resolution=resolution))
        settings_ = results[resolution].settings
        assert settings_["bin_resolution"] == resolution and "depth_head" in settings_
    rmse = {k: r.value(4, metric="rmse", model="model", with_cls=False) for k, r in results.items()}
    assert rmse["x4"] != rmse["label"] and abs(rmse["x4"] - rmse["label"]) < 0.25 * rmse["label"], rmse
    with pytest.raises(ValueError, match="'x8'"):
        dense_probe(model, train, held, "last", DenseProbeSettings(bin_resolution="x8", progress=False, cache=False))


def test_x4_training_lowers_the_full_resolution_loss_it_estimates(one_thread):
    """The heads' point loss estimates DINOv2's full-resolution loss: training on it lowers that loss."""
    from vitscope.probes.dense.heads import fit_heads, silog_loss

    generator = torch.Generator().manual_seed(5)
    maps = torch.randn(6, 4, 4, 5, generator=generator)
    truth = 2 + maps[:, :1].abs()  # depth the features determine
    depth = [resize_depth(t, (24, 30))[0] for t in truth]
    inputs = {0: HeadInputs.from_maps(maps)}

    def full_loss(epochs: int) -> float:
        head = fit_heads(inputs, depth, "depth", epochs=epochs, batch_size=6, loss_points=128)[0, False]
        preds = torch.stack(list(iter_predictions(head, maps, [(24, 30)] * 6, "depth")))
        return float(silog_loss(preds, torch.stack(depth)))

    assert full_loss(100) < 0.4 * full_loss(1)


def test_cli_bin_resolution_is_recorded(tmp_path, one_thread):  # a bad value: tests/test_bad_inputs.py
    import json

    from vitscope.cli import main

    out = tmp_path / "label"
    code = main(["probe", "depth", "--num-images", "2", "--train-images", "4", "--epochs", "1", "--no-baseline",
                 "--no-cache", "--with-cls", "no", "--bin-resolution", "label", "--out", str(out)])
    assert code == 0
    settings_ = json.loads((out / "results.json").read_text())["settings"]
    assert settings_["bin_resolution"] == "label" and "every label pixel" in settings_["depth_head"]
