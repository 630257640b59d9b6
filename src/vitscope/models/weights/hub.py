"""Pretrained weights by name, from the local caches, with no network unless ``download`` is asked for.

Where each kind of name is looked up:
- ``timm:NAME.TAG`` / ``timm:NAME`` with ``pretrained``: the file ``timm.create_model(NAME, pretrained=True)`` would
  read, from its ``pretrained_cfg`` in timm's order (``_resolve_pretrained_source``): a ``file`` at that path; else
  ``hf_hub_id`` (an optional ``@REVISION`` split off) with ``hf_hub_filename`` (default ``pytorch_model.bin``, its
  ``model.safetensors`` alternative tried first, as timm does), in the Hugging Face hub cache, even where the
  ``url`` is an original .npz (the augreg ``in21k`` tags: timm reads the hub's state dict); else the ``url`` in
  torch's hub cache (``torch.hub.get_dir()/checkpoints``);
- ``hf:ORG/NAME[@REVISION]``: the snapshot folder of that repository in the hub cache (``REVISION``: a branch, tag
  or commit hash; default ``main``);
- ``open_clip:ARCH/TAG``: the file OpenCLIP's pretrained registry names for the tag (``hf_hub`` ``ORG/NAME/[FILE]``,
  default ``open_clip_pytorch_model.bin`` with its ``open_clip_model.safetensors`` alternative first), in the hub
  cache; a tag with only a ``url`` in torch's hub cache.

The hub cache is the folder ``huggingface_hub`` uses, read from the environment at each call (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), and is read with ``huggingface_hub``'s own cache functions
(``try_to_load_from_cache``, ``snapshot_download(local_files_only=True)``), which never open a connection. With
``download=True`` the same functions fetch what is missing. A name that is not cached is refused in one line naming
it, the cache folder searched and the command that fetches it.

Each resolved file is described by a ``CachedFile``: the file, the repository, the revision (the snapshot's commit
hash) and the file's sha256, which the load line and provenance record.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # timm's order for a hub id without a filename
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
SNAPSHOT_FILES = ["*.json", "*.safetensors", "*.txt"]  # what --download fetches of an hf: repository


@dataclass(frozen=True)
class CachedFile:
    """A weights file found in a local cache: ``file``, ``repo`` (hub id or url), ``revision`` (commit hash, None
    outside the hub cache) and ``sha256`` (hex) of the file's bytes."""

    file: Path
    repo: str
    revision: str | None
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": str(self.file), "repo": self.repo, "revision": self.revision, "sha256": self.sha256}

    def note(self) -> str:
        """The load line's words for where the file came from."""
        revision = f"@{self.revision[:12]}" if self.revision else ""
        return f"from the cache, {self.repo}{revision} ({self.file.name}, sha256 {self.sha256[:12]})"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, as ``huggingface_hub`` resolves it, read from the environment now."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or str(Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def torch_cache_dir() -> Path:
    """The folder timm and OpenCLIP download url weights into (``torch.hub.get_dir()/checkpoints``)."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def split_revision(name: str) -> tuple[str, str | None]:
    """``ORG/NAME@REVISION`` -> (``ORG/NAME``, ``REVISION``); no ``@`` gives None."""
    repo, at, revision = name.partition("@")
    return repo, (revision or None) if at else None


def _repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / f"models--{repo_id.replace('/', '--')}"


def _commit(path: Path, cache: Path, repo_id: str) -> str | None:
    """The snapshot (commit hash) a cached path lies in."""
    try:
        return path.relative_to(_repo_folder(cache, repo_id) / "snapshots").parts[0]
    except (ValueError, IndexError):
        return None


def described(path: str | Path, repo: str, cache: Path | None = None) -> CachedFile:
    path = Path(path)
    revision = _commit(path, cache, repo) if cache is not None else None
    return CachedFile(path, repo, revision, sha256_of(path))


def missing(spec: str, where: str, fetch: str) -> ValueError:
    """The one-line refusal for a name that is not cached."""
    return ValueError(f"{spec} is not in the local cache (searched {where}) and nothing is downloaded unless asked; "
                      f"fetch it with `{fetch}`, or rerun with --download (Python: download=True)")


def hub_file(spec: str, repo_id: str, filenames: tuple[str, ...], revision: str | None = None, *,
             download: bool = False) -> CachedFile:
    """The first of ``filenames`` of hub repository ``repo_id`` at ``revision`` in the hub cache; fetched with
    ``download``, else refused in one line (``spec``: the name as the user gave it)."""
    from huggingface_hub import try_to_load_from_cache

    cache = hub_cache_dir()
    for filename in filenames:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache, revision=revision)
        if isinstance(found, str):
            return described(found, repo_id, cache)
    if download:
        from huggingface_hub import errors, hf_hub_download

        absent = (errors.EntryNotFoundError, getattr(errors, "RemoteEntryNotFoundError", errors.EntryNotFoundError))
        for filename in filenames:
            try:
                return described(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache), repo_id,
                                 cache)
            except absent as err:  # not in the repository: try the next name, as timm does
                if isinstance(err, errors.LocalEntryNotFoundError):  # offline: nothing could be fetched
                    raise
        raise ValueError(f"{spec}: {repo_id} holds none of {', '.join(filenames)}; check the name")
    rev = f" --revision {revision}" if revision else ""
    raise missing(spec, f"{_repo_folder(cache, repo_id)} for {' or '.join(filenames)}",
                  f"hf download {repo_id} {filenames[0]}{rev}")


def hub_folder(spec: str, repo_id: str, revision: str | None = None, *, download: bool = False) -> Path:
    """The snapshot folder of hub repository ``repo_id`` at ``revision`` (config and weights); fetched (json,
    safetensors and txt files) with ``download``, else refused in one line."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        if download:
            return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, allow_patterns=SNAPSHOT_FILES))
    rev = f" --revision {revision}" if revision else ""
    raise missing(spec, str(_repo_folder(cache, repo_id)), f"hf download {repo_id}{rev}")


