"""Structured logging: one JSON object per line (or plain text), quiet by default.

Modules log with ``log.info("message", extra={...})``; the extra fields become keys of the JSON object.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

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
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("specvoice")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class RateLimitedLog:
    """Warnings about one client, at most ``burst`` per ``period_s`` (a token bucket); the ones held back are
    counted, and the next warning that gets through says how many (``suppressed``). Why: a client that sends bad
    messages in a loop must not flood the journal, and one bad message must still be visible."""

    def __init__(self, logger: logging.Logger, *, burst: int = 5, period_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, **context: Any) -> None:
        self.logger, self.burst, self.period_s, self.clock = logger, burst, period_s, clock
        self.context = context  # e.g. session=..., peer=...: added to every line
        self._tokens = float(burst)
        self._last = clock()
        self.suppressed = 0

    def warning(self, message: str, **fields: Any) -> bool:
        """Log unless over the rate; returns whether it was logged."""
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.burst / self.period_s)
        self._last = now
        if self._tokens < 1.0:
            self.suppressed += 1
            return False
        self._tokens -= 1.0
        extra = {**self.context, **fields}
        if self.suppressed:
            extra["suppressed"], self.suppressed = self.suppressed, 0
        self.logger.warning(message, extra=extra)
        return True
