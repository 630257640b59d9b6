"""Guarded decoding (``vitscope.data.image_decode.decode_rgb``) against torchvision's ``decode_image``, per image.

Usage: python benchmarks/bench_decode.py [--repeats 15] [--batch 50]

Images, generated (smooth random content, as photos compress): PNG at 32 x 32 (CIFAR as a folder of PNGs) and
224 x 224 and 500 x 375, JPEG (quality 90) at 224 x 224 and 500 x 375. The guarded path decodes PNG with PIL after
measuring its image data against its header (torchvision's PNG decoder can kill the process), JPEG with the same
torchvision decoder. Milliseconds per image (CPU time of this process, one thread: medians of ``--repeats`` runs of
``--batch`` decodes, the two paths interleaved) and their ratio.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.data.image_decode import decode_rgb, png_data_problem  # noqa: E402


def photo(height: int, width: int, seed: int = 0) -> Image.Image:
    coarse = np.random.default_rng(seed).integers(0, 256, (max(height // 8, 2), max(width // 8, 2), 3), np.uint8)
    return Image.fromarray(coarse).resize((width, height), Image.BICUBIC)


def encoded(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
    cases = {f"{fmt} {h}x{w}": encoded(photo(h, w), fmt)
             for fmt, (h, w) in [("PNG", (32, 32)), ("PNG", (224, 224)), ("PNG", (375, 500)), ("JPEG", (224, 224)),
                                 ("JPEG", (375, 500))]}
    rows = []
    for name, data in cases.items():
        assert torch.equal(decode_rgb(data, name), decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                                                mode=ImageReadMode.RGB))  # the same pixels
        fns = {"torchvision": lambda d=data: [decode_image(torch.frombuffer(bytearray(d), dtype=torch.uint8),
                                                           mode=ImageReadMode.RGB) for _ in range(args.batch)],
               "guarded": lambda d=data, n=name: [decode_rgb(d, n) for _ in range(args.batch)]}
        if name.startswith("PNG"):
            fns["PNG data check alone"] = lambda d=data: [png_data_problem(d) for _ in range(args.batch)]
        times = interleaved_medians(fns, repeats=args.repeats, clock=time.process_time)
        per = {k: v / args.batch * 1e3 for k, v in times.items()}
        check = f"{per['PNG data check alone']:.3f}" if "PNG data check alone" in per else "-"
        rows.append([name, f"{len(data) / 1024:.0f} KiB", f"{per['torchvision']:.3f}", f"{per['guarded']:.3f}",
                     f"{per['guarded'] / per['torchvision']:.2f}", check])
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} (1 min)")
    print(table(rows, ["image", "file", "torchvision ms", "guarded ms", "ratio", "of which PNG check ms"]))


if __name__ == "__main__":
    main()
