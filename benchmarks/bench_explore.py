"""The explorer's size budget and opening time: 16 images of a ViT-S/16 at 224, all 12 layers x 6 heads.

Usage: python benchmarks/bench_explore.py [--images 16] [--opens 3] [--sharpen 1,4]

Random weights give near-uniform maps, which compress far better than a trained model's; ``--sharpen F`` scales
every query and key projection by F (peaky, varied maps: a harder case for the compressor). For each case: the
time to build the page, its size, the quantisation levels and error bound it ended with, and the time Chromium
(Debian's, headless) takes from navigation to drawn (median of ``--opens``), measured in Python around ``goto`` and
inside the page (``performance.now()`` when ready). Prints the load average: this machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import vitscope
from vitscope.models import create

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def open_times(path: Path, opens: int) -> tuple[float, float]:
    """Median seconds from navigation to drawn: (measured around goto + ready, the page's own performance.now())."""
    from playwright.sync_api import sync_playwright

    outside, inside = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for _ in range(opens):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            started = time.perf_counter()
            page.goto(path.as_uri())
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
            outside.append(time.perf_counter() - started)
            inside.append(page.evaluate("window.vitscope.loadMs") / 1000)
            page.close()
        browser.close()
    return statistics.median(outside), statistics.median(inside)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--opens", type=int, default=3)
    parser.add_argument("--sharpen", default="1,4")
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.randint(0, 256, (args.images, 3, 224, 224), dtype=torch.uint8)
    print(f"load average before: {os.getloadavg()}  (shared machine, {os.cpu_count()} cores)")
    for factor in [float(f) for f in args.sharpen.split(",")]:
        model = create("vit-small").eval()
        with torch.no_grad():
            for block in model.blocks:
                block.attn.qkv.weight[: 2 * model.embed_dim] *= factor
        started = time.perf_counter()
        page = vitscope.explore(model, images, labels=[f"ViT-S/16 x{factor:g}"])
        build = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as tmp:
            path = page.save(Path(tmp) / "explorer.html")
            outside, inside = open_times(path, args.opens)
        q = page.meta["quantization"]
        print(f"sharpen x{factor:g}: {args.images} images, 12 layers x 6 heads: {page.size_bytes / 1e6:.1f} MB, "
              f"error floor {q['floor']:.2g}, error <= {q['bound']:.2g} (largest seen {q['measured']:.2g}); "
              f"build {build:.1f} s; "
              f"open {outside:.2f} s (in page {inside:.2f} s), median of {args.opens}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
