"""Weighted k-nearest-neighbour classification (DINO's evaluation, Caron et al. 2021, ``eval_knn.py``).

One implementation serves the DINO objective's monitoring and the kNN probe. Features are L2-normalised;
each query's k most cosine-similar bank entries vote for their label with weight ``exp(similarity / T)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def knn_predict(bank: Tensor, bank_labels: Tensor, queries: Tensor, num_classes: int, *, k: int = 20,
                temperature: float = 0.07, chunk: int = 1024) -> Tensor:
    """Predicted labels (Q,) of ``queries`` (Q, D) from ``bank`` (N, D) with integer ``bank_labels`` (N,).

    ``k`` is clipped to the bank size; queries are processed ``chunk`` at a time so memory stays
    (chunk, N). Ties in the vote go to the lowest class index.
    """
    if bank.ndim != 2 or queries.ndim != 2 or bank.shape[1] != queries.shape[1]:
        raise ValueError(f"bank {tuple(bank.shape)} and queries {tuple(queries.shape)} must be (N, D) and (Q, D) "
                         "with the same feature width")
    if bank_labels.shape != (bank.shape[0],):
        raise ValueError(f"bank_labels {tuple(bank_labels.shape)} must hold one label per bank row ({bank.shape[0]})")
    if k < 1 or temperature <= 0:
        raise ValueError(f"k={k} must be >= 1 and temperature={temperature} > 0")
    bank = F.normalize(bank.float(), dim=1)
    labels = bank_labels.long().to(bank.device)
    k = min(k, bank.shape[0])
    predictions = []
    for start in range(0, queries.shape[0], chunk):
        query = F.normalize(queries[start : start + chunk].float().to(bank.device), dim=1)
        similarity, index = (query @ bank.T).topk(k, dim=1)
        weights = (similarity / temperature).exp()
        votes = torch.zeros(query.shape[0], num_classes, device=bank.device)
        votes.scatter_add_(1, labels[index], weights)
        predictions.append(votes.argmax(dim=1))
    return torch.cat(predictions) if predictions else torch.zeros(0, dtype=torch.long)


def knn_top1(bank: Tensor, bank_labels: Tensor, queries: Tensor, query_labels: Tensor, num_classes: int,
             **options) -> float:
    """Top-1 accuracy in [0, 1] of ``knn_predict`` against ``query_labels``."""
    predicted = knn_predict(bank, bank_labels, queries, num_classes, **options)
    return float((predicted.cpu() == query_labels.long().cpu()).float().mean())
