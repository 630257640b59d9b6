"""Reading image trees from a folder or from a .zip / .tar / .tar.gz archive, decoding to uint8 tensors.

An archive is read in place (streamed, never unpacked to disk); the decoded tensors are cached by
``sources.py``, so each image is decoded once. A folder or archive whose only top-level entry is a
folder is looked into.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

import torch
from tqdm import tqdm

from vitscope.data.folder_layout import IMAGE_SUFFIXES, SPLIT_FOLDERS
from vitscope.data.image_decode import decode_rgb
from vitscope.data.pixels import DEFAULT_CROP_PCT, DEFAULT_INTERPOLATION, View, eval_view

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
__all__ = ["ARCHIVE_SUFFIXES", "IMAGE_SUFFIXES", "SPLIT_FOLDERS", "FileTree", "decode_images", "fingerprint"]


# what tarfile, gzip and zipfile raise on a truncated or damaged archive
_BROKEN_ARCHIVE = (EOFError, tarfile.ReadError, zipfile.BadZipFile, gzip.BadGzipFile, zlib.error)


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def broken_archive(path: Path, err: Exception) -> ValueError:
    """The error for an archive that cannot be read to its end: the file, the cause and the fix."""
    return ValueError(f"archive {path} is truncated or corrupt ({type(err).__name__}: {err}); re-download it or "
                      "re-create it from the image folder (e.g. tar czf NAME.tar.gz FOLDER)")


def _broken_link(path: Path, err: OSError) -> ValueError:
    """The error for a symbolic link in a data tree that leads nowhere: the link, its target and the fix."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    why = ("a symbolic link loop" if err.errno == errno.ELOOP
           else f"a symbolic link to {target}, which does not exist")
    return ValueError(f"{path} is {why}; fix the link or remove it (data trees follow links to files and folders)")


def check_root(root: Path, what: str) -> None:
    """A FileNotFoundError naming ``root`` (``what``: e.g. "the cifar10 folder or archive") when it does not exist,
    or a ValueError when it is a broken or looping symbolic link."""
    if root.exists():
        return
    if root.is_symlink():
        try:
            os.stat(root)
        except OSError as err:
            raise _broken_link(root, err) from None
    raise FileNotFoundError(f"data directory {root} does not exist; pass --data-dir with {what}")


def walk_files(root: Path) -> list[tuple[str, os.stat_result]]:
    """(relative POSIX path, stat) of every file below the folder ``root`` (in os.walk's order), following symbolic
    links to files and folders; a broken or looping link (hidden ``.name`` links aside: editors' lock files), or a
    link to a folder above it, is a ValueError naming it."""
    found: list[tuple[str, os.stat_result]] = []

    def visit(folder: Path, relative: str, above: frozenset[str]) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as err:
            raise ValueError(f"cannot list {folder} ({err.strerror or err}); make it readable (chmod -R u+rX "
                             f"{folder}) or remove it") from None
        folders = []
        for entry in entries:
            path = Path(entry.path)
            try:
                info = os.stat(path)  # through links
            except OSError as err:
                if entry.name.startswith("."):
                    continue
                raise _broken_link(path, err) if entry.is_symlink() else ValueError(
                    f"cannot read {path} ({err.strerror or err}); make it readable or remove it") from None
            if stat.S_ISDIR(info.st_mode):
                real = os.path.realpath(path)
                if real in above:
                    raise ValueError(f"{path} is a symbolic link to {real}, a folder above it, so the data tree "
                                     "never ends; remove the link") from None
                folders.append((path, f"{relative}{entry.name}/", above | {real}))
            elif stat.S_ISREG(info.st_mode):
                found.append((relative + entry.name, info))
        for below in folders:  # a folder's files, then its folders: os.walk's order (fingerprints kept)
            visit(*below)

    visit(root, "", frozenset({os.path.realpath(root)}))
    return found


def fingerprint(root: str | Path) -> str:
    """A digest that changes whenever any file below ``root`` changes: every file's relative path, size and
    modification time for a folder (``walk_files``: through symbolic links); the file's own size and modification
    time for an archive."""
    root = Path(root).expanduser().resolve()
    digest = hashlib.sha1(str(root).encode())
    if root.is_file():
        stat_ = root.stat()
        digest.update(f"\0{stat_.st_size}\0{stat_.st_mtime_ns}".encode())
        return digest.hexdigest()
    for relative, info in walk_files(root):
        digest.update(f"\0{relative}\0{info.st_size}\0{info.st_mtime_ns}".encode())
    return digest.hexdigest()


