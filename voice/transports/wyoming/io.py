"""The byte side of a Wyoming connection: an event reader that trusts nothing the client sends, and the
connection as an audio sink.

A Wyoming event is a JSON header line, then ``data_length`` bytes of JSON, then ``payload_length`` bytes of
payload. The ``wyoming`` package's own reader trusts all three: a header that is valid JSON but not an object,
a length that is a string, or data that is a list escape it as exceptions, and a client that stops inside an
event holds its connection (and session slot) forever. ``EventReader`` refuses each of these with a
``ProtocolProblem`` that names it, and gives every event, once its first byte arrived, ``read_timeout_s`` to
arrive whole.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from wyoming.error import Error
from wyoming.event import Event


class ProtocolProblem(Exception):
    """Something a client sent that ends its connection: answered with an ``error`` event, then closed."""

    def __init__(self, text: str, code: str) -> None:
        super().__init__(text)
        self.text, self.code = text, code

    def event(self) -> Event:
        return Error(self.text, self.code).event()


class Refused(Exception):
    """A request the server will not do (a field missing or of the wrong type, audio it cannot convert, ...):
    answered with an ``error`` event; the connection goes on."""

    def __init__(self, text: str, code: str = "bad_event") -> None:
        super().__init__(text)
        self.text, self.code = text, code


MAX_ID_CHARS = 200  # a conversation id longer than this is not an id


def text_field(event: Event) -> str:
    text = event.data.get("text")
    if not isinstance(text, str):
        raise Refused(f'{event.type!r:.40} needs "text" as a string, not {type(text).__name__}')
    return text


def conversation_id(event: Event) -> str | None:
    """Home Assistant's ``context.conversation_id`` of a ``transcript`` (None: a one-off question)."""
    context = event.data.get("context")
    if context is None:
        return None
    if not isinstance(context, dict):
        raise Refused(f'"context" must be an object, not {type(context).__name__}')
    cid = context.get("conversation_id")
    if cid is None or cid == "":
        return None
    if not isinstance(cid, str) or len(cid) > MAX_ID_CHARS:
        raise Refused(f'"context.conversation_id" must be a string of at most {MAX_ID_CHARS} characters')
    return cid


class EventReader:
    """Reads whole events from a StreamReader; ``read()`` returns None when the client has gone.

    ``limit``: the most bytes one event's data and payload may claim (``server.max_message_bytes``; the header
    line is capped by the stream's own limit). ``idle_s``: how long a client may stay silent between events.
    ``read_s``: how long an event may take from its first byte to its last (``wyoming.read_timeout_s``)."""

    def __init__(self, reader: asyncio.StreamReader, limit: int, idle_s: float, read_s: float) -> None:
        self._reader = reader
        self.limit, self.idle_s, self.read_s = limit, idle_s, read_s
        self.busy = False  # a request is being answered (shutdown waits for those)

    async def read(self) -> Event | None:
        try:
            first = await asyncio.wait_for(self._reader.readexactly(1), timeout=self.idle_s)
        except TimeoutError:
            raise ProtocolProblem(
                f"idle for {self.idle_s:g} s; closing (server.idle_timeout_s)", "idle_timeout"
            ) from None
        except asyncio.IncompleteReadError:
            return None
        try:
            async with asyncio.timeout(self.read_s):
                return await self._rest(first)
        except TimeoutError:
            raise ProtocolProblem(
                f"an event took more than {self.read_s:g} s to arrive; closing "
                "(wyoming.read_timeout_s): send each event's header, data and payload at once",
                "read_timeout",
            ) from None
        except asyncio.IncompleteReadError:  # the client closed (its side) inside an event: it may still read
            raise ProtocolProblem(
                "the connection ended in the middle of an event (fewer bytes than the header's "
                "lengths promised); closing",
                "incomplete_event",
            ) from None

    async def _rest(self, first: bytes) -> Event:
        line = first if first == b"\n" else first + await self._readline()
        if not line.endswith(b"\n"):
            raise asyncio.IncompleteReadError(line, None)
        header = _json_object(line, "event header")
        kind = header.get("type")
        if not isinstance(kind, str) or not kind:
            raise ProtocolProblem('the event header needs a "type" string, e.g. {"type": "describe"}', "bad_header")
        data_length = _length(header, "data_length")
        payload_length = _length(header, "payload_length")
        if data_length + payload_length > self.limit:
            raise ProtocolProblem(
                f"event of {data_length + payload_length} bytes exceeds the {self.limit}-byte "
                "limit (server.max_message_bytes); send smaller audio chunks",
                "message_too_big",
            )
        data = header.get("data")
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ProtocolProblem(
                f'"data" in the header of {kind!r} must be an object, not {type(data).__name__}', "bad_header"
            )
        if data_length:
            data.update(_json_object(await self._reader.readexactly(data_length), f"data of {kind!r}"))
        payload = await self._reader.readexactly(payload_length) if payload_length else None
        return Event(type=kind, data=data, payload=payload)

    async def _readline(self) -> bytes:
        try:
            return await self._reader.readline()
        except ValueError:  # longer than the stream's line limit
            raise ProtocolProblem("event header line too long; closing", "message_too_big") from None

    def feed_eof(self) -> None:
        self._reader.feed_eof()


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise ProtocolProblem(f"{what} is not valid UTF-8 JSON ({detail}); closing", "bad_header") from None
    if not isinstance(value, dict):
        raise ProtocolProblem(f"{what} must be a JSON object, not {type(value).__name__}; closing", "bad_header")
    return value


def _length(header: dict[str, Any], key: str) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise ProtocolProblem(f'"{key}" must be a whole number of bytes >= 0, not {value!r:.40}', "bad_header")
    return value


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
