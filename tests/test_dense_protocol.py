"""The dense probe's protocol (issue 44, issue 46 item 19): heads scheduled by steps with their loss recorded and a
convergence check, each head its own learning rate and weight decay in one pass, a sweep chosen on a held-out part
of the training split only, per-image scoring equal to the per-head path, claim S3 judged per layer, and the
CLI's flags and lines."""

import json
import math

import pytest
import torch

from vitscope.probes.dense.evaluate import segment_confusions
from vitscope.probes.dense.heads import fit_heads
from vitscope.probes.dense.modules import HeadInputs
from vitscope.probes.dense.probe import iter_predictions, spread_layers
from vitscope.probes.dense.scores import DenseProbeResult, segment_rows
from vitscope.probes.dense.sweep import held_out_split, sweep
from vitscope.probes.dense.training import CONVERGED_WITHIN, convergence, steps_for
from vitscope.probes.dense.verdicts import cls_judgements


def _planted(n: int, seed: int, classes: int = 3, noise: float = 0.5) -> tuple[HeadInputs, list[torch.Tensor]]:
    """Patch maps (n, 8, 4, 4) whose first channels one-hot each cell's class, plus noise; labels 16 x 16 (each
    cell a 4 x 4 block)."""
    generator = torch.Generator().manual_seed(seed)
    cells = torch.randint(0, classes, (n, 4, 4), generator=generator)
    maps = torch.randn(n, 8, 4, 4, generator=generator) * noise
    maps[:, :classes] += torch.nn.functional.one_hot(cells, classes).permute(0, 3, 1, 2).float()
    labels = [c.repeat_interleave(4, 0).repeat_interleave(4, 1) for c in cells]
    return HeadInputs.from_maps(maps), labels


def test_steps_come_from_steps_or_epochs_never_both():
    assert steps_for(300, None, 11) == 300
    assert steps_for(None, 20, 2) == 40  # the first measurement's 40 steps: 20 epochs of 2 batches
    assert steps_for(None, None, 11, default=1000) == 1000
    with pytest.raises(ValueError, match="not both"):
        steps_for(10, 2, 11)


def test_a_head_trains_exactly_its_steps_and_records_every_steps_loss(one_thread):
    inputs, labels = _planted(12, 0)
    head = fit_heads({0: inputs}, labels, "segmentation", num_classes=3, steps=37, batch_size=5, loss_points=64,
                     lr=0.05)[0, False]
    summary = head.fit_summary
    assert summary.steps == 37 and len(summary.curve) == 37 and summary.lr == 0.05
    assert summary.epochs == pytest.approx(37 * 5 / 12, abs=0.01)
    assert summary.curve[-1] < summary.curve[0]  # a learnable problem: the loss fell


def test_convergence_flags_a_loss_still_falling_over_the_second_half_and_passes_a_settled_one():
    settled = torch.cat([torch.linspace(2.0, 0.5, 100), torch.full((900,), 0.5)])
    falling = torch.linspace(2.0, 0.5, 1000)
    assert convergence(settled) == (0.0, True)
    change, converged = convergence(falling)
    assert change > CONVERGED_WITHIN and not converged
    assert math.isnan(convergence(torch.ones(10))[0])  # too few steps to judge: not converged


