"""How vitscope's CPU threads wait and how many there are, on a machine other processes share.

Intra-op threads meet at a barrier after every operation. With OpenMP's default policy (libgomp, in torch's pip
wheels) a waiting thread spins for about 300,000 iterations before it sleeps, and on a shared core it holds the
core the thread it waits for needs: a training step ran 2.7-10x slower beside one or two busy processes
(``benchmarks/bench_shared_cpu.py``; docs/benchmarks.md). Waiting passively (``OMP_WAIT_POLICY=PASSIVE``) cures
that but costs idle speed on small steps (+22 % on a batch-32 step: every wake-up goes through the kernel).
The ``vitscope`` command therefore sets a short spin, ``GOMP_SPINCOUNT=10000`` (idle speed -5 to +11 % of the
default's in repeats, within the measuring machine's noise; passive +6 to +28 %), first thing in ``main()``,
when torch is not imported yet and neither ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT`` is set
(``apply_wait_policy``). ``import vitscope`` sets nothing: importing has no side effects.

When the policy can still act: libgomp reads its environment once, when torch's library is loaded (``import
torch``), not at the first parallel region: an ``OMP_NUM_THREADS`` set after ``import torch`` and before any
parallel region leaves ``omp_get_max_threads()`` at the old value (checked with ctypes on torch's libgomp,
torch 2.14.1), and ``GOMP_SPINCOUNT`` is parsed by the same start-up code. So a library user who imports torch
first keeps OpenMP's default wait; they get the short spin by exporting ``GOMP_SPINCOUNT=10000`` before starting
Python, or by calling ``apply_wait_policy()`` before their first ``import torch``. The thread count, in contrast,
is applied at any time (``torch.set_num_threads``).
``VITSCOPE_OMP_WAIT`` chooses: ``short`` (default), ``passive``, or ``default`` (OpenMP's own; the older
``VITSCOPE_OMP_PASSIVE=0`` means the same).

A thread that shares its core with another process still holds every barrier up, however it waits, so training
loops (the engine, packed runs, dense heads) also keep the intra-op thread count at the cores other processes
leave free while they run (``CoreShare``, re-counted every second from /proc/stat). ``VITSCOPE_THREADS`` turns
that off: ``fixed`` keeps the count (results can differ in the last bits with the thread count, so use it for
bit-for-bit runs on a busy machine), an integer sets that many threads, and ``auto`` sets them once, when the
command or loop starts, to the cores the runnable tasks in /proc/loadavg leave free (a user's ``OMP_NUM_THREADS``
wins over both). Both variables are checked where they are read (``wait_choice``, ``thread_choice``): a bad
value is a ``ValueError`` naming the variable, the value and the accepted forms. This module imports nothing
heavy at import: ``apply_wait_policy`` must be able to run before torch.
"""

from __future__ import annotations

import os
import sys
import time

WAIT_CHOICE = "VITSCOPE_OMP_WAIT"
THREADS_CHOICE = "VITSCOPE_THREADS"
SHORT_SPIN = "10000"  # GOMP_SPINCOUNT: libgomp's default is 300000 (30000 when threads outnumber cores)


def wait_choice() -> str:
    """``VITSCOPE_OMP_WAIT`` checked: ``short`` (unset), ``passive`` or ``default`` (also for the older
    ``VITSCOPE_OMP_PASSIVE=0``)."""
    choice = os.environ.get(WAIT_CHOICE, "").strip().lower() or (
        "default" if os.environ.get("VITSCOPE_OMP_PASSIVE") == "0" else "short")
    if choice not in ("short", "passive", "default"):
        raise ValueError(f"{WAIT_CHOICE}={os.environ[WAIT_CHOICE]!r} is not a wait policy; set it to 'short', "
                         f"'passive' or 'default', or unset it")
    return choice


def apply_wait_policy() -> str | None:
    """Apply ``VITSCOPE_OMP_WAIT`` (``short`` by default) by setting ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``;
    the variable set, or None when nothing was (already chosen by the user, OpenMP's default asked for, or torch
    already imported: libgomp has read its environment then, see the module's docstring). Call it before torch
    is imported; the ``vitscope`` command does, first thing."""
    choice = wait_choice()
    if choice == "default" or "torch" in sys.modules or {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ):
        return None
    name, value = ("GOMP_SPINCOUNT", SHORT_SPIN) if choice == "short" else ("OMP_WAIT_POLICY", "PASSIVE")
    os.environ[name] = value
    return name


