"""How many cores other programs leave us: llama.cpp's thread count on a CPU someone else is using too.

llama.cpp splits every pass across its threads and waits for the slowest. On a 2-core machine with one core kept
busy by another process (a compile, a backup), the thread that shares that core gets half of it, and the other
spins at the barrier: a pass takes as long as the whole pass on one thread, or longer, and burns the free core
while it waits. Running on the cores that are free avoids that. ``CpuShare`` measures, over the last half second
or more, the CPU time the whole machine spent busy (``/proc/stat``) less what this process spent
(``/proc/self/stat``), i.e. the cores others keep busy, and ``threads()`` leaves those out. Where /proc is not
there (another OS) it always answers the configured count.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

MIN_WINDOW_S = 0.5  # measure over at least this long: /proc counts in 10 ms ticks
GIVE_UP_AT = 0.6  # others keep n - 1 + this cores busy: leave n out ...
TAKE_BACK_AT = 0.4  # ... and take one back only below n - 1 + this (no flapping on a load that hovers at half)
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest time is inside user)


def _machine_busy_ticks() -> int:
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return sum(values[i] for i in _BUSY_FIELDS if i < len(values))


def _own_ticks() -> int:
    with open("/proc/self/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[11]) + int(fields[12])  # utime, stime: every thread of this process


@dataclass
class CpuShare:
    """The cores to run on: ``cpus`` less those other processes keep busy (at least one)."""

    cpus: int
    _last: tuple[float, int, int] | None = None  # (time, machine busy ticks, own ticks) at the last reading
    _others: int = 0  # whole cores others keep busy, as last decided
    ok: bool = True  # False once /proc could not be read: the configured count from then on

    def __post_init__(self) -> None:
        self._tick_s = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self._read()

    def _read(self) -> tuple[float, int, int] | None:
        if not self.ok:
            return None
        try:
            now = (time.monotonic(), _machine_busy_ticks(), _own_ticks())
        except (OSError, ValueError, IndexError):
            self.ok = False
            return None
        if self._last is None:
            self._last = now
        return now

    def others_busy(self) -> float | None:
        """Cores others kept busy since the last reading (None: too soon to say, or no /proc)."""
        last = self._last
        if last is None or time.monotonic() - last[0] < MIN_WINDOW_S:
            return None
        now = self._read()
        if now is None:
            return None
        self._last = now
        elapsed = now[0] - last[0]
        return max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) * self._tick_s / elapsed)

    def threads(self) -> int:
        """How many threads to run now: cheap to call every pass (it reads /proc at most every MIN_WINDOW_S)."""
        others = self.others_busy()
        if others is not None:
            up, down = int(others + 1 - GIVE_UP_AT), int(others + 1 - TAKE_BACK_AT)  # 0.6 -> 1 core, 0.4 -> 1
            if up > self._others:
                self._others = min(self.cpus - 1, up)
            elif down < self._others:
                self._others = down
        return max(1, self.cpus - self._others)
