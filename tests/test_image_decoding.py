"""Decoding is crash-free and never silently wrong: a damaged, empty or oversized image file is one line naming it
(exit 2 from the CLI, in memory and streamed), 16-bit, float and animated images are read at 8 bits with a word, and
ordinary files decode to the very pixels torchvision's decoders give.

The cases that killed the process (SIGSEGV inside torchvision's PNG decoder) run the real entry point in a
subprocess, so that a crash fails the test instead of killing pytest.
"""

import io
import math
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image

from vitscope.data import image_decode
from vitscope.data.image_decode import MAX_IMAGE_PIXELS, decode_rgb, image_header_size, png_data_problem
from vitscope.data.image_trees import FileTree, fingerprint

SRC = Path(__file__).resolve().parents[1] / "src"
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")  # torchvision 0.29
RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, (24, 20, 3), dtype=np.uint8)


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_bytes(pixels: np.ndarray, declared: tuple[int, int] | None = None, rows: int | None = None,
              interlace: bool = False) -> bytes:
    """An 8-bit RGB PNG written by hand: every row filter 0; ``declared`` (height, width) in its header instead of
    the pixels' own; only the first ``rows`` filtered rows in its (complete, valid) zlib stream; Adam7 with
    ``interlace``."""
    height, width = declared or pixels.shape[:2]
    if interlace:
        passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
        lines = [b"\0" + pixels[y, x0::dx].tobytes() for x0, y0, dx, dy in passes if x0 < pixels.shape[1]
                 for y in range(y0, pixels.shape[0], dy)]
    else:
        lines = [b"\0" + row.tobytes() for row in pixels]
    stream = zlib.compress(b"".join(lines[:rows]))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, int(interlace))
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", stream) + _chunk(b"IEND", b"")


def encoded(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, **options)
    return buffer.getvalue()


def jpeg_declaring(height: int, width: int) -> bytes:
    """A small JPEG whose frame header (SOF0) declares ``height`` x ``width``."""
    data = bytearray(encoded(Image.fromarray(PIXELS), format="JPEG"))
    at = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, at + 5, height, width)
    return bytes(data)


def torchvision_decoded(data: bytes) -> torch.Tensor:
    return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)


# ---- one line naming the file ----

DAMAGED = {
    "png-cut-short": (png_bytes(PIXELS, rows=5), "its image data holds 305 of the 1,464 bytes its 20 x 24 header"),
    "png-interrupted-write": (png_bytes(PIXELS)[:300], "its image data holds"),
    "png-interlaced-cut-short": (png_bytes(PIXELS, rows=9, interlace=True), "its image data holds"),
    "png-20000-header": (png_bytes(PIXELS[:2], declared=(20000, 20000), rows=2),
                         f"its header declares 400,000,000 pixels, above the {MAX_IMAGE_PIXELS:,} vitscope decodes"),
    "png-200000-header": (png_bytes(PIXELS[:2], declared=(200000, 200000), rows=2), "40,000,000,000 pixels"),
    "jpeg-60000-header": (jpeg_declaring(60000, 60000), "3,600,000,000 pixels"),
    "jpeg-cut-short": (encoded(Image.fromarray(PIXELS), format="JPEG")[:300], "cannot decode image"),
    "zero-bytes": (b"", "the file is empty (0 bytes); re-create or remove this file"),
    "text": (b"hello", "not a readable image file; re-create or remove this file"),
}


@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_file_is_one_line_naming_it(name):
    data, named = DAMAGED[name]
    with pytest.raises(ValueError) as info:
        decode_rgb(data, f"/data/{name}.png")
    line = str(info.value)
    assert line.startswith(f"cannot decode image /data/{name}.png: ") and named in line and "\n" not in line


def test_a_huge_header_is_refused_from_the_header_alone():
    with pytest.raises(ValueError, match="400,000,000 pixels"):
        image_header_size(DAMAGED["png-20000-header"][0], "x.png")
    assert image_header_size(png_bytes(PIXELS)) == (24, 20)


def test_png_completeness_counts_interlaced_passes():
    """The expected bytes of an Adam7 PNG are the seven passes' filtered rows: a complete one passes and decodes to
    its pixels; one row fewer is refused."""
    odd = RNG.integers(0, 256, (13, 11, 3), dtype=np.uint8)
    whole = png_bytes(odd, interlace=True)
    assert png_data_problem(whole) is None
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(whole)).convert("RGB")), odd)  # the writer is right
    assert torch.equal(decode_rgb(whole, "i.png"), torch.from_numpy(odd).permute(2, 0, 1))
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
    lines = sum(math.ceil((13 - y0) / dy) for x0, y0, dx, dy in passes if x0 < 11)
    assert "image data holds" in png_data_problem(png_bytes(odd, rows=lines - 1, interlace=True))


# ---- the process survives: the real entry point, in a subprocess ----

