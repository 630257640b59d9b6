"""Cost of streaming attention statistics (MAD + entropy per head) against a plain evaluation forward.

Usage: python benchmarks/bench_record.py [--device cpu|cuda] [--repeats 5] [--batches 16,32,64,128]
                                         [--threads N] [--clock wall|cpu]
Models: vitscope's vit-compact (32 px) at every batch size given (target: <= 1.3x from 16 up), timm's
vit_small_patch16_224 and pvt_v2_b0 (batch 16, 224 px; PVT-v2's reduced keys take the same q/k kernel),
random weights. Also checks that recording leaves the output bit-identical and that memory does not grow with
the number of batches recorded. Timing: run at normal priority on an otherwise idle machine, and quote the
load average (``cat /proc/loadavg``) with the figures. On a shared machine ``--threads 1 --clock cpu`` measures
this process's CPU time on one thread, which other processes disturb far less than wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import vitscope  # noqa: E402
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.models import load  # noqa: E402


def measure(spec: str, batch: int, size: int, device: str, repeats: int, clock) -> list[str]:
    model = load(spec).to(device).eval()
    images = torch.randn(batch, 3, size, size, device=device)

    def plain():
        with torch.no_grad():
            model(images)

    def with_stats():
        with torch.no_grad(), vitscope.record_attention(model, keep="stats"):
            model(images)

    with torch.no_grad():
        expected = model(images)
        with vitscope.record_attention(model, keep="stats"):
            identical = torch.equal(model(images), expected)
    med = interleaved_medians({"plain": plain, "stats": with_stats}, repeats, sync=device == "cuda", clock=clock)

    def state_size(rec) -> int:  # the recorder keeps only per-head sums, whatever the number of batches
        means = rec.accumulators[0].means
        return sum(t.numel() for per_layer in (*means.sums.values(), *means.counts.values())
                   for t in per_layer.values())

    with torch.no_grad(), vitscope.record_attention(model, keep="stats") as rec:
        for _ in range(3):
            model(images)
        held = state_size(rec)
        for _ in range(3):
            model(images)
        held_after = state_size(rec)
    return [spec, str(batch), f"{med['plain'] * 1e3:.1f}", f"{med['stats'] * 1e3:.1f}",
            f"{med['stats'] / med['plain']:.2f}x", f"{held} -> {held_after} numbers", "yes" if identical else "NO"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", default="16,32,64,128", help="vit-compact batch sizes")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    runs = [("vit-compact", int(b), 32) for b in args.batches.split(",")]
    runs += [("timm:vit_small_patch16_224", 16, 224), ("timm:pvt_v2_b0", 16, 224)]
    rows = [measure(spec, batch, size, args.device, args.repeats, clock) for spec, batch, size in runs]
    print(f"machine: {machine()}, {args.clock} clock")
    print(table(rows, ["model", "batch", "plain forward ms", "with streaming stats ms", "ratio",
                       "recorder state after 3 -> 6 batches", "output bit-identical"]))


if __name__ == "__main__":
    main()
