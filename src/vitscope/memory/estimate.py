"""What a measurement of a plain ViT will hold in memory, from the model's sizes alone (float32 throughout).

A no-grad forward pass holds, per image of a batch, about ``ACTIVATION_COPIES`` tensors of tokens x the widest
per-token activation (the MLP's first layer, ``widest``) at its peak, one block at a time; a metric that reads one
layer's attention probabilities forms them (heads x tokens^2) beside the logits they come from. What a job keeps
per image of the data set (token norms, features) grows with the data set instead. The constants were measured on
timm's DINOv2 ViT-S/14 and ViT-B/14 at 224-518 px on the CPU: the growth of a fresh process's peak RSS from
batches of 1 to batches of 6, with glibc mapping every block over 64 KB on its own so that the peak is the live
set (``tests/test_memory_plan.py`` checks the estimate that way). The instruments run inside
``freed_memory_returned``, which keeps glibc from holding more than that live set in large blocks; ``SLACK`` covers
what its heap keeps of small ones, and docs/benchmarks.md ("Scale") sets the estimates beside measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vitscope.memory.budget import gigabytes

FLOAT = 4  # bytes per float32
HALF = 2  # bytes per float16
ACTIVATION_COPIES = 5  # measured 3.5-4.6 tokens x widest per image at a forward's peak (ViT-S/B, 224-518 px)
MAP_COPIES = 2  # a layer's logits and probabilities, both at once, when a metric forms the probabilities
LOCALITY_MAP_COPIES = 4  # probabilities, their log and two products, for MAD and entropy without the native kernel
SLACK = 160 * 2**20  # once: the allocator's working room, small tensors, the figures a command draws


@dataclass(frozen=True)
class ForwardShape:
    """The sizes that set a plain ViT's memory per image: ``tokens`` (prefix + patches), ``width``, ``widest`` per-
    token activation, ``heads`` (the most in one layer), ``blocks``; ``patch`` size and ``prefix`` tokens give the
    shape at another input side (``at_side``)."""

    tokens: int
    width: int
    widest: int
    heads: int
    blocks: int
    patch: int
    prefix: int

    @property
    def side(self) -> int:
        """The input side in pixels (square grids)."""
        return round((self.tokens - self.prefix) ** 0.5) * self.patch

    def at_side(self, side: int) -> ForwardShape:
        """The same model at input side ``side`` (a multiple of the patch size)."""
        return replace(self, tokens=self.prefix + (side // self.patch) ** 2)

    def forward_bytes(self) -> int:
        """Per image: a forward pass's activations at their peak."""
        return ACTIVATION_COPIES * self.tokens * max(self.widest, self.width) * FLOAT

    def map_bytes(self) -> int:
        """Per image: one layer's attention probabilities, all heads (float32)."""
        return self.heads * self.tokens * self.tokens * FLOAT

    def token_bytes(self) -> int:
        """Per image: one layer's tokens (float32)."""
        return self.tokens * self.width * FLOAT


@dataclass(frozen=True)
class MemoryEstimate:
    """The peak a job will reach at batch size B: ``in_use`` (held now: the process, the weights) + ``fixed`` once
    + B x ``per_batch_image`` + ``num_images`` x ``per_kept_image`` (what it keeps of every image of the data set)."""

    in_use: int
    per_batch_image: int
    per_kept_image: int
    fixed: int
    num_images: int

    def at(self, batch: int) -> int:
        return (self.in_use + self.fixed + SLACK + batch * self.per_batch_image
                + self.num_images * self.per_kept_image)

    def largest_batch(self, limit: int, cap: int) -> int:
        """The largest batch size in 1..``cap`` whose peak stays within ``limit`` bytes; 0 when none does."""
        room = limit - self.at(0)
        if room < self.per_batch_image:
            return 0
        return max(1, min(cap, room // max(self.per_batch_image, 1)))

    def describe(self, batch: int) -> str:
        """The estimate at ``batch`` in words, its parts named."""
        parts = [f"{gigabytes(self.in_use)} in use", f"{batch} x {gigabytes(self.per_batch_image)} per image of a "
                 "batch"]
        if self.fixed:
            parts.append(f"{gigabytes(self.fixed)} once")
        if self.per_kept_image:
            parts.append(f"{gigabytes(self.num_images * self.per_kept_image)} kept for {self.num_images:,} images")
        return f"about {gigabytes(self.at(batch))} ({' + '.join(parts)})"


def work_estimate(work: str, shape: ForwardShape, in_use: int, num_images: int, *, maps_formed: bool = True,
                  layers: int = 1, kept_in_memory: bool = False) -> MemoryEstimate:
    """The estimate of one job on ``shape``:

    - ``locality``: the forward, and the probabilities of one layer when they are formed (``maps_formed``: no
      native softmax kernel for this model or device);
    - ``norms``: the forward; two token norms per block and image kept (before and after joining the batches);
    - ``census``: the forward; one image's probabilities of one layer at a time (softmax: computed image by image;
      other normalisers: the whole batch, ``maps_formed``); three norms per token layer and image kept;
    - ``features``: the forward and ``layers`` token layers of the batch (float32, then float16); with
      ``kept_in_memory`` (no cache) every image's ``layers`` in float16 too.
    """
    forward, maps, tokens = shape.forward_bytes(), shape.map_bytes(), shape.token_bytes()
    if work == "locality":
        return MemoryEstimate(in_use, forward + (LOCALITY_MAP_COPIES * maps if maps_formed else 0), 0, 0, num_images)
    if work == "norms":
        return MemoryEstimate(in_use, forward, 2 * shape.blocks * shape.tokens * FLOAT, 0, num_images)
    if work == "census":
        batch = forward + (MAP_COPIES * maps if maps_formed else 0)
        return MemoryEstimate(in_use, batch, 3 * (shape.blocks + 1) * shape.tokens * FLOAT, MAP_COPIES * maps,
                              num_images)
    if work == "features":
        kept = layers * shape.tokens * shape.width * HALF if kept_in_memory else 0
        return MemoryEstimate(in_use, forward + layers * (tokens + tokens // 2), kept, 0, num_images)
    raise ValueError(f"work={work!r} is unknown; use locality, norms, census or features")
