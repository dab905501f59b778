"""Back a model's weights with huge pages (Linux), so each decoded token's sweep over them misses the TLB less.

Why: decoding one token reads every weight once, ~1 GB for the 1.5B target in 4 bits. With 4 KiB pages that
is ~260 000 page-table walks per token, which on a virtual machine are two-level walks. llama.cpp allocates its
CPU weight buffer with plain ``malloc``, and with the kernel's usual transparent-huge-page setting
(``madvise``) such memory stays in small pages. Measured on a 2-core EPYC VM: the same GGUF decoded 24-26 tok/s
in small pages and 27-29 tok/s after ``MADV_COLLAPSE``; and two copies of one GGUF loaded in one process ran up
to 6% apart depending only on where their pages happened to land, which huge pages take away.

How: note the process's anonymous mappings before the load, and after it mark each new large one
``MADV_HUGEPAGE`` and collapse it now (``MADV_COLLAPSE``, Linux 6.1+; ~3 s a GB on 2 cores), rather than waiting
minutes for khugepaged. A long-lived process may serve the load from memory it freed before (no new range
to find: ``why_not`` says so); a service loads its model at start, where the range is new. Anywhere this is
not possible (another OS, an older kernel, THP set to ``never``, no memory to spare) the model stays as it was
and a debug line says why: huge pages are a speed-up, never a requirement.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("specvoice.llm")

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
# MADV_COLLAPSE's EAGAIN is transient (a huge page it could not get at that moment): seen once in a CI run, the
# same load in isolation then collapsed. So a collapse is tried this many times before it counts as failed.
COLLAPSE_TRIES = 3
MIN_MAPPING = 32 << 20  # a weight buffer, not the allocator's small arenas
_MAPS = Path("/proc/self/maps")


@dataclass(frozen=True)
class HugePages:
    """What ``collapse_new`` did: bytes now in huge pages, and the time it took."""

    bytes: int = 0
    seconds: float = 0.0
    why_not: str = ""  # empty when it worked (or when there was nothing new to collapse)


def anonymous_mappings() -> dict[int, int]:
    """Start -> length of this process's large anonymous mappings (empty where /proc is not there)."""
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[5] != "[heap]":  # a file or the stack (the heap may hold a large malloc)
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if end - start >= MIN_MAPPING:
            found[start] = end - start
    return found


def new_ranges(before: dict[int, int], after: dict[int, int]) -> list[tuple[int, int]]:
    """(start, length) of the address ranges mapped in ``after`` but not in ``before``. By range, not by mapping:
    the kernel merges a new anonymous mapping into a neighbour with the same flags, so a model loaded after
    another can extend the other's mapping instead of making its own."""
    found = []
    for start, length in sorted(after.items()):
        pieces = [(start, start + length)]
        for old, old_length in before.items():
            pieces = [
                part
                for lo, hi in pieces
                for part in ((lo, min(hi, old)), (max(lo, old + old_length), hi))
                if part[1] - part[0] >= MIN_MAPPING
            ]
        found += [(lo, hi - lo) for lo, hi in pieces]
    return found


def collapse_new(before: dict[int, int]) -> HugePages:
    """Collapse the large anonymous ranges mapped since ``before`` (the weights just loaded) into huge pages.
    Ranges mapped meanwhile by other threads are collapsed too, which does them no harm."""
    new = new_ranges(before, anonymous_mappings())
    if not new:
        return HugePages(why_not="no new mapping found" if _MAPS.exists() else "no /proc/self/maps")
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return HugePages(why_not="no C library found")
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    started, done = time.monotonic(), 0
    for start, length in new:
        if (failed := _advise(libc, start, length)) != 0:
            why = f"madvise failed: errno {failed}" + (" (kernel before 6.1, or THP off)" if failed == 22 else "")
            return HugePages(done, time.monotonic() - started, why)
        done += length
    return HugePages(done, time.monotonic() - started)


def _advise(libc: ctypes.CDLL, start: int, length: int) -> int:
    """Mark a range for huge pages and collapse it now: 0, or the errno of the call that failed."""
    if libc.madvise(start, length, MADV_HUGEPAGE) != 0:
        return ctypes.get_errno()
    failed = 0
    for _ in range(COLLAPSE_TRIES):
        if libc.madvise(start, length, MADV_COLLAPSE) == 0:
            return 0
        if (failed := ctypes.get_errno()) != errno.EAGAIN:
            break
    return failed


__all__ = ["HugePages", "anonymous_mappings", "collapse_new", "new_ranges"]
