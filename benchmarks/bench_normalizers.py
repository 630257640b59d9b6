"""Forward + backward time of vitscope's normalisers against the `entmax` package and plain softmax.

Usage: python benchmarks/bench_normalizers.py [--device cpu|cuda] [--dtypes float32,bfloat16] [--batch-scale 1]
       [--clock wall|cpu]
Shapes: compact ViT attention (batch 128, 8 heads, 65 x 65) and ViT-S/16 (batch 32, 6 heads, 197 x 197), times
``--batch-scale``. Every row is measured in the same run (medians of interleaved repeats), each dtype against a
softmax of the same dtype. ``entmax:learned`` is alpha-entmax with one alpha per head as a tensor that requires
grad (the learnable-alpha path, alpha gradient included; the package row runs entmax_bisect with the same
tensor). ``err`` is the largest deviation from a float64 solution (bisection with 200 steps) on that input.
Peak memory is the forward's extra memory beyond input and output, in units of the logits tensor (CUDA
allocator, or the peak resident set on Linux CPUs). ``--clock cpu`` (CPU only) times this process's CPU time on
one thread instead of wall time on all threads: on a machine that other jobs share, wall-time ratios mostly measure
the scheduler, CPU-time ratios still measure the kernels. On the CPU with glibc, freed memory stays in the process
for the whole run (``keep_freed_memory``), so that no row is timed paging in memory the previous row returned to the
OS.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import entmax
import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.attention import entmax as vs_entmax  # noqa: E402
from vitscope.attention import entmax15 as vs_entmax15  # noqa: E402
from vitscope.attention import sparsemax as vs_sparsemax  # noqa: E402
from vitscope.memory import glibc  # noqa: E402


def head_alphas(x: torch.Tensor) -> torch.Tensor:
    """One alpha per head (heads, 1, 1) in [1.2, 1.8], requiring grad, as a learned-alpha model has them."""
    heads = x.shape[1]
    return torch.linspace(1.2, 1.8, heads, device=x.device)[:, None, None].requires_grad_()


CASES = {
    "entmax15": (vs_entmax15, entmax.entmax15, 1.5),
    "sparsemax": (vs_sparsemax, entmax.sparsemax, 2.0),
    "entmax:1.3": (lambda x: vs_entmax(x, 1.3), lambda x: entmax.entmax_bisect(x, 1.3), 1.3),
    "entmax:1.7": (lambda x: vs_entmax(x, 1.7), lambda x: entmax.entmax_bisect(x, 1.7), 1.7),
    "entmax:learned": (lambda x: vs_entmax(x, head_alphas(x)), lambda x: entmax.entmax_bisect(x, head_alphas(x)),
                       None),
}
# (images, heads, queries, keys): a vit-compact batch of 128 (65 keys per row) and a ViT-S/16 training batch of 32
# images (197 keys per row), the batch the README's speed-ups are stated at
SHAPES = {"compact": (128, 8, 65, 65), "ViT-S": (32, 6, 197, 197)}


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # mallopt parameters, from glibc's malloc.h


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory in the process (no trimming, no mmap'd blocks) for the rest of the run;
    whether it took. By default glibc hands large freed blocks back to the OS, and the next allocation of that size
    maps fresh pages: at ViT-S one 30 MB tensor is about 7,300 page faults, measured at 8-10 ms on this machine
    (more than a whole softmax forward + backward). The `entmax` package's row allocates and frees gigabytes, so
    those faults then land, at random, in whichever row's forward or backward allocates next; with memory kept,
    every row reuses warm pages after its warm-up."""
    libc = glibc()
    return libc is not None and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)) and bool(
        libc.mallopt(_M_MMAP_MAX, 0))


@contextmanager
def blocks_mapped_one_by_one():
    """Within: every block above 128 KiB mapped on its own and unmapped when freed, and the kept memory handed
    back, so that the resident set is the live memory and its peak shows a forward's temporaries; after: memory
    kept again (``keep_freed_memory``). A no-op without glibc."""
    libc = glibc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024)
    libc.mallopt(_M_MMAP_MAX, 65536)
    libc.malloc_trim(0)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_MAX, 0)


def fwd_bwd(fn, x: torch.Tensor, grad: torch.Tensor):
    def run():
        x.grad = None
        fn(x).backward(grad)

    return run


def truth(x: torch.Tensor, alpha: float | None) -> torch.Tensor:
    alpha = head_alphas(x).detach().double() if alpha is None else alpha
    return entmax.entmax_bisect(x.double(), alpha, n_iter=200)


