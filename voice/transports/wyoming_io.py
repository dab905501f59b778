"""The byte side of a Wyoming connection: a reader that refuses hostile lengths and silent clients, and the
connection as an audio sink.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
from wyoming.error import Error


class BoundedReader:
    """Wraps the connection's StreamReader so one event can never claim more than ``limit`` bytes and a silent
    client is dropped after ``idle_s``. wyoming's reader trusts ``data_length``/``payload_length``; this is where
    a hostile length is refused. Problems end the read (EOF) and are kept in ``problem`` for the handler."""

    def __init__(self, reader: asyncio.StreamReader, limit: int, idle_s: float) -> None:
        self._reader, self.limit, self.idle_s = reader, limit, idle_s
        self.problem: Error | None = None
        self.busy = False  # a request is being answered: the idle clock does not run

    async def readline(self) -> bytes:
        while True:
            try:
                return await asyncio.wait_for(self._reader.readline(), timeout=self.idle_s)
            except TimeoutError:
                if self.busy:
                    continue
                self.problem = Error(f"idle for {self.idle_s:g} s; closing (server.idle_timeout_s)", "idle_timeout")
                return b""
            except ValueError:  # the header line is longer than the stream's limit
                self.problem = Error("event header line too long; closing", "message_too_big")
                return b""

    async def readexactly(self, n: int) -> bytes:
        if n > self.limit:
            self.problem = Error(f"event of {n} bytes exceeds the {self.limit}-byte limit "
                                 "(server.max_message_bytes); send smaller audio chunks", "message_too_big")
            raise ValueError(self.problem.text)  # wyoming's reader turns this into end-of-stream
        return await self._reader.readexactly(n)

    def feed_eof(self) -> None:
        self._reader.feed_eof()


class WyomingSink:
    """The connection as a speaker: audio goes out as ``audio-chunk`` events; what was sent is what was heard."""

    def __init__(self, write: Callable[[np.ndarray, int], Awaitable[None]], sample_rate: int) -> None:
        self._write = write
        self.sample_rate = sample_rate
        self.first_audible_t: float | None = None
        self.played_samples = 0

    def begin_utterance(self) -> None:
        self.first_audible_t, self.played_samples = None, 0

    async def write(self, samples: np.ndarray) -> None:
        await self._write(samples, self.sample_rate)
        self.first_audible_t = self.first_audible_t or time.monotonic()
        self.played_samples += len(samples)

    def flush(self) -> None:
        """Nothing is queued: every chunk is written to the socket as it comes."""

    async def drain(self) -> None:
        """Written is delivered, as far as we can know."""

    def heard_samples(self) -> int:
        return self.played_samples
