"""freed_memory_returned: large freed blocks go back to the system at once, even after glibc has raised its mmap
threshold (glibc only; a fresh process, since the allocator's state is process-wide)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vitscope.memory import glibc

pytestmark = pytest.mark.skipif(glibc() is None, reason="glibc's mallopt is what the context sets")

SCRIPT = textwrap.dedent("""
    import json
    import torch
    from vitscope.memory import freed_memory_returned, process_rss

    def held_after_free(mib):  # what the process still holds after a MiB-sized tensor is written and freed
        before = process_rss()
        block = torch.empty(mib * 2**18).fill_(1.0)
        guard = torch.ones(1024)  # a small block allocated after it: a freed heap block below it cannot be trimmed
        del block
        return (process_rss() - before) / 2**20, guard

    torch.empty(20 * 2**18).fill_(1.0)  # mapped and freed: glibc raises its mmap threshold to 20 MiB
    outside, _guard1 = held_after_free(16)
    with freed_memory_returned() as took:
        inside, _guard2 = held_after_free(16)
    print(json.dumps({"took": took, "outside": outside, "inside": inside}))
""")


def test_large_blocks_are_returned_inside():
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    held = json.loads(out.stdout.strip().splitlines()[-1])
    assert held["took"]
    assert held["outside"] > 12, held  # glibc's default: the 16 MiB block stays in its heap
    assert held["inside"] < 4, held  # mapped on its own and unmapped when freed


def test_a_threshold_the_environment_sets_stands():
    # the estimate's own test maps every block over 64 KB on its own: the context must not raise that to 4 MiB
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin", "MALLOC_MMAP_THRESHOLD_": "65536"})
    held = json.loads(out.stdout.strip().splitlines()[-1])
    assert not held["took"]
    assert held["outside"] < 4 and held["inside"] < 4, held  # 64 KB: every such block mapped on its own throughout
