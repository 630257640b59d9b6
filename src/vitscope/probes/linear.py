"""Linear read-outs fitted on frozen features: logistic regression (classes) and ridge regression (targets).

Both standardise the features with statistics of the training rows, choose their regularisation (and, for
the classifier, the learning rate) on a seeded, class-stratified held-out part of the training rows, then
refit the best setting on every training row. Features may be float16 or memory-mapped; they are read in
float32 (float64 for the ridge normal equations).

    clf = fit_classifier(train_x, train_y, num_classes)      # train_x (N, D), train_y (N,)
    clf.top1(eval_x, eval_y)                                 # fraction in [0, 1]
    reg = fit_regressor(train_x, train_t)                    # train_t (N, K)
    reg.mse(eval_x, eval_t)                                  # mean over rows and outputs
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

DEFAULT_LRS = (1e-3, 1e-2, 1e-1)
DEFAULT_WEIGHT_DECAYS = (0.0, 1e-4, 1e-2)
DEFAULT_RIDGE_PENALTIES = (1e-6, 1e-4, 1e-2, 1.0)
_CHUNK = 8192  # rows per chunk when streaming features
_SMALL_WORK = 5e7  # multiply-adds per step below which one CPU thread is faster than several (no sync cost)


@contextmanager
def threads_for(work: float, device: torch.device | str) -> Iterator[None]:
    """One intra-op thread for small CPU problems: thread hand-offs cost more than such matmuls, and far more
    when the CPU is shared (40x measured on 2 busy cores); larger problems keep the current setting."""
    previous = torch.get_num_threads()
    small = torch.device(device).type == "cpu" and work < _SMALL_WORK
    if small:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small:
            torch.set_num_threads(previous)


def _as_float(x: Tensor, device: torch.device | str, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.as_tensor(x).to(device=device, dtype=dtype)


def _standardised_chunks(features: Tensor, mean: Tensor, std: Tensor, dtype: torch.dtype = torch.float32):
    """``(features - mean) / std`` in chunks of ``_CHUNK`` rows, on ``mean``'s device in ``dtype``."""
    for start in range(0, len(features), _CHUNK):
        yield (_as_float(features[start : start + _CHUNK], mean.device, dtype) - mean) / std


def _check_rows(features: Tensor, targets: Tensor, what: str) -> None:
    if features.ndim != 2:
        raise ValueError(f"features must be (N, D), got {tuple(features.shape)}; flatten tokens to rows first")
    if len(targets) != len(features):
        raise ValueError(f"{len(features)} feature rows but {len(targets)} {what}")
    if len(features) < 2:
        raise ValueError(f"a linear probe needs at least 2 training rows, got {len(features)}")


def stratified_split(labels: Tensor, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Row indices (fit, held_out): about ``fraction`` of each class held out (none of a one-row class)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"val_fraction={fraction} must be in [0, 1)")
    generator = torch.Generator().manual_seed(seed)
    labels = torch.as_tensor(labels).long().cpu()
    fit, held = [], []
    for cls in labels.unique():
        rows = (labels == cls).nonzero().flatten()
        rows = rows[torch.randperm(len(rows), generator=generator)]
        count = int(round(fraction * len(rows))) if len(rows) > 1 else 0
        count = min(count, len(rows) - 1)
        held.append(rows[:count])
        fit.append(rows[count:])
    return torch.cat(fit).sort().values, torch.cat(held).sort().values


