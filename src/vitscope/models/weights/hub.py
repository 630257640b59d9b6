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
import re
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
    """The Hugging Face hub cache folder, as ``huggingface_hub`` resolves it, read from the environment now; a
    ValueError naming the variable when it points at a file."""
    env = os.environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return _a_folder(name, Path(env[name]).expanduser())
    if env.get("HF_HOME"):
        return _a_folder("HF_HOME", Path(env["HF_HOME"]).expanduser()) / "hub"
    if env.get("XDG_CACHE_HOME"):
        return _a_folder("XDG_CACHE_HOME", Path(env["XDG_CACHE_HOME"]).expanduser()) / "huggingface" / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _a_folder(variable: str, path: Path) -> Path:
    """``path`` (the value of ``variable``) unless it, or the nearest of its parents that exists, is a file."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "a file" if existing == path else f"{existing}, a file"
        raise ValueError(f"{variable}={os.environ[variable]} points at {where}, not a folder; set {variable} to the "
                         "Hugging Face cache folder, or unset it (default ~/.cache/huggingface)")
    return path


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


def described(path: str | Path, repo: str, cache: Path | None = None, fetch: str | None = None) -> CachedFile:
    """The ``CachedFile`` of ``path``; a ValueError naming it and ``fetch`` (the command that fetches it afresh)
    when its bytes are damaged: the hub cache stores a weights file (an LFS file) as a blob named by the sha256 of
    its bytes, which must match."""
    path = Path(path)
    revision = _commit(path, cache, repo) if cache is not None else None
    digest = sha256_of(path)
    blob = path.resolve().name
    if re.fullmatch(r"[0-9a-f]{64}", blob) and digest != blob:
        fix = f"fetch it afresh with `{fetch}`" if fetch else "delete it and fetch it afresh"
        raise ValueError(f"the cached file {path} of {repo} is damaged (its sha256 is {digest[:12]}..., not the "
                         f"{blob[:12]}... it was stored as: cut short or overwritten); {fix}")
    return CachedFile(path, repo, revision, digest)


def _hub_fetch(repo_id: str, filename: str | None = None, revision: str | None = None) -> str:
    """The ``hf`` command that (re)downloads ``filename`` (or the snapshot) of ``repo_id`` into the hub cache."""
    rev = f" --revision {revision}" if revision else ""
    return f"hf download {repo_id}{' ' + filename if filename else ''}{rev} --force-download"


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def check_reachable(url: str, spec: str, fetch: str) -> None:
    """A ValueError at once when ``url``'s host cannot be reached (no network: huggingface_hub would retry for a
    minute, printing each try), naming the host and how to fetch ``spec`` instead; skipped behind a proxy, which
    only the downloader itself can use."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ValueError(f"--download of {spec} with HF_HUB_OFFLINE set: huggingface_hub fetches nothing; unset "
                         f"HF_HUB_OFFLINE, or fetch it on a machine with a network (`{fetch}`)")
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return
    parts = urlparse(url)
    host, port = parts.hostname or url, parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        raise ValueError(f"--download cannot reach {host} ({err.strerror or err}) to fetch {spec}; without a "
                         f"network, fetch it where there is one (`{fetch}`) and copy the cache folder here, then drop "
                         "--download") from None


def download_failed(spec: str, err: Exception, fetch: str) -> ValueError:
    """One line for a download that failed after the host was reachable (a name the hub does not hold, a gated
    repository, a dropped connection)."""
    from huggingface_hub import errors

    detail = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if isinstance(err, errors.GatedRepoError):
        why = "the repository is gated: accept its terms on the hub and log in with `hf auth login`"
    elif isinstance(err, errors.RepositoryNotFoundError | errors.RevisionNotFoundError):
        why = "the hub has no such repository or revision (or it is private: log in with `hf auth login`)"
    else:
        why = f"{type(err).__name__}: {detail}"
    return ValueError(f"--download of {spec} failed ({why}); check the name, or fetch it with `{fetch}`")


