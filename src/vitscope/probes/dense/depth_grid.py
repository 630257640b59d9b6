"""DINOv2's linear depth head in its own order: logits upsampled x4, the bins normalised there, then the depth resized.

DINOv2's ``BNHead`` (``upsample=4``, 256 bins, ``norm_strategy="linear"``) resizes the patch features x4
bilinearly, applies the 1x1 convolution, normalises the bins (ReLU + 0.1 over the sum) and sums the bin centres
at that grid; its loss and its prediction resize this one-channel depth map bilinearly to the label
(``DepthBaseDecodeHead.losses``, ``align_corners=False``). Batch norm with fixed statistics and the 1x1 map are
affine per pixel and bilinear weights sum to 1, so resizing the features x4 first equals resizing the logits x4,
which is what is computed here (``bin_resolution="x4"``, the default). ``"label"`` normalises the bins at every
label pixel instead (the logits resized to the label first: vitscope's earlier protocol, ``dense.tiles``).

Cost: the (B, 4 rows, 4 cols, heads x 256) logit volume is the largest array and is never held whole.
``grid_depth`` computes it one output row at a time (small enough to stay in cache), in the forward pass and again
(recomputed) in the backward pass, and keeps only the (B, 4 rows, 4 cols, heads) depth: each pass over the whole
volume would be a trip through memory, which is what a training step on a CPU spends its time on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vitscope.probes.dense.bin_norm import LINEAR_EPS
from vitscope.probes.dense.tiles import source_index

DEPTH_UPSAMPLE = 4  # DINOv2's linear depth head: features (here: logits) resized x4 before the bins
BIN_RESOLUTIONS = ("x4", "label")
DEFAULT_BIN_RESOLUTION = "x4"


def check_bin_resolution(value: str) -> str:
    if value not in BIN_RESOLUTIONS:
        raise ValueError(f"bin resolution {value!r} is unknown; use 'x4' (DINOv2's head: bins on the patch grid "
                         "upsampled x4, then the depth resized) or 'label' (bins at every label pixel)")
    return value


def interpolation_matrix(out_size: int, in_size: int, device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float32) -> Tensor:
    """(out_size, in_size) bilinear resizing along one axis (``F.interpolate``'s ``align_corners=False``)."""
    low, high, w_low, w_high = source_index(out_size, in_size, device)
    matrix = torch.zeros(out_size, in_size, device=device, dtype=dtype)
    rows = torch.arange(out_size, device=device)
    matrix.index_put_((rows, low), w_low.to(dtype), accumulate=True)
    matrix.index_put_((rows, high), w_high.to(dtype), accumulate=True)
    return matrix


def _row_sources(out_rows: int, rows: int) -> list[tuple[int, int, float]]:
    """Per output row of a bilinear resizing: its two source rows and the weight of the second."""
    low, high, _, frac = (t.tolist() for t in source_index(out_rows, rows))
    return [(lo, hi, 0.0 if lo == hi else f) for lo, hi, f in zip(low, high, frac, strict=True)]


def _resize_row(resized: Tensor, steps: Tensor, low: int, high: int, frac: float, out: Tensor) -> Tensor:
    """Output row = source row ``low`` + ``frac`` x (row ``high`` - row ``low``), into ``out``."""
    if frac == 0:
        return out.copy_(resized[low])
    return torch.add(resized[low], steps[low], alpha=frac, out=out)


class _GridDepth(torch.autograd.Function):
    """Channel-last logits (B, rows, cols, heads * bins) -> depth (B, f rows, f cols, heads).

    The columns are resized once, into a row-major (rows, B * f cols * channels) matrix; each output row is then
    its first source row plus a fraction of the step to the next, normalised and reduced over the bins while it is
    in cache (and again, recomputed, in the backward pass). Every row reuses one buffer. (Making the f rows that
    share two source rows in one operation was slower: their arrays no longer fit the cache.)"""

    @staticmethod
    def forward(ctx, table: Tensor, bins: Tensor, factor: int) -> Tensor:  # noqa: D102
        batch, rows, cols, channels = table.shape
        nbins = len(bins)
        out_rows, out_cols = factor * rows, factor * cols
        col_matrix = interpolation_matrix(out_cols, cols, table.device, table.dtype)
        resized = torch.matmul(col_matrix, table.transpose(0, 1).reshape(rows * batch, cols, channels))
        resized = resized.view(rows, -1)  # (rows, B * out_cols * channels): columns resized, rows not yet
        steps = resized[1:] - resized[:-1]
        bins = bins.to(table.dtype)
        numerator = table.new_empty(out_rows, resized.shape[1] // nbins)  # (out rows, B * out cols * heads)
        denominator = torch.empty_like(numerator)
        up = torch.empty_like(resized[0])
        for row, (low, high, frac) in enumerate(_row_sources(out_rows, rows)):
            weights = _resize_row(resized, steps, low, high, frac, up).relu_().view(-1, nbins)
            torch.mv(weights, bins, out=numerator[row])
            torch.sum(weights, 1, out=denominator[row])
        denominator += LINEAR_EPS * nbins
        depth = (numerator + LINEAR_EPS * float(bins.sum())) / denominator
        ctx.save_for_backward(resized, steps, bins, depth, denominator, col_matrix)
        ctx.shape = table.shape
        return depth.view(out_rows, batch, out_cols, -1).transpose(0, 1).contiguous()

    @staticmethod
    def backward(ctx, grad_depth: Tensor):  # noqa: D102
        resized, steps, bins, depth, denominator, col_matrix = ctx.saved_tensors
        batch, rows, cols, channels = ctx.shape
        nbins = len(bins)
        out_rows = len(depth)
        scale = grad_depth.transpose(0, 1).reshape(out_rows, -1) / denominator  # d depth / d weight_k x denominator
        grad_resized = torch.empty_like(resized)
        written: set[int] = set()  # source rows holding a gradient (the others are not zero-filled yet)

        def accumulate(source: int, values: Tensor, weight: float) -> None:
            if source in written:
                grad_resized[source].add_(values, alpha=weight)
            else:
                torch.mul(values, weight, out=grad_resized[source])
                written.add(source)

        up = torch.empty_like(resized[0])
        per_bin = torch.empty_like(up).view(-1, nbins)
        for row, (low, high, frac) in enumerate(_row_sources(out_rows, rows)):
            mask = _resize_row(resized, steps, low, high, frac, up).relu_().sign_()  # ReLU's gradient (0 at 0)
            torch.sub(bins[None], depth[row, :, None], out=per_bin).mul_(scale[row, :, None])  # scale (bin - depth)
            flat = per_bin.view(-1).mul_(mask)
            accumulate(low, flat, 1 - frac)
            if frac:
                accumulate(high, flat, frac)
        for source in set(range(rows)) - written:
            grad_resized[source].zero_()
        grad = torch.matmul(col_matrix.T, grad_resized.view(rows * batch, -1, channels))  # (rows * B, cols, C)
        return grad.view(rows, batch, cols, channels).transpose(0, 1), None, None


def grid_depth(table: Tensor, bins: Tensor, factor: int = DEPTH_UPSAMPLE) -> Tensor:
    """Channel-last logits (B, rows, cols, heads * bins) -> depth in metres (B, factor * rows, factor * cols, heads):
    the logits resized ``factor`` x bilinearly, DINOv2's linear bin normalisation, the weighted bin centres."""
    if table.shape[-1] % len(bins):
        raise ValueError(f"{table.shape[-1]} logit channels are not a whole number of heads of {len(bins)} bins")
    return _GridDepth.apply(table, bins.to(table.device, table.dtype), factor)


def resize_depth(depth: Tensor, size: tuple[int, int]) -> Tensor:
    """(B, rows, cols) depth maps -> (B, H, W), bilinear (``align_corners=False``), as DINOv2 resizes its head's
    depth to the label."""
    return F.interpolate(depth[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]


@torch.no_grad()
def predict_depth_x4(logits: Tensor, size: tuple[int, int], bins: Tensor) -> Tensor:
    """One image's (bins, rows, cols) logits -> (H, W) depth: bins normalised on the x4 grid, the depth resized."""
    depth = grid_depth(logits.float().permute(1, 2, 0)[None], bins)[..., 0]
    return resize_depth(depth, size)[0]
