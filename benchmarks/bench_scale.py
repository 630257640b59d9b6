"""Time and peak memory of every instrument on DINOv2's ViT-S/B/L/g at 224 and 518 px, each run in a fresh process.

Usage: python benchmarks/bench_scale.py [--models S,B] [--sizes 224,518] [--instruments locality,norms,census,
                                        features,stats] [--images 4] [--repeats 3] [--wait-gb 14]

Models: ``timm:vit_{small,base,large,giant}_patch14_dinov2`` with random weights (the cost is that of real ones).
Images: ``--images`` synthetic scenes, resized to the model's side as every instrument resizes photos. Instruments,
as the command line runs them after loading the model:
- ``locality``: ``vitscope analyze locality`` (``measure_locality``, its JSON/CSV and figures);
- ``norms``: ``vitscope analyze norms`` (``measure_norms``, its JSON/CSV and figures);
- ``census``: the registers study's census of one model (``run_census``, default settings);
- ``features``: the probes' feature extraction of the last token layer into a fresh disk cache (``extract_features``);
- ``stats``: ``record_attention(keep="stats")`` over the images in one batch;
- ``explore``: the explorer's page of every layer and head (``vitscope.explore``, its 100 MB default bound; a page
  estimated above it is refused before the model runs, and the row says so).
Every run is a fresh Python process (peak RSS, ``getrusage``'s maxrss read by ``os.wait4``, is per process): it
loads the model, then runs the instrument with the batch the memory plan chooses. Printed per row: the batch, the
load and run times, the peak RSS (medians over ``--repeats``), the plan's estimate of the peak, and the 1-minute
load average when each run started (``/proc/loadavg``; the machine is shared). Before a model of more than 200 M
parameters the run waits (up to 20 minutes) until ``--wait-gb`` of memory is available, so as not to push a shared
machine into swap. Run it under ``nice -n 10`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, table  # noqa: E402

MODELS = {"S": "timm:vit_small_patch14_dinov2", "B": "timm:vit_base_patch14_dinov2",
          "L": "timm:vit_large_patch14_dinov2", "g": "timm:vit_giant_patch14_dinov2"}
LARGE = ("L", "g")  # waited for: they need several GB
INSTRUMENTS = ("locality", "norms", "census", "features", "stats", "explore")
WORK = {"locality": "locality", "norms": "norms", "census": "census", "features": "features", "stats": "locality",
        "explore": "locality"}  # the explorer plans its own page, not its batch: the locality plan stands in
DEFAULT_BATCH = {"locality": 128, "norms": 128, "census": 64, "features": 64, "stats": 128, "explore": 16}


def worker(instrument: str, spec: str, size: int, images: int) -> dict:
    """One measurement in this (fresh) process: load, plan, run; times in seconds, sizes in bytes."""
    started = time.perf_counter()
    import torch

    from vitscope.analyze.inputs import model_batches
    from vitscope.analyze.memory_plan import plan_batch
    from vitscope.data import synthetic_scenes
    from vitscope.memory import peak_rss
    from vitscope.models import load

    model = load(spec, img_size=size).eval()
    data = synthetic_scenes("eval", num_images=images, image_size=224)
    loaded = time.perf_counter()
    plan = plan_batch(model, WORK[instrument], len(data), None, default=DEFAULT_BATCH[instrument],
                      layers=1, kept_in_memory=False)
    out = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    run_start = time.perf_counter()
    note = ""
    if instrument == "explore":
        import vitscope

        try:
            note = f"page {len(vitscope.explore(model, data).data) / 1e6:.1f} MB"
        except ValueError as refused:
            note = f"refused: {str(refused).split(';')[0]}"
    elif instrument == "locality":
        from vitscope.analyze import measure_locality, write_locality
        from vitscope.report.figures.analysis import locality_figures

        result = measure_locality(model, data, img_size=size, progress=False)
        write_locality(out, result, {"schema_version": 1}) | locality_figures(result, model, spec, out, "normalized")
    elif instrument == "norms":
        from vitscope.analyze.norms import measure_norms, write_norms
        from vitscope.report.figures.analysis import norm_figures

        result = measure_norms(model, data, img_size=size, progress=False)
        write_norms(out, result, {"schema_version": 1}) | norm_figures(result, model, data, out, size, label=spec)
    elif instrument == "census":
        from vitscope.studies.registers.census import CensusSettings, run_census

        run_census(model, data, spec, CensusSettings(img_size=size), progress=False)
    elif instrument == "features":
        from vitscope.probes.features import extract_features

        extract_features(model, data, "last", img_size=size, cache=out / "features", progress=False)
    elif instrument == "stats":
        import vitscope

        with torch.no_grad(), vitscope.record_attention(model, keep="stats") as rec:
            for batch, _ in model_batches(model, data, plan.batch_size, "cpu", size):
                model(batch)
        rec.stats  # noqa: B018 (the statistics are read, as a user reads them)
    ended = time.perf_counter()
    estimate = plan.estimate.at(min(plan.batch_size, len(data))) if plan.estimate else None
    return {"batch": plan.batch_size, "load_s": loaded - started, "run_s": ended - run_start, "peak": peak_rss(),
            "estimate": estimate, "params": sum(p.numel() for p in model.parameters()), "note": note}


def available_gb() -> float:
    with open("/proc/meminfo") as info:
        return next(int(line.split()[1]) for line in info if line.startswith("MemAvailable:")) / 2**20


def wait_for_memory(gb: float, patience_s: float = 1200, step_s: float = 30) -> float:
    """Wait until ``gb`` GiB are available (at most ``patience_s``); the GiB available when it stops waiting."""
    deadline = time.monotonic() + patience_s
    while (free := available_gb()) < gb and time.monotonic() < deadline:
        print(f"  waiting: {free:.1f} GB available, {gb:.0f} GB wanted", file=sys.stderr, flush=True)
        time.sleep(step_s)
    return free


def measure(instrument: str, key: str, size: int, images: int) -> dict:
    """One fresh process; its peak RSS from ``os.wait4``, the load average when it started."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-scale-cache-") as cache:
        env = {**os.environ, "VITSCOPE_CACHE": cache, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        child = subprocess.Popen([sys.executable, __file__, "--worker", instrument, MODELS[key], str(size),
                                  str(images)], stdout=subprocess.PIPE, env=env, text=True)
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        return {"error": f"exit status {status}", "load": load}
    result = json.loads(output.strip().splitlines()[-1])
    return result | {"peak_child": usage.ru_maxrss * 1024, "load": load}


def gb(size: float | None) -> str:
    return "-" if size is None else f"{size / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("INSTRUMENT", "SPEC", "SIZE", "IMAGES"), help=argparse.SUPPRESS)
    parser.add_argument("--models", default="S,B", help="comma-separated from S, B, L, g")
    parser.add_argument("--sizes", default="224,518")
    parser.add_argument("--instruments", default=",".join(INSTRUMENTS))
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="runs per row for S and B (L and g: once)")
    parser.add_argument("--wait-gb", type=float, default=14.0)
    args = parser.parse_args()
    if args.worker:
        instrument, spec, size, images = args.worker
        print(json.dumps(worker(instrument, spec, int(size), int(images))))
        return
    print(f"machine: {machine()}; {os.cpu_count()} cores; {available_gb():.1f} GB available at start; "
          f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    rows = []
    for key in args.models.split(","):
        for size in map(int, args.sizes.split(",")):
            for instrument in args.instruments.split(","):
                repeats = 1 if key in LARGE else args.repeats
                runs = []
                for _ in range(repeats):
                    free = wait_for_memory(args.wait_gb) if key in LARGE else available_gb()
                    if free < args.wait_gb and key in LARGE:
                        runs.append({"error": f"only {free:.1f} GB available after 20 minutes", "load": 0.0})
                        break
                    runs.append(measure(instrument, key, size, args.images))
                good = [r for r in runs if "error" not in r]
                loads = "/".join(f"{r['load']:.1f}" for r in runs)
                if not good:
                    rows.append([f"ViT-{key}", str(size), instrument, "-", "-", "-", "-", "-", loads,
                                 runs[0]["error"]])
                else:
                    med = {k: statistics.median(r[k] for r in good) for k in ("load_s", "run_s", "peak_child")}
                    rows.append([f"ViT-{key}", str(size), instrument, str(good[0]["batch"]), f"{med['load_s']:.1f}",
                                 f"{med['run_s']:.1f}", gb(med["peak_child"]), gb(good[0]["estimate"]), loads,
                                 "; ".join(filter(None, [f"{len(good)} run(s)", good[0].get("note")]))])
                print(table(rows[-1:], ["model", "px", "instrument", "batch", "load s", "run s", "peak RSS GB",
                                        "estimate GB", "load avg at start", "n"]).splitlines()[-1], flush=True)
    print(f"\n{args.images} images; uptime at end: "
          f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(table(rows, ["model", "px", "instrument", "batch", "load s", "run s", "peak RSS GB", "estimate GB",
                       "load avg at start", "n"]))


if __name__ == "__main__":
    main()
