"""Image sets stored as WebDataset tar shards, read by index with the webdataset project's ``wids`` reader.

Layout: ``<root>/<split>/*.tar`` or ``<root>/<split>-*.tar`` (``train``; ``val``, ``test`` or ``eval`` for the
evaluation split). Each sample is a group of tar members sharing a key, WebDataset's convention: an image
(``.jpg``, ``.jpeg``, ``.png`` or ``.webp``) and its class index as text (``.cls``). Class names come from
``classes.txt`` (one per line, in label order) in the split folder or in ``root``, else they are the label
numbers. Shards are written with ``webdataset.TarWriter`` / ``ShardWriter``.

Shards are indexed once (tar headers only, memory-mapped) in each process that reads them, so a sample is
addressed by its global index (shards in sorted name order, samples in tar order) like a file in a folder.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any

from wids.wids import IndexedTarSamples

SHARD_HELP = ("expected WebDataset shards <root>/train/*.tar (or <root>/train-*.tar) and val/*.tar, each sample "
              "an image (.jpg/.png/.webp) plus its class index (.cls)")
IMAGE_KEYS = (".jpg", ".jpeg", ".png", ".webp")
EVAL_NAMES = ("val", "test", "eval", "validation")


def find_shards(root: Path, split: str) -> list[Path]:
    """The sorted shard files of ``split`` ('train' or 'eval') under ``root``."""
    names = ("train",) if split == "train" else EVAL_NAMES
    for name in names:
        found = sorted((root / name).glob("*.tar")) if (root / name).is_dir() else []
        found = found or sorted(root.glob(f"{name}-*.tar")) or sorted(root.glob(f"{name}_*.tar"))
        if found:
            return found
    tried = ", ".join(f"{n}/*.tar" for n in names)
    raise ValueError(f"no shards for the {split} split under {root} (looked for {tried}); {SHARD_HELP}")


def _open(path: str) -> IndexedTarSamples:
    try:
        return IndexedTarSamples(path=path)
    except (OSError, ValueError, AssertionError) as err:
        raise ValueError(f"cannot index shard {path}: {err}; re-create it as a tar of WebDataset samples") from None


class ShardReader:
    """Random access to the images of tar shards (``ImageReader``); shards are opened lazily per process."""

    def __init__(self, shards: list[str], counts: list[int]):
        self.shards, self.counts = list(shards), list(counts)
        self._ends = list(accumulate(counts))
        self._open: dict[int, IndexedTarSamples] = {}

    def __getstate__(self) -> dict[str, Any]:  # memory maps do not pickle: each worker opens its own
        return {"shards": self.shards, "counts": self.counts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["shards"], state["counts"])

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _locate(self, index: int) -> tuple[IndexedTarSamples, int, str]:
        shard = bisect_right(self._ends, index)
        if shard not in self._open:
            self._open[shard] = _open(self.shards[shard])
        start = self._ends[shard - 1] if shard else 0
        return self._open[shard], index - start, self.shards[shard]

    def member(self, index: int, suffixes: tuple[str, ...]) -> tuple[bytes, str]:
        """The bytes of sample ``index``'s first member whose extension is one of ``suffixes``."""
        samples, inner, path = self._locate(index)
        names = list(samples.reader.names())
        for i in samples.samples[inner]:
            if any(names[i].lower().endswith(suffix) for suffix in suffixes):
                name, data = samples.reader.get_file(i)
                return data.read(), f"{path}:{name}"
        key = names[samples.samples[inner][0]].split(".")[0]
        raise ValueError(f"{path}: sample {key} has no {'/'.join(suffixes)} member; {SHARD_HELP}")

    def read(self, index: int) -> tuple[bytes, str]:
        return self.member(index, IMAGE_KEYS)


def shard_listing(root: Path, split: str) -> tuple[ShardReader, list[int], list[str]]:
    """(reader, labels, class names) of ``split`` from its shards."""
    paths = find_shards(root, split)
    counts = [len(_open(str(p))) for p in paths]
    reader = ShardReader([str(p) for p in paths], counts)
    labels = []
    for index in range(len(reader)):
        data, where = reader.member(index, (".cls",))
        try:
            labels.append(int(data.decode().strip()))
        except ValueError:
            raise ValueError(f"{where}: class index {data[:20]!r} is not an integer; {SHARD_HELP}") from None
    for folder in (paths[0].parent, root):
        if (folder / "classes.txt").is_file():
            classes = [line.strip() for line in (folder / "classes.txt").read_text().splitlines() if line.strip()]
            break
    else:
        classes = [str(i) for i in range(max(labels, default=-1) + 1)]
    bad = [label for label in labels if not 0 <= label < len(classes)]
    if bad:
        raise ValueError(f"{root}: class index {bad[0]} is outside 0..{len(classes) - 1} ({len(classes)} classes "
                         "in classes.txt); fix the .cls members or classes.txt")
    return reader, labels, classes
