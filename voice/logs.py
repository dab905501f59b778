"""Structured logging: one JSON object per line (or plain text), quiet by default.

Modules log with ``log.info("message", extra={...})``; the extra fields become keys of the JSON object.
Under systemd, when stderr is the journal's stream (``$JOURNAL_STREAM`` names its device and inode), every line
starts with its syslog priority (``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug), which journald
reads as the entry's priority: ``journalctl -p warning -u specvoice`` then shows the problems only.
Warnings about client input go through ``ClientWarnings`` (rate-limited per client).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

# syslog priorities (sd-daemon(3)); Python's levels in between round down to the more severe one
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def journal_priority(levelno: int) -> int:
    for level, priority in _PRIORITIES:
        if levelno >= level:
            return priority
    return 7


def writes_to_journal(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """True when ``stream`` is the journald stream systemd connected (``$JOURNAL_STREAM`` = "device:inode")."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(part) for part in value.split(":"))
        info = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (info.st_dev, info.st_ino) == (device, inode)


class JournalPriority(logging.Formatter):
    """Wraps a formatter: the ``<N>`` priority prefix journald understands on each line."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{journal_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in self.inner.format(record).splitlines() or [""])


_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        return f"{stamp} {record.levelname.lower():7s} {record.name}: {record.getMessage()} {extras}".rstrip()


def setup_logging(level: str = "WARNING", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    handler.setFormatter(JournalPriority(formatter) if writes_to_journal(sys.stderr) else formatter)
    root = logging.getLogger("specvoice")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class ClientWarnings:
    """Warnings about what clients send, at most ``burst`` per client per ``period_s``.

    Why: a client that sends garbage in a loop must not fill the disk or drown the warnings about other clients.
    Each client (an address, usually) has a token bucket; a warning that finds it empty is not logged but
    counted, and the count rides along with the client's next logged warning (``suppressed``). At most
    ``max_clients`` buckets are kept (least recently warned first out), so spoofed or many addresses cannot
    grow it either. Never logs a traceback unless asked (``exc_info``: for a bug, not for bad input)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        period_s: float = 60.0,
        max_clients: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.burst, self.period_s, self.max_clients = logger, burst, period_s, max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self.logged = 0
        self.suppressed = 0

    def warn(self, client: str, message: str, *, exc_info: bool = False, **extra: Any) -> bool:
        """Log ``message`` about ``client`` unless it has had its share; True if it was logged."""
        now = self._clock()
        bucket = self._buckets.pop(client, None) or _Bucket(float(self.burst), now)
        self._buckets[client] = bucket  # most recently used last
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.t) * self.burst / self.period_s)
        bucket.t = now
        if bucket.tokens < 1.0:
            bucket.dropped += 1
            self.suppressed += 1
            return False
        bucket.tokens -= 1.0
        if bucket.dropped:
            extra["suppressed"], bucket.dropped = bucket.dropped, 0
        self.logger.warning(message, extra={"client": client, **extra}, exc_info=exc_info)
        self.logged += 1
        return True


@dataclass
class _Bucket:
    tokens: float
    t: float
    dropped: int = 0


class RateLimitedLog:
    """``ClientWarnings`` for one client whose every line carries the same ``context`` (a websocket connection:
    session, peer): ``warning(message, **fields)``, at most ``burst`` per ``period_s``."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        period_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        **context: Any,
    ) -> None:
        self._warnings = ClientWarnings(logger, burst=burst, period_s=period_s, max_clients=1, clock=clock)
        self.context = context
        self.client = str(context.get("peer", ""))

    def warning(self, message: str, **fields: Any) -> bool:
        """Log unless over the rate; returns whether it was logged."""
        return self._warnings.warn(self.client, message, **{**self.context, **fields})
