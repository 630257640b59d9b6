"""PCA maps recover planted principal axes and colour the patches by them."""

import torch

from vitscope.data import synthetic_scenes
from vitscope.models import create
from vitscope.probes.pca import pca_maps, principal_components, rgb_maps


def test_planted_principal_axes_are_recovered_in_order():
    torch.manual_seed(0)
    axes = torch.linalg.qr(torch.randn(16, 3)).Q.T  # three orthonormal directions
    coefficients = torch.randn(4000, 3) * torch.tensor([5.0, 3.0, 2.0])
    x = coefficients @ axes + 0.01 * torch.randn(4000, 16) + 7.0
    components, explained, mean = principal_components(x)
    cosines = (components.float() @ axes.T).abs()
    assert torch.allclose(cosines.diagonal(), torch.ones(3), atol=1e-3)
    expected = torch.tensor([25.0, 9.0, 4.0]) / (38.0 + 16 * 1e-4)
    torch.testing.assert_close(explained.float(), expected, atol=0.02, rtol=0.05)
    torch.testing.assert_close(mean.float(), torch.full((16,), 7.0), atol=0.2, rtol=0)


def test_two_regions_get_two_colours_and_foreground_blacks_out_the_background():
    patches = torch.zeros(1, 16, 8)
    patches[0, :8, 0] = 5.0  # top half: one feature direction; bottom half: the origin
    patches += 0.01 * torch.randn(1, 16, 8)
    maps, _ = rgb_maps(patches, (4, 4))
    top, bottom = maps[0, :2].reshape(-1, 3), maps[0, 2:].reshape(-1, 3)
    assert (top[:, 0] - bottom[:, 0]).abs().min() > 0.9  # the first component separates them
    masked, _ = rgb_maps(patches, (4, 4), foreground=0.5)
    assert masked[0, 2:].abs().max() == 0  # background (low first component) is black
    assert masked[0, :2].abs().sum() > 0


def test_maps_and_images_have_the_grid_and_image_shapes():
    model = create("vit-micro", num_registers=2)
    result = pca_maps(model, synthetic_scenes("eval", num_images=5), "last", count=4, joint=False, progress=False)
    assert result.maps.shape == (4, 8, 8, 3) and result.images.shape == (4, 32, 32, 3)
    assert result.explained.shape == (4, 3) and 0 <= float(result.maps.min()) and float(result.maps.max()) <= 1
