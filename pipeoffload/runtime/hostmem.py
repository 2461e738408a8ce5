"""Host memory of a CPU pipeline process: keep what a microbatch freed for the next one.

A CPU step allocates and frees the same activations every microbatch. glibc's malloc gives freed
memory back to the OS: the free space at the top of its heap once it exceeds ``M_TRIM_THRESHOLD``,
and every block from ``M_MMAP_THRESHOLD`` up, which gets its own mapping (unmapped at free). Both
thresholds adapt only to the largest block freed so far, so a step's pattern (many blocks of a few
hundred KiB to a few MiB, freed together after a backward or an I, allocated again by the next
forward) keeps handing pages back and taking fresh ones: each fresh page is a page fault and a
zeroed page. On the 2-rank GPT of ``benchmarks/train_throughput.py`` that was 1,000-7,000 faults
per step per rank, in whatever code allocated next.

``keep_freed_memory`` raises both thresholds once per process, so freed blocks stay in the process
for the next allocation, as CUDA's caching allocator keeps device memory: the process keeps the
memory of its peak rather than giving it back between microbatches. It leaves malloc alone where
the C library has no ``mallopt`` (not glibc), where the user chose glibc's thresholds
(``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_``), or with
``PIPEOFFLOAD_KEEP_FREED_MEMORY=0``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # malloc.h
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 256 * 2**20  # free heap top kept in the process
MMAP_THRESHOLD = 64 * 2**20  # blocks below this come from the heap (and go back to it)
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


@functools.cache  # malloc's settings belong to the process: tried once
def keep_freed_memory() -> bool:
    """Raise glibc's trim and mmap thresholds (see the module doc); True if they are raised now."""
    return _apply()


def _apply() -> bool:
    if os.environ.get("PIPEOFFLOAD_KEEP_FREED_MEMORY", "1") == "0" or any(k in os.environ for k in _USER_SETTINGS):
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):  # not glibc: its malloc has its own policy
        mallopt = None
    if mallopt is None:
        return False
    # Setting one threshold stops glibc adapting the other: both are set together.
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not ok:
        log.debug("mallopt refused the thresholds; malloc keeps its own")
    return ok
