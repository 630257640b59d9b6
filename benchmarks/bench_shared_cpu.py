"""A fixed training step on a shared CPU: its slowdown beside 0, 1 and 2 busy processes, per OpenMP wait setting.

Usage: python benchmarks/bench_shared_cpu.py [--steps 8] [--batch-size 32] [--loads 0,1,2] [--settings spin,passive]
Step: vit-compact (32 px, batch 32) forward + backward + AdamW on fixed synthetic images, all torch threads.
Each setting runs in a fresh process, since OpenMP reads its wait policy once, when torch loads it:
  spin      OpenMP's default: threads spin for a while at each barrier before sleeping (before vitscope set it)
  passive   OMP_WAIT_POLICY=PASSIVE, what ``import vitscope`` now sets unless told otherwise (vitscope.threads)
  spin10k   the default policy with GOMP_SPINCOUNT=10000 (a shorter spin)
  threads1  the default policy on one intra-op thread
  auto      passive, with VITSCOPE_THREADS=auto: as many threads as cores the busy processes leave free
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
    "spin": {"VITSCOPE_OMP_PASSIVE": "0"},
    "passive": {},
    "spin10k": {"VITSCOPE_OMP_PASSIVE": "0", "GOMP_SPINCOUNT": "10000"},
    "threads1": {"VITSCOPE_OMP_PASSIVE": "0", "BENCH_THREADS": "1"},
    "auto": {"VITSCOPE_THREADS": "auto"},
}


def child(steps: int, batch_size: int) -> None:
    """Time ``steps`` training steps in this process and print {"median_s": ...} as JSON."""
    import importlib
    import statistics

    importlib.import_module("vitscope")  # first, as the CLI does: it sets the OpenMP wait policy
    import torch
    import torch.nn.functional as F

    from vitscope.data import synthetic_scenes
    from vitscope.models import create

    if os.environ.get("BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    torch.manual_seed(0)
    model = create("vit-compact")
    data = synthetic_scenes("train", batch_size, num_classes=8)
    images = (data.images.float() / 255 - 0.5) / 0.25
    labels = data.labels % model.cfg.num_classes
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for step in range(steps + 2):
        start = time.perf_counter()
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= 2:
            times.append(time.perf_counter() - start)
    print(json.dumps({"median_s": statistics.median(times), "threads": torch.get_num_threads(),
                      "policy": os.environ.get("OMP_WAIT_POLICY", "unset")}))


def measure(setting: str, steps: int, batch_size: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "VITSCOPE_THREADS")}
    env.update(SETTINGS[setting])
    command = [sys.executable, __file__, "--child", "--steps", str(steps), "--batch-size", str(batch_size)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--loads", default="0,1,2", help="numbers of busy processes beside the step")
    parser.add_argument("--settings", default="spin,passive,spin10k,threads1,auto")
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
                      f"({result['threads']} threads, OMP_WAIT_POLICY={result['policy']})", flush=True)
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
