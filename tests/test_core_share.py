"""CoreShare: training loops drop intra-op threads while another process holds a core, and restore them."""

import os
import subprocess
import sys
import time

import pytest
import torch

from vitscope.threads import CoreShare, _busy_seconds

CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
pytestmark = pytest.mark.skipif(len(CPUS) != 2 or _busy_seconds(CPUS) is None,
                                reason="measured on the 2-core Linux machines the suite runs on")


def _tick_for(cores: CoreShare, seconds: float) -> list[int]:
    counts, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)  # a step that leaves the cores to others: what is measured is their load
        counts.append(cores.tick())
    return counts


def test_a_busy_process_takes_a_thread_and_leaving_gives_it_back(monkeypatch):
    monkeypatch.delenv("VITSCOPE_THREADS", raising=False)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with CoreShare(interval_s=0.3) as cores:
            assert cores.enabled
            during = _tick_for(cores, 1.5)
            assert during[-1] == 1 and torch.get_num_threads() == 1, during  # one core left free
        assert torch.get_num_threads() == 2  # restored on leaving
        assert "1 thread:" in cores.summary()
    finally:
        busy.kill()
        busy.wait()
        torch.set_num_threads(previous)


def test_fixed_threads_and_one_thread_leave_the_count_alone(monkeypatch):
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("VITSCOPE_THREADS", "fixed")
        assert not CoreShare().enabled
        monkeypatch.delenv("VITSCOPE_THREADS")
        torch.set_num_threads(1)
        assert not CoreShare().enabled  # a loop that chose one thread keeps it
        assert not CoreShare("cuda").enabled
    finally:
        torch.set_num_threads(previous)
