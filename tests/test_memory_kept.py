"""freed_memory_kept: a loop that allocates the same large array every step reuses its pages (glibc)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vitscope.memory import glibc

pytestmark = pytest.mark.skipif(glibc() is None, reason="glibc's mallopt is what the context sets")
PAGES = 40 * 2**20 // 4096  # a 40 MiB float32 array (above glibc's largest mmap threshold) is 10240 pages

SCRIPT = textwrap.dedent("""
    import json, resource
    import torch
    from vitscope.memory import freed_memory_kept
    import vitscope.record  # noqa: F401  (a training process has its modules loaded: small objects find room elsewhere)

    def faults(steps, mib=40):  # minor page faults while a fresh MiB-sized float32 array is written and freed
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(steps):
            torch.empty(mib * 2**18).fill_(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    outside = faults(10)
    with freed_memory_kept() as took, freed_memory_kept() as nested:  # nesting keeps the outer setting
        inside = faults(10)
    # after: a larger array, which the 40 MiB block kept in glibc's bins (when a small allocation landed after it,
    # so that malloc_trim could only discard its pages) cannot serve; with the defaults back, it is mapped afresh
    print(json.dumps({"took": took and nested, "outside": outside, "inside": inside, "after": faults(10, mib=48)}))
""")


def test_pages_are_reused_inside_and_handed_back_after():
    # a fresh process: glibc's allocator state is process-wide, and the suite's other tests change it
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120,
                         env={"PYTHONPATH": src, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    faults = json.loads(out.stdout.strip().splitlines()[-1])
    assert faults["took"]
    assert faults["outside"] > 9 * PAGES, faults  # every step maps fresh pages (glibc's default at this size)
    assert faults["inside"] < 4 * PAGES, faults  # the first steps' pages serve the others (measured: 2 steps)
    assert faults["after"] > 9 * 1.2 * PAGES, faults  # the default is back once the context ends (48 MiB arrays)
