"""Slowloris: more stalled Wyoming connections than `server.max_sessions` (16; the budget the websocket API
shares), some stopped inside an event's data, some inside its payload, some after a first complete event (they
hold a slot), some inside their very first one (they never get one). A normal Wyoming client and a websocket
client must each be served within 5 s (the issue's bound; `wyoming.read_timeout_s` is 2 s by default), every
stalled connection is told why it was closed, and every slot comes back.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from hostile import server_config
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe
from wyoming.tts import Synthesize

from serving import serving

SERVED_WITHIN_S = 5.0
HEADER_THEN_PART_OF_DATA = b'{"type": "synthesize", "data_length": 100}\n{"text": "never fin'
HEADER_THEN_PART_OF_PAYLOAD = (
    b'{"type": "audio-chunk", "data": {"rate": 16000, "width": 2, "channels": 1}, '
    b'"payload_length": 4096}\n' + b"\0" * 100
)


async def stall(port: int, *, first: Event | None, inside: bytes) -> Stalled:
    """A connection that sends ``first`` (a complete event, answered) and then part of an event, and stops."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if first is not None:
        await async_write_event(first, writer)
        answer = await asyncio.wait_for(async_read_event(reader), 30)
        assert answer is not None and answer.type in ("info", "error"), answer
        if answer.type == "error":  # no slot left: refused, closed
            return Stalled(reader, writer, Error.from_event(answer).code)
    writer.write(inside)
    await writer.drain()
    return Stalled(reader, writer)


@dataclass
class Stalled:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    refused: str | None = None  # the error code it got for its first event, if it was refused at once

    async def closing_code(self) -> str | None:
        """The code of the error the server closed it with."""
        if self.refused:
            return self.refused
        events = []
        while (event := await asyncio.wait_for(async_read_event(self.reader), 30)) is not None:
            events.append(event)
        self.writer.close()
        return Error.from_event(events[-1]).code if events and events[-1].type == "error" else None


async def until_served(serve_once) -> float:
    """Seconds until ``serve_once()`` is True (it returns False when the server said busy)."""
    start = time.monotonic()
    while not await serve_once():
        await asyncio.sleep(0.1)
    return time.monotonic() - start


async def test_stalled_connections_lock_no_one_out(hostile_assistant, tracebacks):
    config = server_config(hostile_assistant)  # the default limits: 16 sessions, 2 s per event
    n = config.server.max_sessions + 2
    async with serving(config, hostile_assistant):
        port = config.wyoming.port
        holding = [
            await stall(
                port,
                first=Describe().event(),
                inside=HEADER_THEN_PART_OF_DATA if i % 2 else HEADER_THEN_PART_OF_PAYLOAD,
            )
            for i in range(n)
        ]
        never_started = [
            await stall(port, first=None, inside=HEADER_THEN_PART_OF_DATA if i % 2 else HEADER_THEN_PART_OF_PAYLOAD)
            for i in range(n)
        ]

        async def wyoming_once() -> bool:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                await async_write_event(Describe().event(), writer)
                answer = await async_read_event(reader)
                return answer is not None and answer.type == "info"
            finally:
                writer.close()

        async def websocket_once() -> bool:
            try:
                async with connect(f"ws://127.0.0.1:{config.server.port}/v1/realtime") as ws:
                    return json.loads(await ws.recv())["type"] == "session.created"
            except ConnectionClosed as closed:
                assert closed.rcvd is not None and closed.rcvd.code == 1013, closed  # busy: try again
                return False

        wyoming_s, websocket_s = await asyncio.wait_for(
            asyncio.gather(until_served(wyoming_once), until_served(websocket_once)), 60
        )
        print(
            f"\nslowloris: {n} connections stalled after a first event, {n} inside their first; "
            f"served after: wyoming {wyoming_s:.2f} s, websocket {websocket_s:.2f} s"
        )
        assert wyoming_s < SERVED_WITHIN_S and websocket_s < SERVED_WITHIN_S

        # the normal client gets the whole service, not just an answer to describe
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await async_write_event(Synthesize("Still here.").event(), writer)
        kinds = []
        while (event := await asyncio.wait_for(async_read_event(reader), 60)) and event.type != "audio-stop":
            kinds.append(event.type)
        writer.close()
        assert "audio-chunk" in kinds

        # every stalled connection was told why, and closed
        codes = [await stalled.closing_code() for stalled in holding + never_started]
        assert codes.count("busy") == 2 and codes.count("read_timeout") == 2 * n - 2, codes
    assert not tracebacks.records, "\n".join(tracebacks.lines())
