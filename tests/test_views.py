"""vitscope.data.pixels.View: its geometry against torchvision's own transforms, boxes that follow the pixels, and
cache keys that stay those of before for the views no model named."""

import pytest
import torch
from torchvision.transforms import v2

from vitscope.data.pixels import View, eval_view, view_boxes


@pytest.mark.parametrize("height, width", [(333, 257), (257, 333), (60, 60), (101, 64)])
def test_a_shortest_edge_view_with_rounded_offsets_is_torchvisions_resize_and_centre_crop(height, width):
    image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    view = View(56, 0.875, "bicubic", keep_square=False)
    reference = v2.Compose([v2.Resize(64, interpolation=v2.InterpolationMode.BICUBIC, antialias=True),
                            v2.CenterCrop(56)])
    assert torch.equal(view(image), reference(image))
    squash = View(56, 0.875, "bilinear", "squash", keep_square=False)
    assert torch.equal(squash(image), v2.Compose([v2.Resize((64, 64), antialias=True), v2.CenterCrop(56)])(image))


def test_floor_offsets_cut_one_pixel_earlier_where_rounding_goes_up():
    """125 x 26 at side 26 (no resize): 99 rows to cut, 3 modulo 4; torchvision rounds 49.5 to 50, transformers
    cuts at 49. At 98 rows (124 x 26) both cut at 49."""
    image = torch.arange(125 * 26, dtype=torch.float32).reshape(1, 125, 26)
    rounded, floored = View(26, keep_square=False), View(26, crop_offset="floor", keep_square=False)
    assert torch.equal(rounded(image)[0, 0], image[0, 50]) and torch.equal(floored(image)[0, 0], image[0, 49])
    assert torch.equal(rounded(image[:, :124]), floored(image[:, :124]))


@pytest.mark.parametrize("view", [View(48, 0.8), View(48, 0.9, "bicubic", "squash", keep_square=False),
                                  View(48, 1.0, "bilinear", "shortest", 60, "floor", False)])
def test_boxes_follow_the_pixels_of_every_view(view):
    """A white rectangle on black, and its box: after the view, the box is where the white pixels are."""
    image = torch.zeros(3, 90, 130, dtype=torch.uint8)
    image[:, 20:70, 30:110] = 255
    box = torch.tensor([[30.0, 20.0, 110.0, 70.0]])
    moved = view_boxes(box, (90, 130), view)[0]
    white = view(image)[0] > 127
    rows, cols = torch.nonzero(white.any(1)).flatten(), torch.nonzero(white.any(0)).flatten()
    found = torch.tensor([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], dtype=torch.float32)
    assert (moved - found).abs().max() <= 1.0, (moved.tolist(), found.tolist())


def test_cache_keys_of_views_no_model_named_are_those_of_before():
    assert View(24, 0.875).key() == [24, 0.875]
    assert View(24, 1.0, "bicubic").key() == [24, 1.0, "bicubic"]
    assert View(24, 0.9, "bicubic", keep_square=False).key() == [24, 0.9, "bicubic", {"keep_square": False}]
    square = torch.randint(0, 256, (3, 24, 24), dtype=torch.uint8)
    assert torch.equal(eval_view(square, 24, 0.875), square)  # kept: no model named this view
    assert not torch.equal(View(24, 0.875, keep_square=False)(square), square)  # a model's crop is followed
    with pytest.raises(ValueError, match="view resize 'fit' is unknown; use shortest or squash"):
        View(24, resize="fit")
