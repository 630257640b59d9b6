"""The explorer's page: size, build time, opening time and click latency in Chromium (Debian's, headless).

Usage: python benchmarks/bench_explore.py [--cases random,real] [--images 16] [--opens 3] [--sharpen 1,4]
                                          [--sizes 224,518] [--photos 4] [--clicks 12] [--data-dir DIR]

``random``: 16 random 224 px images through a ViT-S/16 (``vit-small``, random weights), all 12 layers x 6 heads:
8-bit maps. Random weights give near-uniform maps, which compress far better than a trained model's; ``--sharpen
F`` scales every query and key projection by F (peaky, varied maps: a harder case for the compressor).

``real``: the real ViT-S/14 (``dinov2s_imgfocus_timm.safetensors``) on ``--photos`` CamVid street photos, every
layer and head, at each of ``--sizes`` px (518: 37 x 37 patches, where the page stores float16 queries and keys),
built with the ``vitscope explore`` command as a user runs it (model and data loading included); skipped when the
data folder is missing. Then the largest row error the page states, and in Chromium: opening time, and click
latency: the time from a click on a new patch (head ``mean``, so every head's row is computed, and the small
multiples redrawn) to the next animation frame after the page has drawn the map, measured in the page from the
click event's time stamp (``in page``), and around ``page.mouse.click`` until the page reports it
(``round trip``, Playwright's messaging included); medians and maxima over ``--clicks`` clicks at different patches,
and the time a layer change takes to draw (the layer's queries and keys are decoded then).

``--check-layers``: a second page of the real model with those layers (the Python API), whose rows Chromium shows are
compared with ``record_attention``'s (every head and the mean, CLS and three patches, every photo).

Prints the load average before and after: this machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import torch

import vitscope
from vitscope.models import create

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[1]
DATA_DIRS = (ROOT.parent / "shared" / "data", Path("/work/shared/data"))
WEIGHTS = "dinov2s_imgfocus_timm.safetensors"
PHOTOS = "camvid_street_seg.tar.gz"
LISTEN = """() => {
    window.__clicks = [];
    document.querySelector('canvas.vs-overlay').addEventListener('click', (ev) => {
        const start = ev.timeStamp;  // the page's click handler has drawn when this (later) listener runs
        requestAnimationFrame(() => setTimeout(() => window.__clicks.push(performance.now() - start), 0));
    });
}"""


def open_times(browser, path: Path, opens: int) -> tuple[float, float]:
    """Median seconds from navigation to drawn: (measured around goto + ready, the page's own performance.now())."""
    outside, inside = [], []
    for _ in range(opens):
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        started = time.perf_counter()
        page.goto(path.as_uri(), timeout=180_000)
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=180_000)
        outside.append(time.perf_counter() - started)
        inside.append(page.evaluate("window.vitscope.loadMs") / 1000)
        page.close()
    return statistics.median(outside), statistics.median(inside)


