"""Which images of an ``imagefolder`` tree serve a split, and their labels: one listing for the in-memory and
the streamed loaders.

Three layouts are read (``root`` is the folder or archive given as ``--data-dir``, after looking into a single
top folder):

* ``root/{train,val,test}/<class>/<image>``: ``train`` serves training; ``test`` (else ``val``, ``eval``,
  ``validation``) serves evaluation. A split folder holding images directly (``root/val/*.jpg``) is one class.
* ``root/<class>/<image>``: class folders without a split. Every image is the evaluation set (``analyze``,
  ``explore`` and the probes that fit nothing); the training split is refused, because training or fitting a
  probe on the images it is scored on would report a meaningless score.
* ``root/<image>``: a flat folder, one class named after the folder, evaluation only, as above.

Class labels are the sorted class-folder names. Hidden files (``.name``) and files that are not images are
ignored; anything else gives one line saying what was found and which layouts are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"}
SPLIT_FOLDERS = {"train", "test", "val", "eval", "validation"}
EVAL_FOLDERS = ("test", "val", "eval", "validation")
LAYOUTS = ("imagefolder reads root/{train,val,test}/<class>/<image>, root/<class>/<image> (evaluation only) or a "
           "flat root/<image> (one class, evaluation only)")


@dataclass(frozen=True)
class FolderListing:
    """The images of one split: ``paths`` relative to the tree's root, ``labels`` (one per path), sorted class
    names, and ``layout`` ('split', 'classes' or 'flat') for provenance and messages."""

    paths: list[str]
    labels: list[int]
    classes: list[str]
    layout: str


def is_image(path: str) -> bool:
    """An image file by its suffix, hidden files (``.name``, e.g. macOS's ``._photo.jpg``) excluded."""
    name = PurePosixPath(path).name
    return not name.startswith(".") and PurePosixPath(name).suffix.lower() in IMAGE_SUFFIXES


def _shown(items: list[str], limit: int = 6) -> str:
    return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def _label(relative: list[str], paths: list[str], where: str, flat_name: str) -> FolderListing:
    """Class folders (first path part) or, when every image lies directly in the folder, one class."""
    nested = [f for f in relative if "/" in f]
    loose = [f for f in relative if "/" not in f]
    if nested and loose:
        raise ValueError(f"{where} holds {len(loose)} images directly ({_shown(loose, 3)}) and {len(nested)} in "
                         f"class folders; move the loose images into a class folder, or keep only one kind; "
                         f"{LAYOUTS}")
    if loose:
        return FolderListing(paths, [0] * len(paths), [flat_name], "flat")
    classes = sorted({f.split("/", 1)[0] for f in nested})
    index = {name: i for i, name in enumerate(classes)}
    return FolderListing(paths, [index[f.split("/", 1)[0]] for f in nested], classes, "classes")


def list_image_folder(files: list[str], split: str, where: str, name: str = "images") -> FolderListing:
    """The listing of ``split`` ('train' or 'eval') from ``files`` (relative POSIX paths below the tree's root,
    sorted); ``where`` names the root in messages and ``name`` the class of a flat folder. A ValueError in one
    line when the tree holds no images of a read layout, or no images for ``split``."""
    images = [f for f in files if is_image(f)]
    if not images:
        others = sorted({"/".join(f.split("/")[:2]) for f in files})
        found = f"found {_shown(others)}" if others else "it is empty"
        raise ValueError(f"no images in {where} ({found}); {LAYOUTS}")
    splits = sorted({f.split("/", 1)[0] for f in images if "/" in f and f.split("/", 1)[0] in SPLIT_FOLDERS})
    if not splits:
        if split == "train":
            kind = "class folders" if any("/" in f for f in images) else "images directly"
            raise ValueError(f"{where} holds {kind} but no train/ and val/ (or test/) split, so it is read as one "
                             f"evaluation set (analyze, explore, probe tokens/pib/pca); training and fitted probes "
                             f"need a held-out split: put the images in {where}/train/<class>/ and "
                             f"{where}/val/<class>/")
        return _label(images, images, where, name)
    outside = [f for f in images if f.split("/", 1)[0] not in SPLIT_FOLDERS or "/" not in f]
    if outside:
        raise ValueError(f"{where} mixes split folders ({', '.join(s + '/' for s in splits)}) with {len(outside)} "
                         f"images outside them ({_shown(outside, 3)}); move them into a split, or drop the split "
                         f"folders; {LAYOUTS}")
    wanted = ("train",) if split == "train" else EVAL_FOLDERS
    chosen = next((s for s in wanted if s in splits), None)
    if chosen is None:
        missing = "train/" if split == "train" else "test/ or val/"
        raise ValueError(f"{where} has {', '.join(s + '/' for s in splits)} but no {missing} folder for the "
                         f"{split} split; add {where}/{missing.split()[0]}<class>/<image>; {LAYOUTS}")
    inside = [f for f in images if f.split("/", 1)[0] == chosen]
    listing = _label([f.split("/", 1)[1] for f in inside], inside, f"{where}/{chosen}", chosen)
    return FolderListing(listing.paths, listing.labels, listing.classes, "split")
