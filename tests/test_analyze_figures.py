"""The figures of ``vitscope analyze``: each norm map sits under its own image, token-layer numbering, colour bars."""

import numpy as np
import pytest
import torch

from vitscope.analyze.norms import NormsResult
from vitscope.data import ImageDataset
from vitscope.metrics.norms import Threshold
from vitscope.models import create
from vitscope.models.capture.token_map import token_map
from vitscope.report.figures.analysis import MAX_MAP_IMAGES, norm_figures, norm_map_inputs


def planted(count: int = 40, grid: int = 8, patch: int = 4):
    """Images whose one bright patch sits at position i (image i), labels that make a class-stratified sample
    differ from the first images, and norms whose largest patch is at the same position."""
    images = torch.zeros(count, 3, grid * patch, grid * patch, dtype=torch.uint8)
    norms = torch.ones(count, 1 + grid * grid)
    for i in range(count):
        r, c = divmod(i % (grid * grid), grid)
        images[i, :, r * patch:(r + 1) * patch, c * patch:(c + 1) * patch] = 255
        norms[i, 1 + i % (grid * grid)] = 10.0 + i
    labels = torch.tensor([0] * 30 + [1] * 10)  # the stratified 16 draw from both blocks, the first 16 do not
    data = ImageDataset("planted", "eval", images, labels, ["a", "b"], (0.5,) * 3, (0.25,) * 3)
    return data, norms


def test_each_norm_map_belongs_to_the_image_above_it(tmp_path):
    model = create("vit-micro")
    data, norms = planted()
    assert not torch.equal(data.subset(MAX_MAP_IMAGES).images, data.images[:MAX_MAP_IMAGES])  # the old bug's premise
    result = NormsResult([norms, norms], ["blocks.0", "blocks.1"], token_map(model), Threshold("absolute:5", 5.0), 1)
    shown, maps = norm_map_inputs(result, model, data)
    assert len(shown) == len(maps) == MAX_MAP_IMAGES
    for image, norm_map in zip(shown, maps, strict=True):
        bright = image.mean(-1).reshape(8, 4, 8, 4).mean((1, 3))  # (8, 8) brightness per patch
        assert np.unravel_index(bright.argmax(), bright.shape) == np.unravel_index(norm_map.argmax(), norm_map.shape)
    files = norm_figures(result, model, data, tmp_path, label="vit-micro, random weights")
    assert files["maps"].exists() and files["histograms"].exists()


@pytest.fixture
def captured(monkeypatch):
    """Each figure's axes, titles and colour bars, seen as matplotlib saves it."""
    from vitscope.report.figures import common as figures

    seen = []
    real = figures.save_figure

    def spy(fig, path):
        seen.append({"titles": [ax.get_title() for ax in fig.axes], "suptitle": fig._suptitle.get_text()
                     if fig._suptitle else "", "colorbars": sum(ax.get_label() == "<colorbar>" for ax in fig.axes)})
        return real(fig, path)

    import vitscope.report.figures.norms as nf
    monkeypatch.setattr(nf, "save_figure", spy)
    return seen


def test_norm_figures_number_token_layers_and_show_a_colour_bar(tmp_path, captured):
    model = create("vit-micro")
    data, norms = planted()
    result = NormsResult([norms, norms * 2], ["blocks.0", "blocks.1"], token_map(model),
                         Threshold("absolute:5", 5.0), 1)
    norm_figures(result, model, data, tmp_path, label="vit-micro, random weights")
    hist, maps = captured
    assert [t for t in hist["titles"] if t] == ["layer 1", "layer 2"]
    assert "vit-micro, random weights" in hist["suptitle"] and "token layer 2" in maps["suptitle"]
    assert "threshold absolute:5 = 5, set at layer 2" in hist["suptitle"]  # the layer the threshold comes from
    assert maps["colorbars"] == 1


def test_analyze_a_run_folder_measures_on_the_runs_own_data_and_says_so(tmp_path, capsys):
    import json

    from vitscope.cli import main
    from vitscope.models import save_model

    run = tmp_path / "run"
    run.mkdir()
    save_model(create("vit-micro"), run / "model.safetensors")
    config = {"dataset": "synthetic", "data_dir": None, "dataset_options": {"cue": "texture", "num_images": 12}}
    (run / "config.json").write_text(json.dumps({"config": config}))
    common = ["--num-images", "6", "--batch-size", "6", "--device", "cpu"]
    assert main(["analyze", "locality", "--model", str(run), "--out", str(tmp_path / "own"), *common]) == 0
    printed = capsys.readouterr().out
    assert "data: synthetic, eval split, options cue=texture, num_images=12 (the run's config)" in printed
    own = json.loads((tmp_path / "own" / "locality.json").read_text())
    assert own["provenance"]["config"]["dataset_options"] == {"cue": "texture", "num_images": 12}
    # the same data named explicitly, several pairs after one --set, gives the same numbers; shape scenes do not
    explicit = ["--dataset", "synthetic", "--set", "dataset_options.cue=texture", "dataset_options.num_images=12"]
    assert main(["analyze", "locality", "--model", str(run), "--out", str(tmp_path / "set"), *explicit, *common]) == 0
    assert main(["analyze", "locality", "--model", str(run), "--out", str(tmp_path / "shape"), "--dataset",
                 "synthetic", "--set", "dataset_options.num_images=12", *common]) == 0
    mads = {name: [h["mad"] for h in json.loads((tmp_path / name / "locality.json").read_text())["heads"]]
            for name in ("own", "set", "shape")}
    assert mads["own"] == mads["set"] != mads["shape"]
    assert main(["analyze", "norms", "--model", str(run), "--set", "epochs=3", "--out", str(tmp_path)]) == 2
    assert "analyze takes only dataset_options" in capsys.readouterr().err
