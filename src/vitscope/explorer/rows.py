"""Attention rows from queries and keys: what the page stores for a plain layer whose N^2 maps would be large, so
that the browser computes any row itself, exactly, instead of reading it (docs/explore.md, "Size and precision").

A plain layer's row for query i is ``normalizer(scale q_i K^T)`` over every key (CLS, registers, patches), with q and k
as the attention sees them (after q/k norm and rotary embedding: ``vitscope.models.capture.delivery.LogitInputs``). The
page stores, per kept head and image, the queries (T, head_dim) and the keys centred on their mean over the tokens:
every normaliser here (softmax, sparsemax, entmax-1.5, alpha-entmax) gives the same row when a constant is added to all
of a row's logits, and q . (k_j - c) = q . k_j - q . c is such a constant. Centring removes the keys' common part, which
float16 rounding errs on most (on the real ViT-S/14 at 518 px, layer 4's keys reach |k| = 146: float16 rows erred 4.3 %
of the row maximum with raw keys and 0.36 % with centred ones).

Storage is float16 where every row of a head, on every image, stays within ``TOLERANCE`` of the row's maximum
against the float32 row (``row_errors``: all rows, measured when the page is built); other heads keep float32.
``normalize`` is the Python twin of the page's normalisers (static/rows.js), from the same JSON ``spec``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vitscope.attention import (
    Entmax15,
    EntmaxAlpha,
    LearnedEntmax,
    Normalizer,
    Softmax,
    Sparsemax,
    entmax15,
    softmax,
    sparsemax,
)
from vitscope.attention import entmax as alpha_entmax

TOLERANCE = 0.02  # the largest error of a shown row allowed in float16, as a fraction of the row's maximum
ARITHMETIC = 1e-4  # float32 here against float64 in the browser, a fraction of the row maximum, added to errors stated
FORMS = ("auto", "qk", "maps")
# what gzip leaves of each form, measured on the real ViT-S/14 (4 CamVid photos): float16 queries and keys 86 % at
# 518 px (86.3 of 101.0 MB), 8-bit maps 41 % at 224 px (8.0 of 19.3 MB; random-weight maps compress further)
QK_COMPRESSED = 0.86
MAPS_COMPRESSED = 0.45


def normalizer_spec(normalizer: Normalizer, heads: list[int]) -> dict | None:
    """The page's description of ``normalizer`` for the kept ``heads`` (0-based): ``{"kind": softmax | sparsemax
    | entmax15}`` or ``{"kind": "alpha", "alpha": [one per kept head]}``; None for a normaliser the page cannot
    compute (then the layer's maps are stored instead)."""
    if isinstance(normalizer, Softmax):
        return {"kind": "softmax"}
    if isinstance(normalizer, Sparsemax):
        return {"kind": "sparsemax"}
    if isinstance(normalizer, Entmax15):
        return {"kind": "entmax15"}
    if isinstance(normalizer, EntmaxAlpha):
        return {"kind": "alpha", "alpha": [float(normalizer.alpha)] * len(heads)}
    if isinstance(normalizer, LearnedEntmax):
        alphas = normalizer.alpha().detach().double().cpu()
        return {"kind": "alpha", "alpha": [float(alphas[h]) for h in heads]}
    return None


def normalize(logits: Tensor, spec: dict) -> Tensor:
    """Probabilities from ``logits`` (..., kept heads, Tq, Tk) by the page's ``spec`` (``normalizer_spec``)."""
    kind = spec["kind"]
    if kind == "softmax":
        return softmax(logits)
    if kind == "sparsemax":
        return sparsemax(logits)
    if kind == "entmax15":
        return entmax15(logits)
    if kind == "alpha":
        alpha = torch.tensor(spec["alpha"], dtype=logits.dtype, device=logits.device)[:, None, None]
        return alpha_entmax(logits, alpha)
    raise ValueError(f"normaliser kind {kind!r} is unknown; use softmax, sparsemax, entmax15 or alpha")


def centred_keys(k: Tensor) -> Tensor:
    """Keys (..., Tk, head_dim) minus their mean over the keys: the same rows, smaller numbers (module docstring)."""
    return k - k.mean(dim=-2, keepdim=True)


@torch.no_grad()
def row_errors(q: Tensor, k: Tensor, scale: float, spec: dict, reference: Tensor, dtype: torch.dtype) -> Tensor:
    """(images, heads): over every row, the largest ``max_j |p_j - r_j| / max_j r_j`` where p is the row computed from
    q (images, heads, Tq, d) and k (images, heads, Tk, d) rounded to ``dtype`` and r the ``reference`` row (images,
    heads, Tq, Tk), e.g. the recorder's. One image at a time (memory: heads x Tq x Tk floats)."""
    out = torch.empty(q.shape[:2], dtype=torch.float32)
    for image in range(q.shape[0]):
        qi, ki = q[image].to(dtype).float(), k[image].to(dtype).float()
        rows = normalize((qi * scale) @ ki.transpose(-1, -2), spec).float()
        truth = reference[image].float()
        error = rows.sub_(truth).abs_().amax(dim=-1) / truth.amax(dim=-1).clamp(min=torch.finfo(torch.float32).tiny)
        out[image] = error.amax(dim=-1).cpu()
    return out


def qk_bytes(queries: int, keys: int, head_dim: int) -> int:
    """Bytes of one head and image stored as float16 queries and keys."""
    return 2 * (queries + keys) * head_dim


def maps_bytes(queries: int, keys: int) -> int:
    """Bytes of one head and image stored as 8-bit maps (one code per probability, one float32 width per row)."""
    return queries * (keys + 4)


def stored_form(option: str, available: bool, queries: int, keys: int, head_dim: int) -> str:
    """``"qk"`` or ``"maps"`` for one layer: ``option`` auto (the smaller of the two once compressed:
    ``QK_COMPRESSED``, ``MAPS_COMPRESSED``; for head_dim 64 the maps up to about 530 tokens), qk or maps; qk only
    where the layer gives its logit inputs and a normaliser the page computes (``available``)."""
    if option not in FORMS:
        raise ValueError(f"rows={option!r} is unknown; use one of {', '.join(FORMS)}")
    if not available or option == "maps":
        return "maps"
    if option == "qk":
        return "qk"
    qk = qk_bytes(queries, keys, head_dim) * QK_COMPRESSED
    return "qk" if qk < maps_bytes(queries, keys) * MAPS_COMPRESSED else "maps"