def _hub_download(spec: str, fetch: str, download, *args, **kwargs):
    """``download(*args, **kwargs)`` (hf_hub_download or snapshot_download) after ``check_reachable``, its network
    errors as one line; a file the repository lacks (EntryNotFoundError) is raised as it is."""
    from huggingface_hub import constants, errors

    check_reachable(constants.ENDPOINT, spec, fetch)
    try:
        return download(*args, **kwargs)
    except errors.LocalEntryNotFoundError as err:  # the hub not reached after all (an EntryNotFoundError too)
        raise download_failed(spec, err, fetch) from None
    except (errors.EntryNotFoundError, errors.HFValidationError):  # a file the repository lacks; a malformed name
        raise
    except Exception as err:  # httpx connection errors, HfHubHTTPError, gated or missing repositories
        raise download_failed(spec, err, fetch) from None


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
            return described(found, repo_id, cache, _hub_fetch(repo_id, filename, revision))
    rev = f" --revision {revision}" if revision else ""
    fetch = f"hf download {repo_id} {filenames[0]}{rev}"
    if download:
        from huggingface_hub import errors, hf_hub_download

        for filename in filenames:
            try:
                path = _hub_download(spec, fetch, hf_hub_download, repo_id, filename, revision=revision,
                                     cache_dir=cache)
            except errors.EntryNotFoundError:  # not in the repository: try the next name, as timm does
                continue
            return described(path, repo_id, cache, _hub_fetch(repo_id, filename, revision))
        raise ValueError(f"{spec}: {repo_id} holds none of {', '.join(filenames)}; check the name")
    raise missing(spec, f"{_repo_folder(cache, repo_id)} for {' or '.join(filenames)}", fetch)


def hub_folder(spec: str, repo_id: str, revision: str | None = None, *, download: bool = False) -> Path:
    """The snapshot folder of hub repository ``repo_id`` at ``revision`` (config and weights); fetched (json,
    safetensors and txt files) with ``download``, else refused in one line."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    rev = f" --revision {revision}" if revision else ""
    fetch = f"hf download {repo_id}{rev}"
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        if download:
            return Path(_hub_download(spec, fetch, snapshot_download, repo_id, revision=revision, cache_dir=cache,
                                      allow_patterns=SNAPSHOT_FILES))
    raise missing(spec, str(_repo_folder(cache, repo_id)), fetch)


def folder_weights(folder: Path, repo_id: str) -> CachedFile | None:
    """The weights file of a cached snapshot folder (``model.safetensors``, else ``pytorch_model.bin``)."""
    for name in HF_WEIGHTS:
        if (folder / name).is_file():
            return described(folder / name, repo_id, hub_cache_dir(), _hub_fetch(repo_id, name, folder.name))
    return None


def url_file(spec: str, url: str, *, download: bool = False) -> CachedFile:
    """A url's file in torch's hub cache, where timm and OpenCLIP download it; fetched with ``download``."""
    path = torch_cache_dir() / Path(url.split("?")[0]).name
    fetch = f"curl -L {url} -o {path}"
    if not path.is_file():
        if not download:
            raise missing(spec, str(path), fetch)
        import torch

        check_reachable(url, spec, fetch)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(url, str(path))
        except OSError as err:  # URLError, a dropped connection
            raise ValueError(f"--download of {spec} failed ({err}); fetch it with `{fetch}`") from None
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

    spec = f"timm:{name}"
    try:
        cfg = get_pretrained_cfg(name)
    except RuntimeError:  # timm: "Invalid pretrained tag (TAG) for ARCH."
        import timm

        arch, _, tag = name.partition(".")
        tags = [known.partition(".")[2] for known in timm.list_pretrained(f"{arch}.*")]
        raise ValueError(f"{spec}: timm has no pretrained tag {tag!r} for {arch}; its tags: {', '.join(tags)} "
                         f"(timm:{arch}.{tags[0] if tags else 'TAG'})") from None
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