def group_split(groups: Tensor, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Row indices (fit, held_out) holding out about ``fraction`` of the distinct ``groups`` (N,) whole (seeded),
    so that rows of one group (the tokens of one image) never sit on both sides; none held out with one group."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"val_fraction={fraction} must be in [0, 1)")
    groups = torch.as_tensor(groups).long().cpu()
    names = groups.unique()
    count = min(int(round(fraction * len(names))), len(names) - 1)
    if fraction > 0 and len(names) > 1:
        count = max(count, 1)
    held_names = names[torch.randperm(len(names), generator=torch.Generator().manual_seed(seed))[:count]]
    held = torch.isin(groups, held_names)
    return (~held).nonzero().flatten(), held.nonzero().flatten()


def _standardiser(features: Tensor) -> tuple[Tensor, Tensor]:
    """Per-column mean and std (D,) in float64 over every row, streamed in chunks."""
    total = torch.zeros(features.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for start in range(0, len(features), _CHUNK):
        chunk = torch.as_tensor(features[start : start + _CHUNK]).double().cpu()
        total += chunk.sum(0)
        squares += (chunk * chunk).sum(0)
    mean = total / len(features)
    var = (squares / len(features) - mean * mean).clamp(min=0)
    return mean, var.sqrt().clamp(min=1e-6)


@dataclass
class LinearClassifier:
    """Logistic-regression read-out: ``logits = ((x - mean) / std) @ weight.T + bias``.

    ``weight`` (C, D), ``bias`` (C,), ``mean``/``std`` (D,) float32. ``settings`` holds the chosen lr and weight
    decay, the epochs, and the held-out top-1 of every swept setting."""

    weight: Tensor
    bias: Tensor
    mean: Tensor
    std: Tensor
    settings: dict[str, Any] = field(default_factory=dict)

    def logits(self, features: Tensor) -> Tensor:
        """Class scores (N, C) for features (N, D), computed in chunks on the weights' device."""
        out = [x @ self.weight.T + self.bias for x in _standardised_chunks(features, self.mean, self.std)]
        return torch.cat(out) if out else self.weight.new_zeros(0, len(self.bias))

    def predict(self, features: Tensor) -> Tensor:
        """Predicted class indices (N,)."""
        return self.logits(features).argmax(dim=1)

    def top1(self, features: Tensor, labels: Tensor) -> float:
        """Fraction in [0, 1] of rows whose predicted class equals ``labels``."""
        predicted = self.predict(features).cpu()
        return float((predicted == torch.as_tensor(labels).long().cpu()).float().mean())


def _train_logistic(x: Tensor, y: Tensor, num_classes: int, lr: float, weight_decay: float, epochs: int,
                    batch_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """AdamW with a cosine schedule on standardised ``x`` (N, D); returns weight (C, D) and bias (C,)."""
    with threads_for(min(len(x), batch_size) * x.shape[1] * num_classes, x.device):
        return _adamw_logistic(x, y, num_classes, lr, weight_decay, epochs, batch_size, seed)


def _adamw_logistic(x: Tensor, y: Tensor, num_classes: int, lr: float, weight_decay: float, epochs: int,
                    batch_size: int, seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.zeros(num_classes, x.shape[1], device=x.device, requires_grad=True)
    bias = torch.zeros(num_classes, device=x.device, requires_grad=True)
    optimizer = torch.optim.AdamW([weight, bias], lr=lr, weight_decay=weight_decay)
    steps_per_epoch = -(-len(x) // batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, epochs * steps_per_epoch))
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator).to(x.device)
        for start in range(0, len(x), batch_size):
            rows = order[start : start + batch_size]
            loss = F.cross_entropy(x[rows] @ weight.T + bias, y[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    return weight.detach(), bias.detach()


def fit_classifier(features: Tensor, labels: Tensor, num_classes: int, *, val_fraction: float = 0.2,
                   lrs: Sequence[float] = DEFAULT_LRS, weight_decays: Sequence[float] = DEFAULT_WEIGHT_DECAYS,
                   epochs: int = 100, batch_size: int = 4096, seed: int = 0,
                   device: torch.device | str = "cpu", groups: Tensor | None = None) -> LinearClassifier:
    """Logistic regression from ``features`` (N, D) to integer ``labels`` (N,) in [0, num_classes).

    Every (lr, weight decay) pair trains on the rows left after holding out ``val_fraction`` of each class
    (seeded), or of the ``groups`` (N,) when given, whole (tokens: the image each came from, so that the sweep
    never scores a token of an image it fitted on); the pair with the best held-out top-1 (first on ties) is
    refitted on all rows. With one pair or ``val_fraction=0`` there is no sweep. Minibatches of ``batch_size``
    rows (full batch when N is smaller).
    """
    _check_rows(features, labels, "labels")
    labels = torch.as_tensor(labels).long()
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels span {int(labels.min())}..{int(labels.max())}, outside 0..{num_classes - 1}; "
                         "pass the right num_classes")
    if not lrs or not weight_decays or epochs < 1 or batch_size < 1:
        raise ValueError("lrs and weight_decays must be non-empty, epochs and batch_size >= 1")
    mean, std = _standardiser(features)
    mean, std = mean.float().to(device), std.float().to(device)
    x = (_as_float(features, device) - mean) / std
    y = labels.to(device)
    grid = [(lr, wd) for lr in lrs for wd in weight_decays]
    sweep = []
    if len(grid) > 1 and val_fraction > 0:
        fit_rows, held_rows = stratified_split(labels, val_fraction, seed) if groups is None \
            else group_split(groups, val_fraction, seed)
        fit_rows, held_rows = fit_rows.to(device), held_rows.to(device)
        if len(held_rows) and len(fit_rows):
            for lr, wd in grid:
                weight, bias = _train_logistic(x[fit_rows], y[fit_rows], num_classes, lr, wd, epochs,
                                               batch_size, seed)
                accuracy = float(((x[held_rows] @ weight.T + bias).argmax(1) == y[held_rows]).float().mean())
                sweep.append({"lr": lr, "weight_decay": wd, "val_top1": accuracy})
    best = max(sweep, key=lambda row: row["val_top1"]) if sweep else {"lr": grid[0][0], "weight_decay": grid[0][1]}
    weight, bias = _train_logistic(x, y, num_classes, best["lr"], best["weight_decay"], epochs, batch_size, seed)
    settings = {"lr": best["lr"], "weight_decay": best["weight_decay"], "epochs": epochs, "batch_size": batch_size,
                "val_fraction": val_fraction, "val_split": "groups" if groups is not None else "rows by class",
                "seed": seed, "sweep": sweep}
    return LinearClassifier(weight, bias, mean, std, settings)


@dataclass
class LinearRegressor:
    """Ridge read-out: ``y = ((x - mean) / std) @ weight + bias``; ``weight`` (D, K), ``bias`` (K,)."""

    weight: Tensor
    bias: Tensor
    mean: Tensor
    std: Tensor
    settings: dict[str, Any] = field(default_factory=dict)

    def predict(self, features: Tensor) -> Tensor:
        """Predicted targets (N, K) in float32."""
        out = [(x @ self.weight + self.bias).float()
               for x in _standardised_chunks(features, self.mean, self.std, self.weight.dtype)]
        return torch.cat(out) if out else self.weight.new_zeros(0, self.weight.shape[1]).float()

    def mse(self, features: Tensor, targets: Tensor) -> float:
        """Mean squared error over every row and output."""
        targets = torch.as_tensor(targets).float().reshape(len(targets), -1).to(self.weight.device)
        return float(((self.predict(features) - targets) ** 2).mean())


def _ridge(x: Tensor, t: Tensor, penalties: Sequence[float]) -> list[tuple[Tensor, Tensor]]:
    """Closed-form ridge on standardised ``x`` (N, D), targets ``t`` (N, K), float64: one (weight, bias) per
    penalty λ, solving (XᵀX + λ N I) W = Xᵀ(t - t̄) on centred columns."""
    n = len(x)
    x_mean, t_mean = x.mean(0), t.mean(0)
    xc, tc = x - x_mean, t - t_mean
    gram, cross = xc.T @ xc, xc.T @ tc
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    fits = []
    for penalty in penalties:
        weight = torch.linalg.lstsq(gram + penalty * n * eye, cross).solution if penalty == 0 \
            else torch.linalg.solve(gram + penalty * n * eye, cross)
        fits.append((weight, t_mean - x_mean @ weight))
    return fits


def fit_regressor(features: Tensor, targets: Tensor, *, val_fraction: float = 0.2,
                  weight_decays: Sequence[float] = DEFAULT_RIDGE_PENALTIES, seed: int = 0,
                  device: torch.device | str = "cpu", groups: Tensor | None = None) -> LinearRegressor:
    """Least-squares regression from ``features`` (N, D) to ``targets`` (N, K) (or (N,)), closed form.

    The ridge penalty λ (``weight_decays``; λ N is added to the diagonal of the standardised Gram matrix) is
    chosen by held-out MSE on a seeded random ``val_fraction`` of rows (of the ``groups`` (N,), whole, when
    given), then refitted on every row.
    """
    targets = torch.as_tensor(targets)
    _check_rows(features, targets, "target rows")
    if not weight_decays or any(p < 0 for p in weight_decays):
        raise ValueError(f"weight_decays={tuple(weight_decays)} must be a non-empty list of penalties >= 0")
    mean, std = _standardiser(features)
    mean, std = mean.to(device), std.to(device)
    x = (_as_float(features, device, torch.float64) - mean) / std
    t = targets.to(device=device, dtype=torch.float64).reshape(len(targets), -1)
    sweep = []
    if len(weight_decays) > 1 and val_fraction > 0:
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be in [0, 1)")
        if groups is None:
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)).to(device)
            held_count = max(1, int(round(val_fraction * len(x))))
            held, fit = order[:held_count], order[held_count:]
        else:
            fit, held = (rows.to(device) for rows in group_split(groups, val_fraction, seed))
        if len(fit) >= 2:
            for penalty, (weight, bias) in zip(weight_decays, _ridge(x[fit], t[fit], weight_decays), strict=True):
                error = float(((x[held] @ weight + bias - t[held]) ** 2).mean())
                sweep.append({"weight_decay": penalty, "val_mse": error})
    best = min(sweep, key=lambda row: row["val_mse"])["weight_decay"] if sweep else weight_decays[0]
    weight, bias = _ridge(x, t, [best])[0]
    settings = {"weight_decay": best, "val_fraction": val_fraction, "seed": seed, "sweep": sweep,
                "solver": "closed-form ridge (float64)"}
    return LinearRegressor(weight, bias, mean, std, settings)