class FileTree:
    """Read-only view of the files below a folder or inside an archive, by relative POSIX path."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        check_root(self.root, "the dataset's folder")
        self._archive: tarfile.TarFile | zipfile.ZipFile | None = None
        if self.root.is_file():
            if not is_archive(self.root):
                raise ValueError(
                    f"{self.root} is a file but not a .zip, .tar or .tar.gz archive; pass a folder or an archive"
                )
            self._files = self._archive_members()
        else:
            self._files = sorted(relative for relative, _ in walk_files(self.root))
        self.prefix = self._single_top_folder()

    def _archive_members(self) -> list[str]:
        try:
            if self.root.name.lower().endswith(".zip"):
                self._archive = zipfile.ZipFile(self.root)
                return sorted(n for n in self._archive.namelist() if not n.endswith("/"))
            self._archive = tarfile.open(self.root)
            return sorted(m.name for m in self._archive.getmembers() if m.isfile())
        except _BROKEN_ARCHIVE as err:
            raise broken_archive(self.root, err) from None

    def _single_top_folder(self) -> str:
        """Descend while the tree holds a single folder and nothing else, stopping at split folders."""
        prefix = ""
        while True:
            below = [f[len(prefix):] for f in self._files if f.startswith(prefix)]
            below = [f for f in below if not f.startswith(".")]  # hidden entries (.DS_Store) are no content
            tops = {f.split("/", 1)[0] for f in below}
            top = next(iter(tops)) if len(tops) == 1 else None
            if top is None or top in SPLIT_FOLDERS or not all("/" in f for f in below):
                return prefix
            prefix += top + "/"

    def files(self, under: str = "") -> list[str]:
        """Relative paths (below the single top folder, if any) that start with ``under``."""
        start = self.prefix + under
        return [f[len(self.prefix):] for f in self._files if f.startswith(start)]

    def exists(self, path: str) -> bool:
        full = self.prefix + path
        return any(f == full or f.startswith(full.rstrip("/") + "/") for f in self._files)

    def read(self, path: str) -> bytes:
        full = self.prefix + path
        if self._archive is None:
            return (self.root / full).read_bytes()
        try:
            if isinstance(self._archive, zipfile.ZipFile):
                return self._archive.read(full)
            return self._archive.extractfile(full).read()
        except _BROKEN_ARCHIVE as err:
            raise broken_archive(self.root, err) from None

    def read_many(self, paths: list[str]) -> Iterator[tuple[str, bytes]]:
        """(path, bytes) for each path, in one sequential pass over an archive."""
        if isinstance(self._archive, tarfile.TarFile):
            wanted = {self.prefix + p for p in paths}
            found = {}
            try:
                for member in self._archive:
                    if member.name in wanted:
                        found[member.name[len(self.prefix):]] = self._archive.extractfile(member).read()
            except _BROKEN_ARCHIVE as err:
                raise broken_archive(self.root, err) from None
            for path in paths:
                yield path, found[path]
        else:
            for path in paths:
                yield path, self.read(path)

    def describe(self, limit: int = 8) -> str:
        shown = sorted({"/".join(f.split("/")[:2]) for f in self.files()})[:limit]
        return ", ".join(shown) or "(empty)"


def mixed_sizes(what: str, shapes: list[tuple[int, int]]) -> ValueError:
    """The refusal of images of different sizes with no size to view them at: the sizes, and the option each
    command takes (``train`` has no --img-size: its dataset option sets the size)."""
    sizes = ", ".join(f"{h}x{w}" for h, w in shapes[:3]) + (", ..." if len(shapes) > 3 else "")
    return ValueError(f"{what} have different sizes ({sizes}); give an image size S to view them all at S x S "
                      "(shorter side resized, centre crop): --img-size S for analyze, explore and probe, --set "
                      "dataset_options.image_size=S for train")


PROGRESS_FROM = 5000  # images from which decoding shows progress on a terminal (CIFAR's 60k: about a minute)


def decode_images(tree: FileTree, paths: list[str], size: int | View | None = None, *,
                  crop_pct: float = DEFAULT_CROP_PCT, mixed_size: int | View | None = None,
                  interpolation: str = DEFAULT_INTERPOLATION) -> torch.Tensor:
    """Decode ``paths`` to a uint8 RGB tensor (N, 3, H, W) with ``vitscope.data.pixels.decode_rgb``.

    With ``size`` (a side or a ``View``) every image becomes its evaluation view ``eval_view(image, size, crop_pct,
    interpolation)``. Without it images keep their own pixels when they share one size (other than
    ``mixed_size``'s side); images of different sizes are viewed at ``mixed_size`` (a side or a ``View``), or,
    without one, refused with a ValueError naming the sizes and the fix. An unreadable image raises a ValueError
    naming it."""
    blobs = list(tree.read_many(paths))

    def decode(item: tuple[str, bytes]) -> torch.Tensor:
        path, data = item
        image = decode_rgb(data, str(PurePosixPath(tree.root) / tree.prefix / path))  # in an archive: its path first
        return image if size is None else eval_view(image, size, crop_pct, interpolation)

    with ThreadPoolExecutor(max_workers=4) as pool:  # a bar (rate, ETA) on a terminal for archive-sized folders
        images = list(tqdm(pool.map(decode, blobs), total=len(blobs), desc=f"decoding {Path(tree.root).name}",
                           unit="img", leave=False, disable=len(blobs) < PROGRESS_FROM or None))
    shapes = sorted({tuple(im.shape[-2:]) for im in images})
    edge = getattr(mixed_size, "size", mixed_size)  # a side, or a View's (vitscope.data.pixels.View)
    if mixed_size is not None and (len(shapes) > 1 or shapes == [(edge, edge)]):  # one size at the side: viewed too
        images = [eval_view(image, mixed_size, crop_pct, interpolation) for image in images]
    elif len(shapes) > 1:
        raise mixed_sizes(f"images in {tree.root}", shapes)
    side = getattr(size, "size", size) or edge or 0
    return torch.stack(images) if images else torch.zeros(0, 3, side, side, dtype=torch.uint8)
