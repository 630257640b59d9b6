"""Open a training split in memory or streamed from disk: the ``stream: auto | true | false`` choice.

``auto`` keeps a set in memory when its decoded uint8 size is under the memory budget; layouts that cannot
stream (archives, CIFAR's pickles, Tiny-ImageNet, synthetic scenes) stay in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitscope.data.dataset import ImageDataset
from vitscope.data.sources import dataset_stats, load_dataset
from vitscope.data.stream import StreamedDataset
from vitscope.data.stream_sources import STREAMABLE, open_streamed


def choose_stream(dataset: StreamedDataset, mode: str, budget_gb: float, image_size: int | None
                  ) -> dict[str, Any]:
    """The streaming decision for ``dataset``: ``{"stream", "mode", "decoded_gb", "decoded_bytes",
    "memory_budget_gb", "reason"}``. ``mode`` is 'auto', 'true' or 'false'; ``image_size`` the in-memory resize,
    if any."""
    decoded_bytes = dataset.decoded_bytes(image_size)
    decoded = decoded_bytes / 1e9
    if mode == "auto":
        stream = decoded >= budget_gb
        reason = (f"decoded size {decoded:.2f} GB {'>=' if stream else '<'} memory_budget_gb {budget_gb:g}")
    else:
        stream = mode == "true"
        reason = f"stream: {mode} in the config"
    return {"stream": stream, "mode": mode, "decoded_gb": round(decoded, 4), "decoded_bytes": decoded_bytes,
            "memory_budget_gb": budget_gb, "reason": reason}


def open_for_training(name: str, root: str | None, split: str, *, stream: str, memory_budget_gb: float,
                      **options: Any) -> tuple[ImageDataset | StreamedDataset, dict[str, Any]]:
    """``split`` of ``name`` in memory or streamed, as ``stream`` ('auto', 'true', 'false') and the budget say;
    returns the dataset and the decision (``choose_stream``'s dict, or the reason it stayed in memory)."""
    image_size = options.get("image_size")
    streamable = name in STREAMABLE and root is not None and Path(root).is_dir()
    if stream == "true" and not streamable:
        open_streamed(name, root, split)  # raises the error that names the fix
    if stream == "false" or not streamable:
        why = "stream: false in the config" if stream == "false" else f"{name} from {root} is read in memory"
        return load_dataset(name, root, split, **options), {"stream": False, "mode": stream, "reason": why}
    try:
        streamed = open_streamed(name, root, split, image_size=image_size, stats=dataset_stats(name))
    except ValueError as err:
        if stream == "true":
            raise
        reason = f"not a streamable layout ({err})"  # e.g. CIFAR's pickles: the in-memory loader reads them
        return load_dataset(name, root, split, **options), {"stream": False, "mode": stream, "reason": reason}
    decision = choose_stream(streamed, stream, memory_budget_gb, image_size)
    if decision["stream"]:
        return streamed, decision
    return load_dataset(name, root, split, **options), decision


def describe_choice(decisions: dict[str, dict[str, Any]]) -> str:
    """One line for the splits' streaming decisions (split name -> ``open_for_training``'s decision), each
    distinct decision once: ``data train and eval in memory (cifar10 from DIR is read in memory)``."""
    groups: dict[tuple[bool, str], list[str]] = {}
    for split, decision in decisions.items():
        groups.setdefault((bool(decision["stream"]), decision["reason"]), []).append(split)
    parts = [f"{' and '.join(splits)} {'streamed' if stream else 'in memory'} ({reason})"
             for (stream, reason), splits in groups.items()]
    return "data " + "; ".join(parts)

