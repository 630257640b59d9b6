"""alpha-entmax with a learnable alpha per attention head (Correia, Niculae and Martins, 2019: "Adaptively Sparse
Transformers"), and the specs that name every normaliser."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitscope.attention.normalizers import (
    Entmax15,
    EntmaxAlpha,
    Normalizer,
    Softmax,
    Sparsemax,
    check_alpha,
    entmax,
)

NORMALIZER_NAMES = ("softmax", "sparsemax", "entmax15", "entmax:ALPHA", "entmax:learned", "entmax:learned:ALPHA")
DEFAULT_LEARNED_ALPHA = 1.5


class LearnedEntmax(Normalizer):
    """alpha-entmax with one learnable alpha per head, alpha = 1 + sigmoid(alpha_logit), so it stays in (1, 2)
    whatever the optimiser does (no clamping); the logits' heads are dim -3 of (B, heads, Tq, Tk)."""

    def __init__(self, num_heads: int, alpha: float = DEFAULT_LEARNED_ALPHA):
        super().__init__()
        alpha = check_alpha(alpha)
        if not 1.0 < alpha < 2.0:
            raise ValueError(f"entmax:learned:{alpha:g}: a learned alpha starts inside (1, 2); pick 1.5, say")
        if num_heads < 1:
            raise ValueError(f"entmax:learned needs num_heads >= 1, got {num_heads}")
        self.initial_alpha = alpha
        self.name = f"entmax:learned:{alpha:g}"
        self.alpha_logit = nn.Parameter(torch.full((num_heads,), math.log((alpha - 1.0) / (2.0 - alpha))))

    def alpha(self) -> Tensor:
        """The current alpha of each head, (heads,), in (1, 2)."""
        return 1.0 + torch.sigmoid(self.alpha_logit)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() < 3 or x.shape[-3] != self.alpha_logit.numel():
            raise ValueError(f"entmax:learned has {self.alpha_logit.numel()} heads but got logits of shape "
                             f"{tuple(x.shape)}; expected (..., heads, Tq, Tk)")
        return entmax(x, self.alpha()[:, None, None])


@dataclass(frozen=True)
class NormalizerSpec:
    """A parsed normaliser spec: ``kind`` softmax | sparsemax | entmax15 | alpha | learned, and its alpha."""

    kind: str
    alpha: float | None = None


def parse_normalizer(spec: str) -> NormalizerSpec:
    """Parse 'softmax', 'sparsemax', 'entmax15', 'entmax:ALPHA', 'entmax:learned' or 'entmax:learned:ALPHA';
    ValueError naming the valid choices otherwise."""
    key = str(spec).strip().lower()
    simple = {"softmax": "softmax", "sparsemax": "sparsemax", "entmax15": "entmax15", "entmax1.5": "entmax15"}
    if key in simple:
        return NormalizerSpec(simple[key])
    if key.startswith("entmax:learned"):
        rest = key[len("entmax:learned"):]
        if rest and not rest.startswith(":"):
            raise ValueError(f"attention normaliser {spec!r}: write 'entmax:learned' or 'entmax:learned:1.5'")
        alpha = _number(spec, rest[1:]) if rest else DEFAULT_LEARNED_ALPHA
        if not 1.0 < alpha < 2.0:
            raise ValueError(f"attention normaliser {spec!r}: a learned alpha starts inside (1, 2); pick 1.5, say")
        return NormalizerSpec("learned", alpha)
    if key.startswith("entmax:"):
        alpha = check_alpha(_number(spec, key.split(":", 1)[1]))
        kind = {1.0: "softmax", 1.5: "entmax15", 2.0: "sparsemax"}.get(alpha, "alpha")
        return NormalizerSpec(kind, alpha if kind == "alpha" else None)
    raise ValueError(f"unknown attention normaliser {spec!r}; choose one of {', '.join(NORMALIZER_NAMES)}")


def _number(spec: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"attention normaliser {spec!r}: alpha must be a number, e.g. 'entmax:1.3'") from None


def make_normalizer(spec: str, num_heads: int | None = None) -> Normalizer:
    """Build a normaliser from its spec (see ``parse_normalizer``); 'entmax:learned' needs ``num_heads``."""
    parsed = parse_normalizer(spec)
    if parsed.kind == "learned":
        if num_heads is None:
            raise ValueError(f"attention normaliser {spec!r} learns one alpha per head: pass num_heads")
        return LearnedEntmax(num_heads, parsed.alpha)
    if parsed.kind == "alpha":
        return EntmaxAlpha(parsed.alpha)
    return {"softmax": Softmax, "sparsemax": Sparsemax, "entmax15": Entmax15}[parsed.kind]()


def learned_alphas(model: nn.Module) -> dict[str, Tensor]:
    """The current alpha of every head (heads,) of every learned-alpha normaliser in ``model``, detached, keyed
    by the attention module's name (``blocks.0.attn``); empty when the model learns none."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, LearnedEntmax):
            owner = name.rsplit(".", 1)[0] if "." in name else name
            found[owner] = module.alpha().detach()
    return found