def _proc_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_ratio(fn, x: torch.Tensor) -> str:
    """Extra peak memory of one forward beyond input and output, in logits-tensor units: the CUDA
    allocator's peak, or on Linux CPUs the process's peak resident set (reset through /proc/self/clear_refs)."""
    with torch.no_grad():
        fn(x)  # compiled and warmed up
        if x.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            y = fn(x)
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - base - y.numel() * y.element_size()
        else:
            try:
                with blocks_mapped_one_by_one():  # else the forward reuses kept pages and its peak shows nothing
                    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set
                    base = _proc_kib("VmRSS") * 1024
                    y = fn(x)
                    extra = _proc_kib("VmHWM") * 1024 - base - y.numel() * y.element_size()
            except (OSError, RuntimeError):
                return "n/a"
    return f"{max(extra, 0) / (x.numel() * 4):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument("--batch-scale", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of: {', '.join(SHAPES)}")
    parser.add_argument("--skip-training-step", action="store_true", help="leave out the vit-compact step table")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time on all threads, or this process's CPU time on one thread (CPU only)")
    args = parser.parse_args()
    sync = args.device == "cuda"
    if args.device == "cpu" and not keep_freed_memory():
        print("note: could not keep freed memory in the process (not glibc): rows may be timed with page faults")
    args.timer = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.clock == "cpu":
        if args.device != "cpu":
            raise SystemExit("--clock cpu times CPU work; use it with --device cpu")
        torch.set_num_threads(1)
    rows = []
    for dtype_name in args.dtypes.split(","):
        rows += measure(args, getattr(torch, dtype_name), dtype_name, sync)
    clock = "CPU time, 1 thread" if args.clock == "cpu" else "wall time"
    print(f"machine: {machine()}; batch scale {args.batch_scale}; forward + backward, median ms ({clock})")
    print(table(rows, ["dtype", "shape", "normaliser", "vitscope ms", "entmax pkg ms", "softmax ms",
                       "speed-up vs pkg", "vs softmax", "max err (ours / pkg)", "peak extra (x logits)"]))
    if not args.skip_training_step:
        print()
        print(training_steps(args.device, args.repeats, args.timer))


def measure(args, dtype: torch.dtype, dtype_name: str, sync: bool) -> list[list[str]]:
    rows = []
    for shape_name in args.shapes.split(","):
        if shape_name not in SHAPES:
            raise SystemExit(f"unknown shape {shape_name!r}; pick from {', '.join(SHAPES)}")
        shape = SHAPES[shape_name]
        shape = (shape[0] * args.batch_scale, *shape[1:])
        torch.manual_seed(0)
        base = torch.randn(shape, device=args.device) * 2
        grad = torch.randn(shape, device=args.device, dtype=dtype)
        x = base.to(dtype).requires_grad_()
        for name, (ours, ref, alpha) in CASES.items():
            fns = {"softmax": fwd_bwd(lambda t: torch.softmax(t, -1), x, grad), "vitscope": fwd_bwd(ours, x, grad),
                   "entmax": fwd_bwd(ref, x, grad)}
            med = interleaved_medians(fns, args.repeats, sync=sync, clock=args.timer)
            exact = truth(x.detach(), alpha)
            with torch.no_grad():
                err_ours = float((ours(x.detach()).double() - exact).abs().max())
                err_ref = float((ref(x.detach()).double() - exact).abs().max())
            mem = peak_memory_ratio(ours, x.detach())
            rows.append([dtype_name, shape_name, name, f"{med['vitscope'] * 1e3:.1f}", f"{med['entmax'] * 1e3:.1f}",
                         f"{med['softmax'] * 1e3:.1f}", f"{med['entmax'] / med['vitscope']:.1f}x",
                         f"{med['vitscope'] / med['softmax']:.2f}x", f"{err_ours:.1e} / {err_ref:.1e}", mem])
    return rows


def training_steps(device: str, repeats: int, clock=time.perf_counter) -> str:
    """A full vit-compact training step (batch 128, AdamW) with each normaliser, against softmax."""
    from timm.optim import create_optimizer_v2

    from vitscope.models import create

    images = torch.randn(128, 3, 32, 32, device=device)
    labels = torch.randint(0, 100, (128,), device=device)

    def stepper(attention: str):
        torch.manual_seed(0)
        model = create("vit-compact", attention=attention).to(device)
        optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)

        def step():
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    names = ["softmax", "entmax15", "sparsemax", "entmax:1.3", "entmax:learned"]
    med = interleaved_medians({n: stepper(n) for n in names}, repeats, sync=device == "cuda", clock=clock)
    rows = [[n, f"{med[n] * 1e3:.0f}", f"{med[n] / med['softmax']:.2f}x"] for n in names]
    return "vit-compact training step, batch 128\n" + table(rows, ["attention", "median ms", "vs softmax step"])


if __name__ == "__main__":
    main()
