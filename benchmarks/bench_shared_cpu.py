"""A fixed training step on a shared CPU: its slowdown beside 0, 1 and 2 busy processes, per OpenMP wait setting.

Usage: python benchmarks/bench_shared_cpu.py [--steps 8] [--batch-size 128] [--loads 0,1,2] [--settings spin,adapt]
Step: vit-compact (32 px, batch 128: the locality study's batch) forward + backward + AdamW on fixed synthetic
images, stepping ``vitscope.threads.CoreShare`` as the training loops do. Each setting runs in a fresh process,
since OpenMP reads its wait policy once, when torch loads it:
  spin           OpenMP's default: threads spin ~300,000 times at each barrier, fixed threads (vitscope before)
  passive        OMP_WAIT_POLICY=PASSIVE, fixed threads (VITSCOPE_THREADS=fixed): the previous default
  short          GOMP_SPINCOUNT=10000, what the ``vitscope`` command sets (vitscope.threads), fixed threads
  passive-adapt  passive, with CoreShare keeping the threads at the cores left free
  adapt          vitscope's default: the short spin with CoreShare
  spin1k         the default policy with GOMP_SPINCOUNT=1000, fixed threads
  threads1       the default policy on one intra-op thread
  auto           passive, with VITSCOPE_THREADS=auto: threads = cores the busy processes leave free at import
A busy process is ``python -c 'while True: pass'`` (one core's worth of CPU-bound work). Figures are medians of
``--steps`` steps after 2 warm-up steps; the slowdown is against the same setting with no busy process, and
the idle ratio is each setting's idle step against ``spin``'s, all measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SETTINGS: dict[str, dict[str, str]] = {
    "spin": {"VITSCOPE_OMP_WAIT": "default", "VITSCOPE_THREADS": "fixed"},
    "passive": {"VITSCOPE_OMP_WAIT": "passive", "VITSCOPE_THREADS": "fixed"},
    "short": {"VITSCOPE_THREADS": "fixed"},
    "passive-adapt": {"VITSCOPE_OMP_WAIT": "passive"},
    "adapt": {},
    "spin1k": {"VITSCOPE_OMP_WAIT": "default", "GOMP_SPINCOUNT": "1000", "VITSCOPE_THREADS": "fixed"},
    "threads1": {"VITSCOPE_OMP_WAIT": "default", "BENCH_THREADS": "1", "VITSCOPE_THREADS": "fixed"},
    "auto": {"VITSCOPE_OMP_WAIT": "passive", "VITSCOPE_THREADS": "auto"},
}


def child(steps: int, batch_size: int) -> None:
    """Time ``steps`` training steps in this process and print {"median_s": ...} as JSON."""
    import importlib
    import statistics

    importlib.import_module("vitscope.threads").apply_wait_policy()  # first, as the CLI does, before torch loads
    import torch
    import torch.nn.functional as F

    from vitscope.data import synthetic_scenes
    from vitscope.models import create
    from vitscope.threads import CoreShare

    if os.environ.get("BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    torch.manual_seed(0)
    model = create("vit-compact")
    data = synthetic_scenes("train", batch_size, num_classes=8)
    images = (data.images.float() / 255 - 0.5) / 0.25
    labels = data.labels % model.cfg.num_classes
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    with CoreShare() as cores:  # as vitscope's training loops run their steps
        for step in range(steps + 2):
            start = time.perf_counter()
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            cores.tick()
            if step >= 2:
                times.append(time.perf_counter() - start)
        threads = cores.summary() if cores.enabled else str(torch.get_num_threads())
    print(json.dumps({"median_s": statistics.median(times), "threads": threads,
                      "policy": f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}, GOMP_SPINCOUNT="
                                f"{os.environ.get('GOMP_SPINCOUNT', 'unset')}"}))


def measure(setting: str, steps: int, batch_size: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "VITSCOPE_THREADS",
                        "VITSCOPE_OMP_PASSIVE", "VITSCOPE_OMP_WAIT", "BENCH_THREADS")}
    env.update(SETTINGS[setting])
    command = [sys.executable, __file__, "--child", "--steps", str(steps), "--batch-size", str(batch_size)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--loads", default="0,1,2", help="numbers of busy processes beside the step")
    parser.add_argument("--settings", default="spin,passive,short,passive-adapt,adapt")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.batch_size)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still ends the busy processes
    sys.path.insert(0, str(Path(__file__).parent))
    from common import table

    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    loads = [int(x) for x in args.loads.split(",")]
    print(f"load average before: {os.getloadavg()}")
    seconds: dict[tuple[str, int], float] = {}
    for load in loads:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
        try:
            time.sleep(0.5 if load else 0)
            for setting in settings:
                result = measure(setting, args.steps, args.batch_size)
                seconds[setting, load] = result["median_s"]
                print(f"  {setting:>9} beside {load} busy: {result['median_s'] * 1e3:.0f} ms "
                      f"(threads: {result['threads']}, OMP_WAIT_POLICY={result['policy']})", flush=True)
        finally:
            for process in busy:
                process.kill()
                process.wait()
    print(f"load average after: {os.getloadavg()}")
    rows = []
    for setting in settings:
        idle = seconds.get((setting, 0))
        cells = [setting]
        for load in loads:
            ms = seconds[setting, load] * 1e3
            cells.append(f"{ms:.0f}" + (f" ({seconds[setting, load] / idle:.2f}x)" if idle and load else ""))
        cells.append(f"{idle / seconds['spin', 0]:.2f}" if idle and ("spin", 0) in seconds else "-")
        rows.append(cells)
    print(table(rows, ["setting", *[f"{n} busy: ms (vs idle)" for n in loads], "idle vs spin"]))


if __name__ == "__main__":
    main()