def _folder(root: Path, bad: bytes, split: str = "train") -> Path:
    """An image folder of 2 x 4 images per split, ``split``/b/2.png holding ``bad``."""
    for part in ("train", "val"):
        for label in ("a", "b"):
            for i in range(4):
                (root / part / label).mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.roll(PIXELS, i, axis=0)).save(root / part / label / f"{i}.png")
    (root / split / "b" / "2.png").write_bytes(bad)
    return root / split / "b" / "2.png"


def _vitscope(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "VITSCOPE_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "vitscope.cli", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)


TINY = ["--set", "model=vit-micro", "model_options={depth: 1, embed_dim: 16, num_heads: 1, img_size: 16, "
        "patch_size: 4}", "epochs=1", "progress=false", "dataset_options.image_size=16", "--device", "cpu",
        "--batch-size", "4"]


@pytest.mark.parametrize("command, damage", [("analyze", "png-cut-short"), ("analyze", "png-20000-header"),
                                             ("train", "png-cut-short"), ("train-streamed", "png-cut-short")])
def test_the_files_that_crashed_the_process_are_one_line(command, damage, tmp_path):
    """A PNG whose image data ends before its header's rows, and a 20000 x 20000 header, were SIGSEGV (exit 139)
    inside torchvision's PNG decoder; ``train`` left an --out holding only its lock. Now: exit 2, one line naming
    the file, no --out left behind."""
    bad = _folder(tmp_path / "data", DAMAGED[damage][0], "val" if command == "analyze" else "train")
    out = tmp_path / "out"
    if command == "analyze":
        args = ["analyze", "norms", "--dataset", "imagefolder", "--data-dir", str(tmp_path / "data"), "--set",
                "dataset_options.image_size=16", "--device", "cpu", "--out", str(out)]
    else:  # one batch of all 8: the warmup notice (5 epochs in a 1-epoch run) must not come before the refusal
        args = ["train", "--dataset", "imagefolder", "--data-dir", str(tmp_path / "data"), "--out", str(out), *TINY,
                "--batch-size", "8", "--set", f"stream={'true' if command == 'train-streamed' else 'false'}"]
    done = _vitscope(args, tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vitscope: error: cannot decode image {bad}: "), done.stderr
    assert DAMAGED[damage][1] in lines[0]
    if command != "train-streamed":  # a streamed run meets the file in its first batch, after writing its config
        assert not out.exists(), sorted(p.name for p in out.iterdir())


def test_a_streamed_set_names_the_damaged_file(tmp_path):
    from vitscope.data import open_streamed

    bad = _folder(tmp_path / "data", DAMAGED["png-cut-short"][0])
    streamed = open_streamed("imagefolder", tmp_path / "data", "train", image_size=16)
    index = [str(streamed.reader.root / p) for p in streamed.reader.paths].index(str(bad))
    with pytest.raises(ValueError, match=rf"cannot decode image {bad}: its image data holds"):
        streamed.decode(index)
    with pytest.raises(ValueError, match="its image data holds"):
        streamed.materialize(16)


# ---- read at 8 bits, with a word ----

@pytest.fixture
def fresh_notes(monkeypatch):
    monkeypatch.setattr(image_decode, "_noted", set())


def test_16_bit_pngs_are_read_at_8_bits(fresh_notes, capsys):
    gray = RNG.integers(0, 65536, (9, 7), dtype=np.uint16)
    decoded = decode_rgb(encoded(Image.fromarray(gray), format="PNG"), "g16.png")
    assert torch.equal(decoded, torch.from_numpy((gray >> 8).astype(np.uint8)).expand(3, 9, 7))
    rgb = RNG.integers(0, 65536, (9, 7, 3), dtype=np.uint16)  # 16-bit colour, written by hand (PIL cannot)
    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in rgb)
    data = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 7, 9, 16, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(rows)) + _chunk(b"IEND", b""))
    assert torch.equal(decode_rgb(data, "rgb16.png"), torch.from_numpy((rgb >> 8).astype(np.uint8)).permute(2, 0, 1))
    assert capsys.readouterr().err.count("16-bit images are read at 8 bits") == 1


def test_float_images_in_0_1_are_scaled_and_others_refused(fresh_notes, capsys):
    values = RNG.random((6, 5)).astype(np.float32)
    decoded = decode_rgb(encoded(Image.fromarray(values), format="TIFF"), "f.tif")
    assert torch.equal(decoded, torch.from_numpy(np.rint(values * 255).astype(np.uint8)).expand(3, 6, 5))
    assert decoded.float().mean() > 60  # an all-black image was measured before
    assert "float images with values in [0, 1] are scaled by 255" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"cannot decode image g.tif: it holds float pixels in \[0, 300\]"):
        decode_rgb(encoded(Image.fromarray(np.full((4, 4), 300, np.float32) * (np.arange(16) > 0).reshape(4, 4)),
                           format="TIFF"), "g.tif")