def click_times(browser, path: Path, clicks: int) -> dict[str, list[float]]:
    """Milliseconds per click on a new patch, in the page and around the click (module docstring), and per layer
    change (``select``, timed in the page the same way: its queries and keys are decoded then)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(path.as_uri(), timeout=180_000)
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=180_000)
    depth = len(page.evaluate("window.vitscope.meta.models[0].layers"))
    page.evaluate(LISTEN)
    box = page.locator('canvas.vs-overlay[data-model="0"]').bounding_box()
    times: dict[str, list[float]] = {"click, in page": [], "click, round trip": [], "layer change, in page": []}
    for i in range(clicks):
        if i % 2 == 0:  # a layer not drawn yet: its queries and keys are decoded now
            times["layer change, in page"].append(page.evaluate(f"""() => new Promise((done) => {{
                const start = performance.now();
                window.vitscope.select({{layer: {1 + (i // 2 + 1) % depth}, head: 'mean'}});
                requestAnimationFrame(() => setTimeout(() => done(performance.now() - start), 0));
            }})"""))
        x = box["x"] + ((0.13 + 0.37 * i) % 1.0) * box["width"]
        y = box["y"] + ((0.21 + 0.29 * i) % 1.0) * box["height"]
        started = time.perf_counter()
        page.mouse.click(x, y)
        page.wait_for_function(f"window.__clicks.length > {i}")
        times["click, round trip"].append(1000 * (time.perf_counter() - started))
        times["click, in page"].append(page.evaluate(f"window.__clicks[{i}]"))
    page.close()
    return times


def row_check(browser, weights: Path, photos: Path, size: int, layers: list[int], tmp: Path) -> tuple[float, int]:
    """The largest difference, as a fraction of the row's maximum, between the rows a page (the Python API's, with
    ``layers``, 0-based) shows in Chromium and ``record_attention``'s, over every head and the mean, a few queries
    (CLS among them) of every image; and the number of rows compared."""
    import numpy as np

    from vitscope.data import load_dataset
    from vitscope.explorer import model_inputs, shown_pictures
    from vitscope.models import load
    from vitscope.record import record_attention

    model = load("timm:vit_small_patch14_dinov2", weights=str(weights), img_size=size).eval()
    dataset = load_dataset("imagefolder", str(photos), "eval")
    path = vitscope.explore(model, dataset, layers=layers).save(tmp / f"check-{size}.html")
    with torch.no_grad(), record_attention(model, layers=layers, keep="maps") as rec:
        model(model_inputs(model, shown_pictures(model, dataset.images, dataset), dataset))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(path.as_uri(), timeout=180_000)
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=180_000)
    worst, count = 0.0, 0
    for image in range(len(dataset)):
        for slot, layer in enumerate(layers):
            maps = rec.maps[slot][image]
            cells = maps.shape[-1] - 1
            for head in ["mean", *range(1, maps.shape[0] + 1)]:
                for query in ("cls", 0, cells // 2, cells - 1):
                    shown = page.evaluate(f"window.vitscope.select({{image: {image}, layer: {layer + 1}, "
                                          f"head: {head!r}, query: {query!r}}})")["models"][0]
                    token = 0 if query == "cls" else 1 + query
                    truth = (maps.mean(0) if head == "mean" else maps[head - 1])[token].double().numpy()
                    worst = max(worst, float(np.abs(np.array(shown["row"]) - truth).max() / truth.max()))
                    count += 1
    page.close()
    return worst, count


def random_case(browser, args) -> None:
    torch.manual_seed(0)
    images = torch.randint(0, 256, (args.images, 3, 224, 224), dtype=torch.uint8)
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
            outside, inside = open_times(browser, path, args.opens)
        q = page.meta["quantization"]
        print(f"random ViT-S/16 x{factor:g}: {args.images} images, 12 layers x 6 heads: "
              f"{page.size_bytes / 1e6:.1f} MB, error floor {q['floor']:.2g}, error <= {q['bound']:.2g} "
              f"(largest seen {q['measured']:.2g}); "
              f"build {build:.1f} s; open {outside:.2f} s (in page {inside:.2f} s), median of {args.opens}")


def real_case(browser, args) -> None:
    from vitscope.cli import main

    data = next((d for d in ([Path(args.data_dir)] if args.data_dir else DATA_DIRS) if (d / WEIGHTS).is_file()), None)
    if data is None or not (data / PHOTOS).is_file():
        print(f"real: skipped, {WEIGHTS} and {PHOTOS} not found in {args.data_dir or ' or '.join(map(str, DATA_DIRS))}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(data / PHOTOS) as archive:  # the first photos of the validation sequence
            members = sorted((m for m in archive.getmembers() if "/images/val/" in m.name and m.isfile()),
                             key=lambda m: m.name)[: args.photos]
            archive.extractall(tmp, members=members, filter="data")
        photos = Path(tmp) / members[0].name.rsplit("/", 1)[0]
        for size in [int(s) for s in args.sizes.split(",")]:
            out = Path(tmp) / f"out-{size}"
            started = time.perf_counter()
            code = main(["explore", "--model", "timm:vit_small_patch14_dinov2", "--weights", str(data / WEIGHTS),
                         "--img-size", str(size), "--dataset", "imagefolder", "--data-dir", str(photos),
                         "--num-images", str(args.photos), "--out", str(out), "--device", "cpu"])
            build = time.perf_counter() - started
            if code:
                print(f"real {size} px: vitscope explore exited {code}")
                continue
            path = out / "explorer.html"
            outside, inside = open_times(browser, path, args.opens)
            clicks = click_times(browser, path, args.clicks)
            print(f"real ViT-S/14, {size} px, {args.photos} photos, 12 layers x 6 heads: "
                  f"{path.stat().st_size / 1e6:.1f} MB, built in {build:.1f} s (command, loading included); "
                  f"open {outside:.2f} s (in page {inside:.2f} s), median of {args.opens}")
            for name, values in clicks.items():
                print(f"    {name}: median {statistics.median(values):.0f} ms, max {max(values):.0f} ms "
                      f"({len(values)} clicks)")
            if args.check_layers:
                layers = [int(n) - 1 for n in args.check_layers.split(",")]
                worst, count = row_check(browser, data / WEIGHTS, photos, size, layers, Path(tmp))
                print(f"    rows against record_attention (layers {args.check_layers}, {count} rows: every head and "
                      f"the mean, CLS and 3 patches, every photo): largest difference {100 * worst:.2g} % of the "
                      "row's maximum")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="random,real")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--opens", type=int, default=3)
    parser.add_argument("--sharpen", default="1,4")
    parser.add_argument("--sizes", default="224,518")
    parser.add_argument("--photos", type=int, default=4)
    parser.add_argument("--clicks", type=int, default=12)
    parser.add_argument("--data-dir", default=None, help="folder with the real weights and CamVid photos")
    parser.add_argument("--check-layers", default="1,4,12",
                        help="layers (1-based) whose rows are compared with record_attention's ('' to skip)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    print(f"load average before: {os.getloadavg()}  (shared machine, {os.cpu_count()} cores)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        if "random" in args.cases:
            random_case(browser, args)
        if "real" in args.cases:
            real_case(browser, args)
        browser.close()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
