"""Memory of a long-running process: what a closed connection held goes back promptly, and back to the OS.

Measured with the soak benchmark's hostile phase (`specvoice bench soak --turns 0`, small config), RSS grew by
~400 MB over 600 hostile inputs, and the cause was not a leak:

- Every connection's ``Session`` is a reference cycle with its transport (the session calls back into the
  connection, the connection holds the session; exception tracebacks hold their frames), so when it closes only
  Python's cyclic collector frees it, and with it the session's KV caches and listener (several MB each).
  CPython runs a full collection only once the objects that survived since the last one number a quarter of
  the long-lived ones, and a process with the models loaded holds ~400k long-lived objects (torch,
  transformers, tokenizers): full passes were rare (three a minute under fire) and each took ~150 ms on the
  event loop. Up to ~350 MB of closed sessions waited for one. ``settle_after_load`` collects once and then
  freezes everything alive (``gc.freeze``): a full pass then scans only what was made since (milliseconds), so
  the ``Trimmer`` can run one shortly after sessions close, and a closed session is freed within seconds.
- glibc malloc keeps freed memory in its arenas (one per thread that allocates: the event loop, the model
  workers, the libraries' pools), so RSS stays at the high-water mark of everything ever live at once.
  ``release_free_memory`` (``malloc_trim(0)``) hands the free pages back; ``Trimmer`` does it shortly after
  sessions close, at most once per interval. Allocator settings were measured too (MALLOC_ARENA_MAX=2, a fixed
  mmap threshold): they shrink the RSS after loading (loading's free heap, which the trim after loading also
  returns) but not the growth under fire, so the service units set none.

Every Assistant has a Trimmer; ``settle_after_load`` is called only where the models are kept until the process
exits (``serve()`` when it loads them, the home device, and the soak benchmark that stands for them): a frozen
object is never examined by the cyclic collector again, which would be wrong for a test that loads several
assistants. Without a freeze the Trimmer only trims (a full collection would then stall the loop).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable
from functools import cache
from typing import Any

log = logging.getLogger("specvoice.memory")

TRIM_INTERVAL_S = 5.0  # at most one collection + malloc_trim per this many seconds


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (musl, macOS: their allocators return memory their own way)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim: Any = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the OS. True when glibc did (it says whether any were released)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def settle_after_load() -> None:
    """Once the models are loaded, before serving: collect what loading left behind, freeze every object alive
    now out of the cyclic collector's work (see the module docstring), and return the loading's free heap."""
    gc.collect()
    gc.freeze()
    release_free_memory()
    log.debug("memory settled", extra={"frozen_objects": gc.get_freeze_count()})


class Trimmer:
    """Soon after sessions close (``delay_s`` after a close, at most once per ``interval_s``): a full collection,
    which frees the closed sessions' cycles, then ``release_free_memory``. A timer on the event loop, not a task
    or a thread: nothing is left running when the loop ends, and both steps are short once the models are frozen
    (`bench soak` reports the slowest run)."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S, delay_s: float = 0.5) -> None:
        self.interval_s, self.delay_s = interval_s, delay_s
        self._last = -interval_s
        self._timer: asyncio.TimerHandle | None = None
        self.runs = 0  # for tests and the soak benchmark
        self.slowest_ms = 0.0  # the longest any run held the event loop

    def session_closed(self) -> None:
        """A session ended: run once it is gone (unless a run is already due)."""
        if self._timer is not None and self._timer.when() > self._now():  # one is due (a closed loop's never is)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a session closed at exit): nothing to schedule
            return
        self._timer = loop.call_at(max(loop.time() + self.delay_s, self._last + self.interval_s), self.run)

    def _now(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return float("inf")

    def run(self) -> None:
        started = time.perf_counter()
        if gc.get_freeze_count():  # a few ms once the models are frozen; not before (~150 ms on the event loop:
            gc.collect()  # an unfrozen process leaves the cycles to the automatic collector)
        release_free_memory()
        ms = round(1000 * (time.perf_counter() - started), 1)
        self.slowest_ms = max(self.slowest_ms, ms)
        self._last, self._timer = self._now(), None
        self.runs += 1
        log.debug("memory trimmed", extra={"ms": ms})

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
