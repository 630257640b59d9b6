"""A 2-layer MLP read-out (Linear - GELU - Linear) on standardised features, for targets a linear map may miss."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.probes.linear import _standardiser, threads_for


@dataclass
class MlpRegressor:
    """``net`` maps standardised features (x - mean) / std (N, D) to targets (N, K)."""

    net: nn.Module
    mean: Tensor
    std: Tensor
    settings: dict[str, Any] = field(default_factory=dict)

    @torch.no_grad()
    def predict(self, features: Tensor) -> Tensor:
        x = torch.as_tensor(features).float().to(self.mean.device)
        return self.net((x - self.mean) / self.std)

    def mse(self, features: Tensor, targets: Tensor) -> float:
        targets = torch.as_tensor(targets).float().reshape(len(targets), -1).to(self.mean.device)
        return float(((self.predict(features) - targets) ** 2).mean())


def fit_mlp_regressor(features: Tensor, targets: Tensor, *, hidden: int = 256, epochs: int = 300, lr: float = 3e-3,
                      weight_decay: float = 1e-4, seed: int = 0, device: torch.device | str = "cpu") -> MlpRegressor:
    """Full-batch AdamW (cosine schedule) on the mean squared error from ``features`` (N, D) to ``targets``."""
    if features.ndim != 2 or len(features) != len(targets) or len(features) < 2:
        raise ValueError(f"features {tuple(features.shape)} must be (N >= 2, D) with one target row each "
                         f"({len(targets)} given)")
    mean, std = (s.float().to(device) for s in _standardiser(features))
    x = (torch.as_tensor(features).float().to(device) - mean) / std
    y = torch.as_tensor(targets).float().reshape(len(targets), -1).to(device)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.GELU(), nn.Linear(hidden, y.shape[1])).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    with threads_for(len(x) * hidden * (x.shape[1] + y.shape[1]), device):
        for _ in range(epochs):
            loss = F.mse_loss(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    net.eval()
    return MlpRegressor(net, mean, std, {"hidden": hidden, "epochs": epochs, "lr": lr, "weight_decay": weight_decay,
                                         "seed": seed})
