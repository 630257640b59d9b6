"""Rows the compiled kernels returned without a proof of exactness, counted on the device.

On CUDA a training step must not wait for the host, so under ``paths.deferred_exactness`` the custom op does
not read its per-row ``converged`` flags to finish rows with the exact solver (that read is a host
synchronisation per attention layer). It adds the number of unproven rows to a counter on the rows' device
instead, and the training loop reads the counter once per log line (``take_unproven``), logs it as
``unproven_rows`` and warns when it is not zero. The kernels run more threshold passes in that mode
(``fused.DEFERRED_PASSES``), so on attention rows the count is normally 0.
"""

from __future__ import annotations

import threading
import warnings

import torch
from torch import Tensor

_counters: dict[torch.device, Tensor] = {}
_lock = threading.Lock()
_warned = False


def count_unproven(converged: Tensor) -> None:
    """Add the number of False flags in ``converged`` (any shape) to its device's counter; no host read."""
    device = converged.device
    with _lock:
        counter = _counters.get(device)
        if counter is None:
            counter = _counters[device] = torch.zeros((), dtype=torch.int64, device=device)
    counter.add_((~converged).sum())


def take_unproven() -> int:
    """Rows counted on every device since the last call (one host read per device), and reset the counters."""
    with _lock:
        counters = list(_counters.values())
    total = 0
    for counter in counters:
        total += int(counter)
        counter.zero_()
    return total


def unproven_scalars() -> dict[str, float]:
    """``{"unproven_rows": n}`` for a training log line when rows went unproven since the last call (warning
    once per process), else ``{}``."""
    global _warned
    rows = take_unproven()
    if not rows:
        return {}
    if not _warned:
        _warned = True
        warnings.warn(f"vitscope: {rows} sparse-attention rows since the last log line were not proven exact by the "
                      "compiled kernels (their fixed pass count); they are close but not exact. Set "
                      "VITSCOPE_DEFERRED_CHECK=0 to finish every row exactly (one host sync per attention layer)",
                      stacklevel=2)
    return {"unproven_rows": float(rows)}
