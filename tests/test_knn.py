"""kNN against known answers and a brute-force reference."""

import torch

from vitscope.metrics.knn import knn_predict, knn_top1


def test_separable_clusters_give_100_percent():
    torch.manual_seed(0)
    centres = torch.eye(5, 16) * 10
    bank = (centres.repeat_interleave(30, 0) + torch.randn(150, 16))
    labels = torch.arange(5).repeat_interleave(30)
    queries = centres.repeat_interleave(7, 0) + torch.randn(35, 16)
    assert knn_top1(bank, labels, queries, torch.arange(5).repeat_interleave(7), 5) == 1.0


def test_weighted_vote_matches_brute_force():
    torch.manual_seed(1)
    bank, labels, queries = torch.randn(200, 8), torch.randint(0, 4, (200,)), torch.randn(50, 8)
    got = knn_predict(bank, labels, queries, 4, k=7, temperature=0.1, chunk=13)
    b = torch.nn.functional.normalize(bank, dim=1)
    for i, q in enumerate(torch.nn.functional.normalize(queries, dim=1)):
        sims = b @ q
        order = sims.argsort(descending=True)[:7]
        votes = torch.zeros(4)
        for j in order:
            votes[labels[j]] += torch.exp(sims[j] / 0.1)
        assert got[i] == votes.argmax()


def test_the_closer_minority_wins_with_a_sharp_temperature():
    bank = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.6, 0.8]])
    labels = torch.tensor([0, 1, 1])
    query = torch.tensor([[1.0, 0.05]])
    assert knn_predict(bank, labels, query, 2, k=3, temperature=0.01).item() == 0
    assert knn_predict(bank, labels, query, 2, k=3, temperature=10.0).item() == 1
