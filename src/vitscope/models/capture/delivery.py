"""What an attention site delivers once per forward pass: a ``Capture`` (layout, probabilities, softmax inputs,
logit inputs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from vitscope.attention import AttentionEvent, Normalizer
from vitscope.metrics import SoftmaxInputs
from vitscope.models.capture.layout import TokenLayout


@dataclass(frozen=True)
class LogitInputs:
    """What an unmasked attention's probabilities come from, whatever its normaliser: ``normalizer(scale q k^T)``
    over every key, with queries ``q`` (B, heads, Tq, head_dim) and keys ``k`` (B, heads, Tk, head_dim) after any
    q/k norm and rotary embedding."""

    q: Tensor
    k: Tensor
    scale: float
    normalizer: Normalizer


@dataclass
class Capture:
    """One layer's attention on one batch: ``layout``, ``probs()`` (B, heads, Tq, Tk) in canonical form, and
    ``softmax_qk`` (``SoftmaxInputs``) for an unmasked softmax whose canonical form is its raw one, else None.
    ``parts``: for a batch whose images have different layouts (NaFlexVit), the same attention split into groups of
    images with one layout each and padding tokens removed; metrics read the parts, maps the whole.
    ``logit_inputs`` (``LogitInputs``): for an unmasked attention of any normaliser whose canonical form is its raw
    one (plain ViTs), else None."""

    layout: TokenLayout
    probs: Callable[[], Tensor]
    softmax_qk: SoftmaxInputs | None = None
    parts: list[Capture] | None = None
    logit_inputs: LogitInputs | None = None


Observer = Callable[[Capture], None]


def plain_capture(event: AttentionEvent, layout: TokenLayout, parts: list[Capture] | None = None) -> Capture:
    """The ``Capture`` of one plain-ViT attention event (softmax inputs kept for an unmasked softmax)."""
    unmasked = event.attn_mask is None
    qk = SoftmaxInputs(event.q, event.k, event.scale) if event.is_softmax and unmasked else None
    logits = LogitInputs(event.q, event.k, event.scale, event.normalizer) if unmasked else None
    return Capture(layout, lambda: event.probs, qk, parts, logits)


def hooks_removed(handles: list) -> Callable[[], None]:
    """A detach function that removes these torch hook handles (what a site's ``attach`` returns)."""
    def detach() -> None:
        for handle in handles:
            handle.remove()

    return detach
