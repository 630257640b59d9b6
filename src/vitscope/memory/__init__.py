"""Memory: how much a job may use (``budget``), what its batches will take (``estimate``), keeping freed memory in
the process for loops that allocate the same large arrays every step (``kept``), and handing large freed blocks
back at once where temporaries vary in size (``returned``; both glibc only)."""

from vitscope.memory.budget import (
    BUDGET_VARIABLE,
    MemoryBudget,
    available_memory,
    gigabytes,
    memory_budget,
    parse_size,
    peak_rss,
    process_rss,
)
from vitscope.memory.estimate import ForwardShape, MemoryEstimate
from vitscope.memory.kept import freed_memory_kept, glibc
from vitscope.memory.returned import freed_memory_returned

__all__ = ["BUDGET_VARIABLE", "ForwardShape", "MemoryBudget", "MemoryEstimate", "available_memory",
           "freed_memory_kept", "freed_memory_returned", "gigabytes", "glibc", "memory_budget", "parse_size",
           "peak_rss", "process_rss"]
