"""Attention functions vitscope registers with Hugging Face ``transformers`` (its ``AttentionInterface``).

- ``vitscope_sdpa``: transformers' own SDPA function, called unchanged, after handing the queries and keys it
  receives (after any rotary embedding), the mask and the scale to the observers attached to the module. The fast
  path stays on and outputs are those of ``"sdpa"``.
- ``vitscope_normalized``: the module's ``vitscope_normalizer`` (softmax, sparsemax, entmax-1.5, alpha-entmax, a
  learned alpha) in place of softmax: probabilities normaliser(scale q k^T + mask), dropout, times v; no new
  parameters except a learned alpha. Observers receive the probabilities with the event.

An observer is called as ``observer(event)`` with an ``AttentionEvent``.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.attention import AttentionEvent, Softmax
from vitscope.attention.module import masked_logits

OBSERVED = "vitscope_sdpa"
NORMALIZED = "vitscope_normalized"
_SOFTMAX = Softmax()


def observers(module: nn.Module) -> list:
    """The observers attached to ``module`` (a list kept on the module, not a registered attribute)."""
    return module.__dict__.setdefault("_vitscope_observers", [])


def _scale(query: Tensor, scaling: float | None) -> float:
    return float(scaling if scaling is not None else query.shape[-1] ** -0.5)


def _repeat_kv(module: nn.Module, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    if groups > 1:  # grouped-query attention, as transformers' eager path repeats them
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return key, value


def register(transformers) -> None:
    """Register both functions (and the SDPA mask format for them) with transformers, once."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if OBSERVED in AttentionInterface._global_mapping:
        return

    def observed_sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      **kwargs: Any):
        watching = module.__dict__.get("_vitscope_observers", ())
        if watching:
            k, _ = _repeat_kv(module, key, value)
            event = AttentionEvent(query, k, _scale(query, kwargs.get("scaling")), attention_mask, _SOFTMAX)
            for observer in watching:
                observer(event)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    def normalized(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                   scaling: float | None = None, dropout: float = 0.0, **_kwargs: Any):
        normalizer = module.vitscope_normalizer
        key, value = _repeat_kv(module, key, value)
        scale = _scale(query, scaling)
        probs = normalizer(masked_logits(query * scale, key, attention_mask))
        event = AttentionEvent(query, key, scale, attention_mask, normalizer, probs.detach())
        for observer in module.__dict__.get("_vitscope_observers", ()):
            observer(event)
        out = F.dropout(probs, p=dropout, training=module.training) @ value
        return out.transpose(1, 2).contiguous(), probs

    AttentionInterface.register(OBSERVED, observed_sdpa)
    AttentionInterface.register(NORMALIZED, normalized)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionMaskInterface.register(OBSERVED, sdpa_mask)
        AttentionMaskInterface.register(NORMALIZED, sdpa_mask)
    except ImportError:  # older transformers build masks from the implementation's name alone
        pass
