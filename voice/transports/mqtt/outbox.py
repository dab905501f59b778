"""What the MQTT bridge has to send, while the broker is slow or away, and the guards against a flood.

Why a bounded outbox with priorities: while the broker is away, turns go on and their messages wait; any client
can also make the bridge talk (every bad payload earns an error report, every ``homeassistant/status`` a round of
discovery). The outbox holds at most ``limit`` results and telemetry; when full, telemetry goes first (oldest
first), then the oldest result. Control messages (availability, state, discovery configs) replace the pending
message on the same topic, so they never pile up and are never dropped: only the latest state matters. Home
commands are never dropped or replaced either; they leave by being sent or withdrawn (home_commands.py).
Publishing takes commands first, then control, results and telemetry; first in, first out within each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from voice.transports.mqtt.payloads import Outgoing, Priority


class Outbox:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.dropped = 0
        self.changed = asyncio.Event()
        self._queues: dict[Priority, deque[Outgoing]] = {p: deque() for p in Priority}

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def put(self, message: Outgoing) -> Outgoing | None:
        """Queue ``message``; returns the message dropped to make room (possibly ``message`` itself), if any."""
        queue = self._queues[message.priority]
        if message.priority is Priority.COMMAND:  # each one is a request of its own: none replaces another
            queue.append(message)
            self.changed.set()
            return None
        if message.priority is Priority.CONTROL:
            for i, pending in enumerate(queue):
                if pending.topic == message.topic:
                    queue[i] = message  # the newer value replaces the one not yet sent
                    self.changed.set()
                    return None
            queue.append(message)
            self.changed.set()
            return None
        dropped = None
        if len(self._queues[Priority.RESULT]) + len(self._queues[Priority.TELEMETRY]) >= self.limit:
            victim = next((p for p in (Priority.TELEMETRY, Priority.RESULT) if self._queues[p]), None)
            # nothing waiting matters less than this message: it is the one dropped
            dropped = message if victim is None or victim < message.priority else self._queues[victim].popleft()
            self.dropped += 1
        if dropped is not message:
            queue.append(message)
            self.changed.set()
        return dropped

    def waiting(self, priority: Priority) -> int:
        return len(self._queues[priority])

    def head(self) -> Outgoing | None:
        for priority in Priority:
            if self._queues[priority]:
                return self._queues[priority][0]
        return None

    def done(self, message: Outgoing) -> None:
        """``message`` was acknowledged (or skipped): it leaves, unless it was already replaced or dropped."""
        queue = self._queues[message.priority]
        if queue and queue[0] is message:
            queue.popleft()
        else:
            try:
                queue.remove(message)
            except ValueError:
                pass

    async def wait(self) -> Outgoing | None:
        """The next message to send; None when woken with nothing to send (``changed`` set by hand)."""
        if self.head() is None:
            self.changed.clear()
            await self.changed.wait()
        return self.head()


class TokenBucket:
    """At most ``burst`` at once and ``rate`` per second after that, per key (e.g. per topic). Why: a client
    that floods one topic must not flood the log or the error topic, and must not starve the other topics."""

    def __init__(self, rate: float, burst: float, max_keys: int = 256) -> None:
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: dict[str, tuple[float, float]] = {}
        self.refused: dict[str, int] = {}

    def allow(self, key: str) -> bool:
        now = time.monotonic()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if len(self._buckets) >= self.max_keys and key not in self._buckets:
            self._buckets.pop(next(iter(self._buckets)))  # forget the oldest key: memory stays bounded
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            self.refused[key] = self.refused.get(key, 0) + 1
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True

    def take_refused(self, key: str) -> int:
        return self.refused.pop(key, 0)


class QuietLog:
    """Warnings rate-limited per key (one per ``interval_s``); the next one says how many were held back."""

    def __init__(self, log: logging.Logger, interval_s: float = 10.0) -> None:
        self.log = log
        self._limit = TokenBucket(rate=1.0 / interval_s, burst=1.0)

    def warning(self, key: str, message: str, **extra: object) -> None:
        if self._limit.allow(key):
            held = self._limit.take_refused(key)
            self.log.warning(message, extra={**extra, **({"held_back": held} if held else {})})
