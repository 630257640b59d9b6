"""What an attention site delivers once per forward pass: a ``Capture`` (layout, probabilities, softmax inputs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from vitscope.attention import AttentionEvent
from vitscope.metrics import SoftmaxInputs
from vitscope.models.capture.layout import TokenLayout


@dataclass
class Capture:
    """One layer's attention on one batch: ``layout``, ``probs()`` (B, heads, Tq, Tk) in canonical form, and
    ``softmax_qk`` (``SoftmaxInputs``) for an unmasked softmax whose canonical form is its raw one, else None.
    ``parts``: for a batch whose images have different layouts (NaFlexVit), the same attention split into groups of
    images with one layout each and padding tokens removed; metrics read the parts, maps the whole."""

    layout: TokenLayout
    probs: Callable[[], Tensor]
    softmax_qk: SoftmaxInputs | None = None
    parts: list[Capture] | None = None


Observer = Callable[[Capture], None]


def plain_capture(event: AttentionEvent, layout: TokenLayout, parts: list[Capture] | None = None) -> Capture:
    """The ``Capture`` of one plain-ViT attention event (softmax inputs kept for an unmasked softmax)."""
    qk = SoftmaxInputs(event.q, event.k, event.scale) if event.is_softmax and event.attn_mask is None else None
    return Capture(layout, lambda: event.probs, qk, parts)


def hooks_removed(handles: list) -> Callable[[], None]:
    """A detach function that removes these torch hook handles (what a site's ``attach`` returns)."""
    def detach() -> None:
        for handle in handles:
            handle.remove()

    return detach
