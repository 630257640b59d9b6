"""Dense metrics against hand-computed answers."""

import math

import pytest
import torch

from vitscope.metrics.dense import confusion_matrix, depth_scores, segmentation_scores


def test_miou_from_a_hand_computed_confusion_with_ignored_pixels_and_an_absent_class():
    target = torch.tensor([[0, 0, 1, 1], [1, 255, 255, 0]])
    pred = torch.tensor([[0, 1, 1, 1], [0, 2, 0, 0]])
    confusion = confusion_matrix(pred, target, 4, ignore_index=255)
    # label 0 at 3 pixels: predicted 0, 1, 0; label 1 at 3 pixels: predicted 1, 1, 0
    assert confusion.tolist() == [[2, 1, 0, 0], [1, 2, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    scores = segmentation_scores(confusion)
    # IoU0 = 2 / (2 + 1 + 1) = 0.5, IoU1 = 2 / 4 = 0.5; classes 2 and 3 absent from both: left out
    assert scores["miou"] == pytest.approx(50.0)
    assert scores["pixel_accuracy"] == pytest.approx(100 * 4 / 6)
    assert scores["iou"][:2] == [50.0, 50.0] and all(math.isnan(v) for v in scores["iou"][2:])
    # a class predicted but never labelled counts, with IoU 0
    assert segmentation_scores(confusion_matrix(torch.tensor([2, 0]), torch.tensor([0, 0]), 3))["miou"] == 25.0


def test_label_outside_the_classes_is_refused():
    with pytest.raises(ValueError, match="label value 7"):
        confusion_matrix(torch.zeros(3), torch.tensor([0, 7, 255]), 4, ignore_index=255)


def test_depth_rmse_is_the_mean_of_per_image_rmse_and_pooled_is_extra():
    gt1, gt2 = torch.full((2, 2), 2.0), torch.tensor([[4.0, 0.0], [4.0, 4.0]])  # 0 = invalid
    pred1, pred2 = torch.full((2, 2), 3.0), torch.tensor([[4.0, 9.0], [4.0, 4.0]])
    scores = depth_scores([(pred1, gt1), (pred2, gt2)])
    assert scores["rmse"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert scores["rmse_pooled"] == pytest.approx(math.sqrt(4 / 7))
    # abs-rel and delta1 per image, then averaged (image 1: 0.5 and 0; image 2: 0 and 1), not pooled (4/7, 3/7)
    assert scores["abs_rel"] == pytest.approx(0.25)
    assert scores["delta1"] == pytest.approx(0.5)


def test_depth_counts_only_ground_truth_in_range():
    gt = torch.tensor([[1e-3, 2.0], [10.0, 12.0]])  # 1e-3 is not above the minimum; 12 m is past max_depth
    pred = torch.tensor([[5.0, 3.0], [10.0, 0.5]])
    scores = depth_scores([(pred, gt)])
    assert scores["rmse"] == pytest.approx(math.sqrt(1 / 2))  # errors 1 and 0 on the two valid pixels
    assert scores["delta1"] == pytest.approx(0.5)
    assert depth_scores([(pred, gt)], max_depth=20.0)["rmse"] == pytest.approx(math.sqrt((1 + 0 + 11.5**2) / 3))
    with pytest.raises(ValueError, match="no valid depth pixels"):
        depth_scores([(pred, torch.full((2, 2), 50.0))])