def folder_weights(folder: Path, repo_id: str) -> CachedFile | None:
    """The weights file of a cached snapshot folder (``model.safetensors``, else ``pytorch_model.bin``)."""
    for name in HF_WEIGHTS:
        if (folder / name).is_file():
            return described(folder / name, repo_id, hub_cache_dir())
    return None


def url_file(spec: str, url: str, *, download: bool = False) -> CachedFile:
    """A url's file in torch's hub cache, where timm and OpenCLIP download it; fetched with ``download``."""
    path = torch_cache_dir() / Path(url.split("?")[0]).name
    if not path.is_file():
        if not download:
            raise missing(spec, str(path), f"curl -L {url} -o {path}")
        import torch

        path.parent.mkdir(parents=True, exist_ok=True)
        torch.hub.download_url_to_file(url, str(path))
    return described(path, url)


def _safe_first(filename: str, defaults: tuple[str, ...]) -> tuple[str, ...]:
    """``filename`` after its safetensors alternative, as timm and OpenCLIP try them."""
    if filename.endswith(".safetensors"):
        return (filename,)
    if filename == defaults[-1]:
        return defaults
    stem = filename.rsplit(".", 1)[0]
    return (f"{stem}.safetensors", filename)


def timm_pretrained(name: str, *, download: bool = False) -> CachedFile:
    """The pretrained weights of timm model ``name`` (``ARCH`` or ``ARCH.TAG``; no tag: timm's default tag),
    resolved as ``timm.create_model(name, pretrained=True)`` does (timm's ``_resolve_pretrained_source``), from the
    local caches: a ``file`` first, else the hub's state dict (``hf_hub_id``, also for tags whose ``url`` is an
    original .npz: timm reads the hub's converted copy), else the ``url``. Refused: a source timm itself reads with
    a custom loader (an .npz file or url, a hub repository of another format)."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    spec = f"timm:{name}"
    if cfg is None:
        raise ValueError(f"{spec}: timm has no pretrained weights under this name; see timm.list_pretrained("
                         f"'{name.split('.')[0]}*') for its tags")
    custom = (f"{spec}: timm reads these weights with a custom loader ({{}}), which vitscope does not; convert them "
              "to a state dict and pass it with --weights")
    if cfg.source == "hf-hub" or (not cfg.file and cfg.hf_hub_id):
        if cfg.custom_load == "hf" and cfg.hf_hub_filename:
            raise ValueError(custom.format(f"{cfg.hf_hub_id}/{cfg.hf_hub_filename}"))
        repo_id, revision = split_revision(cfg.hf_hub_id)
        filenames = _safe_first(cfg.hf_hub_filename, HF_WEIGHTS) if cfg.hf_hub_filename else HF_WEIGHTS
        return hub_file(spec, repo_id, filenames, revision, download=download)
    if cfg.custom_load and (cfg.file or cfg.url):
        raise ValueError(custom.format(f"the file {cfg.file or cfg.url}"))
    if cfg.file:
        path = Path(cfg.file).expanduser()
        if not path.is_file():
            raise ValueError(f"{spec}: its pretrained_cfg names the file {path}, which does not exist; put the file "
                             "there or pass it with --weights")
        return described(path, str(path))
    if cfg.url:
        return url_file(spec, cfg.url, download=download)
    raise ValueError(f"{spec}: its pretrained_cfg names no hub id, url or file; pass the weights with --weights")


def open_clip_pretrained(arch: str, tag: str, *, download: bool = False) -> tuple[CachedFile, dict[str, Any]]:
    """The file of OpenCLIP's pretrained tag ``tag`` for ``arch`` from the local caches, and the tag's registry
    entry (its ``quick_gelu``, mean and std)."""
    from open_clip import pretrained as registry

    spec = f"open_clip:{arch}/{tag}"
    cfg = registry.get_pretrained_cfg(arch, tag)
    if not cfg:
        tags = registry.list_pretrained_tags_by_model(arch)
        known = f"its tags: {', '.join(tags)}" if tags else "see open_clip.list_pretrained()"
        raise ValueError(f"{spec}: OpenCLIP has no pretrained tag {tag!r} for {arch}; {known}")
    if cfg.get("file"):
        return described(Path(cfg["file"]), cfg["file"]), cfg
    if cfg.get("hf_hub"):
        repo_id, filename = os.path.split(cfg["hf_hub"])  # 'ORG/NAME/' (default file) or 'ORG/NAME/FILE'
        filenames = _safe_first(filename, OPEN_CLIP_WEIGHTS) if filename else OPEN_CLIP_WEIGHTS
        return hub_file(spec, repo_id, filenames, download=download), cfg
    if cfg.get("url"):
        return url_file(spec, cfg["url"], download=download), cfg
    raise ValueError(f"{spec}: OpenCLIP's registry names no file for this tag")
