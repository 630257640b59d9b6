"""Probe results kept inside a run folder (``<run>/probes/<kind>-<key>.json``), so studies reuse them.

The key is a hash of everything the numbers depend on, given by the caller: the model's weights and structure
(``model_fingerprint``), the data (``dataset_fingerprint`` or ``dense_fingerprint``) and the probe's settings. A
run folder's model is refreshed at every checkpoint, which changes the weights hash and so the key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vitscope.atomic_io import write_json
from vitscope.data.dense import DenseDataset
from vitscope.probes.features import _hash_tensors
from vitscope.probes.results import ProbeResult


def dense_fingerprint(dataset: DenseDataset) -> str:
    """Hash of a dense dataset's name, split, root, images and targets."""
    digest = hashlib.sha1(json.dumps([dataset.name, dataset.split, dataset.task, str(dataset.root)]).encode())
    _hash_tensors([(f"i{i}", image) for i, image in enumerate(dataset.images)], digest)
    _hash_tensors([(f"t{i}", target) for i, target in enumerate(dataset.targets)], digest)
    return digest.hexdigest()


def result_path(run_dir: str | Path, kind: str, key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(run_dir) / "probes" / f"{kind}-{digest}.json"


def cached_probe(run_dir: str | Path | None, kind: str, key: Mapping[str, Any],
                 compute: Callable[[], ProbeResult]) -> tuple[ProbeResult, bool]:
    """(result, reused): the stored result for ``key`` in ``run_dir``, else ``compute()`` stored there (written
    atomically). Without a run folder (``run_dir`` None or not a folder) it only computes."""
    if run_dir is None or not Path(run_dir).is_dir():
        return compute(), False
    path = result_path(run_dir, kind, key)
    if path.exists():
        stored = json.loads(path.read_text())
        return ProbeResult(stored["kind"], stored["rows"], stored["settings"], stored.get("claims", [])), True
    result = compute()
    write_json(path, {"schema_version": 1, "kind": result.kind, "key": dict(key), "settings": result.settings,
                      "rows": result.rows, "claims": result.claims})
    return result, False