def free_cores(samples: int = 5, interval_s: float = 0.01) -> int:
    """Cores of this process's CPU set not taken by other runnable tasks (median of ``samples`` reads of
    /proc/loadavg's running count, less this process's one), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    counts = []
    try:
        for _ in range(samples):
            with open("/proc/loadavg") as handle:
                counts.append(int(handle.read().split()[3].split("/")[0]))
            time.sleep(interval_s)
    except (OSError, ValueError, IndexError):
        return cores
    others = max(0, sorted(counts)[len(counts) // 2] - 1)
    return max(1, cores - others)


def thread_choice() -> str | int | None:
    """``VITSCOPE_THREADS`` checked: None (unset), ``"fixed"``, ``"auto"`` or a positive thread count. Checked
    even when ``OMP_NUM_THREADS`` overrides it, so a typo never passes silently."""
    raw = os.environ.get(THREADS_CHOICE, "")
    wanted = raw.strip().lower()
    if not wanted:
        return None
    if wanted in ("fixed", "auto"):
        return wanted
    if wanted.isdigit() and int(wanted) > 0:
        return int(wanted)
    raise ValueError(f"{THREADS_CHOICE}={raw!r} is not a thread setting; set it to 'auto', 'fixed' or a positive "
                     f"integer (e.g. {THREADS_CHOICE}=4), or unset it")


def chosen_thread_count() -> int | None:
    """The intra-op thread count ``VITSCOPE_THREADS`` asks for (``auto``: the free cores now), or None when it
    is unset or ``fixed``, or when the user's ``OMP_NUM_THREADS`` decides."""
    choice = thread_choice()
    if choice is None or choice == "fixed" or "OMP_NUM_THREADS" in os.environ:
        return None
    return free_cores() if choice == "auto" else int(choice)


def apply_thread_count() -> int | None:
    """Set torch's intra-op threads to ``chosen_thread_count()``; the count set, or None (left alone)."""
    count = chosen_thread_count()
    if count is not None:
        import torch

        torch.set_num_threads(count)
    return count


ADAPT_INTERVAL_S = 1.0  # how often the training loops re-count the free cores


def _busy_seconds(cpus: set[int]) -> float | None:
    """CPU seconds all processes have spent on ``cpus`` since boot (/proc/stat: user, nice, system, irq, softirq,
    steal), or None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


class CoreShare:
    """Keeps torch's intra-op threads at the cores other processes leave free, re-counted every ``interval_s``
    (CPU devices only; a context manager that restores the count on leaving).

    Intra-op threads meet at a barrier after every operation, so a thread that shares its core with another
    process holds all the others up: beside one busy process, two threads took 2.4x and beside two 4.5x an idle
    step, where one thread on the free core takes less (docs/benchmarks.md, ``bench_shared_cpu.py``). Each
    ``tick()`` (one per training step) that finds ``interval_s`` passed reads the CPU time spent on this process's
    cores (/proc/stat) less this process's own, so the others' load in cores, and sets the thread count to the
    cores left (at least 1, at most the count it started with). Constructing it applies ``VITSCOPE_THREADS`` (an
    integer or ``auto``: that many threads from the start; checked, so a bad value raises as the loop starts).
    That variable set to anything (``fixed`` too), a start at one thread, or no /proc/stat then leaves the count
    alone. Results can differ in
    the last bits with the thread count: ``VITSCOPE_THREADS=fixed`` keeps runs on a busy machine bit for bit."""

    def __init__(self, device: object = "cpu", interval_s: float = ADAPT_INTERVAL_S):
        import torch

        self.before = torch.get_num_threads()
        apply_thread_count()  # VITSCOPE_THREADS=N|auto (checked: a bad value raises here, as the loop starts)
        self.interval_s = interval_s
        self.cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        self.most = torch.get_num_threads()
        self.counts: dict[int, int] = {}  # steps run at each thread count
        busy = _busy_seconds(self.cpus)
        self.enabled = (torch.device(device).type == "cpu" and thread_choice() is None
                        and self.most > 1 and busy is not None)
        self._mark = (time.monotonic(), busy or 0.0, time.process_time())

    def tick(self) -> int:
        """Count one step; re-count the free cores when due. Returns the thread count now."""
        import torch

        threads = torch.get_num_threads()
        self.counts[threads] = self.counts.get(threads, 0) + 1
        now = time.monotonic()
        if not self.enabled or now - self._mark[0] < self.interval_s:
            return threads
        busy, mine = _busy_seconds(self.cpus) or 0.0, time.process_time()
        wall, busy_then, mine_then = self._mark
        others = max(0.0, (busy - busy_then) - (mine - mine_then)) / (now - wall)  # cores the others used
        self._mark = (now, busy, mine)
        wanted = max(1, min(self.most, round(len(self.cpus) - others)))
        if wanted != threads:
            torch.set_num_threads(wanted)
        return wanted

    def restore(self) -> None:
        """Back to the thread count the caller had before."""
        import torch

        if torch.get_num_threads() != self.before:
            torch.set_num_threads(self.before)

    def __enter__(self) -> CoreShare:
        return self

    def __exit__(self, *_: object) -> None:
        self.restore()

    def summary(self) -> str:
        """Which thread counts the steps ran at, e.g. "2 threads: 950 steps, 1 thread: 50 steps"."""
        if not self.enabled:
            return f"{self.most} thread(s), fixed"
        return ", ".join(f"{n} thread{'s' if n > 1 else ''}: {k} steps" for n, k in sorted(self.counts.items(),
                                                                                           reverse=True))
