"""Logit rows that stress threshold solvers, shared by the normaliser kernel tests."""

import torch


def adversarial_rows(rows: int, n: int, scale: float, seed: int = 0) -> torch.Tensor:
    """(rows, n) Gaussian logits times ``scale``; row 0 all equal, row 1 tied at the top, row 2 one huge logit,
    row 3 every other key masked with -inf (rows 1 and 3 only where n > 3)."""
    torch.manual_seed(seed)
    x = torch.randn(rows, n) * scale
    x[0] = 0.0
    if n > 3:
        x[1, :3] = 5.0
        x[3, ::2] = float("-inf")
    x[2, 0] = 1e4
    return x