def test_heads_with_their_own_lr_in_one_pass_equal_heads_trained_alone(one_thread):
    inputs, labels = _planted(10, 1)
    common = {"num_classes": 3, "steps": 15, "batch_size": 4, "loss_points": 64, "with_cls": (False,)}
    pairs = [(0.003, 0.0), (0.05, 0.1)]
    joint = fit_heads({pair: inputs for pair in pairs}, labels, "segmentation",
                      hyper={(pair, False): pair for pair in pairs}, **common)
    for pair in pairs:
        alone = fit_heads({0: inputs}, labels, "segmentation", lr=pair[0], weight_decay=pair[1], **common)[0, False]
        for a, b in zip(alone.parameters(), joint[pair, False].parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        assert joint[pair, False].fit_summary.lr == pair[0]


def test_the_held_out_part_is_the_tail_of_the_training_split():
    assert held_out_split(10, 0.2) == (list(range(8)), [8, 9])
    assert held_out_split(3, 0.01) == ([0, 1], [2])
    with pytest.raises(ValueError, match="at least 2 training images"):
        held_out_split(1, 0.2)


def test_the_sweep_chooses_on_held_out_training_images_and_a_learning_rate_that_learns(one_thread):
    inputs, labels = _planted(20, 2)
    options = {"num_classes": 3, "with_cls": (False,), "steps": 40, "batch_size": 8, "loss_points": 64}
    found = sweep({"layer": inputs}, labels, "segmentation", [(1e-6, 0.0), (0.05, 0.0)], held_fraction=0.25,
                  options=options)
    assert found.chosen["layer", False] == (0.05, 0.0)  # 1e-6 cannot move the head in 40 steps
    assert (found.fit_images, found.held_images) == (15, 5)
    scores = {row["lr"]: row["miou"] for row in found.scores}
    assert scores[0.05] > scores[1e-6]
    # the held-out images decide: change only their labels (all to class 0) and the scores change with them
    relabelled = labels[:15] + [torch.zeros_like(t) for t in labels[15:]]
    other = sweep({"layer": inputs}, relabelled, "segmentation", [(1e-6, 0.0), (0.05, 0.0)], held_fraction=0.25,
                  options=options)
    assert [r["miou"] for r in other.scores] != [r["miou"] for r in found.scores]


def test_batched_confusions_equal_each_heads_own_predictions_exactly(one_thread):
    from vitscope.metrics.dense import confusion_matrix

    inputs, labels = _planted(7, 3)
    labels = [torch.nn.functional.interpolate(t[None, None].float(), size=(13, 19))[0, 0].long() for t in labels]
    labels[2][:3] = 255
    heads = fit_heads({k: inputs for k in range(3)}, labels, "segmentation", num_classes=3, ignore_index=255, steps=5,
                      hyper={(k, False): (10.0 ** -k, 0.0) for k in range(3)}, loss_points=32)
    heads = [heads[k, False] for k in range(3)]
    found = segment_confusions(heads, inputs, labels, 3, 255, tile_values=3 * 3 * 19 * 4)  # 4 rows a tile
    for h, head in enumerate(heads):
        own = torch.stack([confusion_matrix(p, t, 3, 255) for p, t in
                           zip(iter_predictions(head, inputs, [(13, 19)] * 7, "segmentation"), labels, strict=True)])
        assert torch.equal(found[h], own)


def _result_with(with_cls: torch.Tensor, without: torch.Tensor) -> DenseProbeResult:
    result = DenseProbeResult("segment", [], task="segmentation")
    for cls, conf in ((True, with_cls), (False, without)):
        result.per_image["m", 4, cls] = conf
        result.rows += segment_rows("m", 4, cls, conf, ["a", "b", "c"])
    return result


def test_s3_is_judged_per_layer_from_the_with_minus_without_interval():
    generator = torch.Generator().manual_seed(4)
    base = torch.randint(20, 60, (2, 30, 3, 3), generator=generator)
    better = base.clone()
    moved = base[..., 0, 1] // 2  # half of the class-0 pixels taken for class 1 become correct
    better[..., 0, 1] -= moved
    better[..., 0, 0] += moved
    found = cls_judgements(_result_with(better, base), "m", scope="planted")
    assert len(found) == 1
    judgement = found[0]
    assert judgement["claim_id"] == "S3" and judgement["layer"] == 4 and judgement["verdict"] == "reproduced"
    assert judgement["ci95_low"] > 0 and judgement["difference"] > 0 and judgement["scope"] == "planted"
    assert {r["with_cls"] for r in judgement["rows"] if r["metric"] == "miou"} == {True, False}
    worse = cls_judgements(_result_with(base, better), "m", scope="planted")[0]
    assert worse["verdict"] == "not reproduced" and worse["ci95_high"] < 0


def test_dense_probes_default_to_layers_spread_over_the_depth():
    assert spread_layers(12) == [0, 3, 6, 9, 12]
    assert spread_layers(4) == [0, 1, 2, 3, 4]


def test_cli_segment_both_writes_judged_claims_the_best_layer_and_a_training_note(tmp_path, capsys, one_thread):
    from vitscope.cli import main

    out = tmp_path / "seg"
    code = main(["probe", "segment", "--num-images", "6", "--train-images", "10", "--steps", "12",
                 "--lr", "0.01,0.1", "--weight-decay", "0", "--head-seeds", "2", "--layers", "0,last",
                 "--no-baseline", "--no-cache", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    claims = payload["claims"]
    assert [c["layer"] for c in claims] == [0, 4] and all(c["claim_id"] == "S3" for c in claims)
    assert all({"difference", "ci95_low", "ci95_high", "verdict", "rows", "scope"} <= set(c) for c in claims)
    settings = payload["settings"]
    assert settings["steps"] == 12 and settings["head_seeds"] == 2 and settings["sweep"]["lrs"] == [0.01, 0.1]
    assert len(settings["sweep"]["scores"]) == 2 * 2 * 2  # 2 layers x 2 CLS settings x 2 pairs
    assert all(h["steps"] == 12 and len(h["curve"]) == 12 for h in settings["heads"])
    assert "best layer of vit-micro among 0,4:" in printed and "claim S3 layer 4:" in printed
    assert "note:" in printed and "had not converged after 12 steps" in printed  # 12 steps cannot be judged
    assert {r["group"] for r in payload["rows"] if r.get("group", "").startswith("seed")} == {"seed 0", "seed 1"}


def test_cli_refuses_a_bad_learning_rate_list_in_one_line(tmp_path, capsys):
    from cli_refusals import refused

    assert "--lr: '0.01,-1' must be comma-separated numbers > 0" in refused(
        ["probe", "segment", "--lr", "0.01,-1", "--out", str(tmp_path / "bad")], capsys)
    assert "--weight-decay: 'x' must be comma-separated numbers >= 0" in refused(
        ["probe", "depth", "--weight-decay", "x", "--out", str(tmp_path / "bad")], capsys)