def test_an_animated_gif_is_its_first_frame(fresh_notes, capsys):
    frames = [Image.fromarray(RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)).quantize(16) for _ in range(3)]
    data = encoded(frames[0], format="GIF", save_all=True, append_images=frames[1:])
    first = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    for _ in range(2):
        assert torch.equal(decode_rgb(data, "a.gif"), torch.from_numpy(first).permute(2, 0, 1))
    assert capsys.readouterr().err.count("read as their first frame, e.g. a.gif (3 frames)") == 1


ORDINARY = {
    "png-rgb": lambda: encoded(Image.fromarray(PIXELS), format="PNG"),
    "png-gray": lambda: encoded(Image.fromarray(PIXELS[..., 0]), format="PNG"),
    "png-rgba": lambda: encoded(Image.fromarray(np.dstack([PIXELS, PIXELS[..., :1]])), format="PNG"),
    "png-palette": lambda: encoded(Image.fromarray(PIXELS).quantize(32), format="PNG"),
    "png-1-bit": lambda: encoded(Image.fromarray(PIXELS[..., 0] > 127), format="PNG"),
    "gif": lambda: encoded(Image.fromarray(PIXELS).quantize(32), format="GIF"),
    "webp-lossless": lambda: encoded(Image.fromarray(PIXELS), format="WEBP", lossless=True),
    "jpeg": lambda: encoded(Image.fromarray(PIXELS), format="JPEG"),
}


@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_files_give_torchvisions_pixels(name):
    data = ORDINARY[name]()
    assert torch.equal(decode_rgb(data, name), torchvision_decoded(data))


def test_a_jpeg_torchvision_cannot_read_is_read_by_pil(monkeypatch):
    """(12-bit or arithmetic-coded JPEGs: libjpeg-turbo builds differ); PIL's pixels, as before the guarded path."""
    import torchvision.io

    def unsupported(*args, **kwargs):
        raise RuntimeError("decode_jpeg.cpp:123, Unsupported JPEG process")

    data = ORDINARY["jpeg"]()
    monkeypatch.setattr(torchvision.io, "decode_jpeg", unsupported)
    expected = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
    assert torch.equal(decode_rgb(data, "j.jpg"), expected)


# ---- symbolic links in a data tree ----

def _tree(root: Path) -> Path:
    for label in ("a", "b"):
        (root / "val" / label).mkdir(parents=True)
        Image.fromarray(PIXELS).save(root / "val" / label / "0.png")
    return root


def test_links_to_files_and_folders_are_followed(tmp_path):
    elsewhere = _tree(tmp_path / "elsewhere")
    root = tmp_path / "data"
    (root / "val").mkdir(parents=True)
    (root / "val" / "a").symlink_to(elsewhere / "val" / "a")  # a linked class folder
    (root / "val" / "b").mkdir()
    (root / "val" / "b" / "0.png").symlink_to(elsewhere / "val" / "b" / "0.png")
    (root / "val" / "b" / ".#0.png").symlink_to("user@host.123")  # an editor's lock file: hidden, ignored
    assert FileTree(root).files() == ["val/a/0.png", "val/b/0.png"]
    before = fingerprint(root)
    (elsewhere / "val" / "a" / "0.png").write_bytes(encoded(Image.fromarray(PIXELS[::-1]), format="PNG"))
    os.utime(elsewhere / "val" / "a" / "0.png", ns=(1, 1))
    assert fingerprint(root) != before  # a change behind a link decodes afresh


@pytest.mark.parametrize("kind", ["dangling", "loop", "ancestor", "dangling-root", "looping-root"])
def test_broken_links_are_named_with_the_fix(kind, tmp_path, capsys):
    from cli_refusals import refused

    root = _tree(tmp_path / "data")
    link = {"dangling": root / "val" / "a" / "1.png", "loop": root / "val" / "a" / "1.png",
            "ancestor": root / "val" / "a" / "up", "dangling-root": tmp_path / "link",
            "looping-root": tmp_path / "link"}[kind]
    target = {"dangling": "gone.png", "loop": "1.png", "ancestor": "..", "dangling-root": "gone",
              "looping-root": "link"}[kind]
    link.symlink_to(target)
    data_dir = link if kind.endswith("root") else root
    named = {"dangling": f"{link} is a symbolic link to gone.png, which does not exist; fix the link or remove it",
             "loop": f"{link} is a symbolic link loop; fix the link or remove it",
             "ancestor": f"{link} is a symbolic link to {os.path.realpath(root / 'val')}, a folder above it",
             "dangling-root": f"{link} is a symbolic link to gone, which does not exist",
             "looping-root": f"{link} is a symbolic link loop"}[kind]
    line = refused(["analyze", "norms", "--dataset", "imagefolder", "--data-dir", str(data_dir), "--out",
                    str(tmp_path / "out")], capsys)
    assert named in line
    assert not (tmp_path / "out").exists()
