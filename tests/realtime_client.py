"""Test helper: a raw websocket client of our Realtime API that checks every server event against two stock
clients' own schemas: the openai SDK's pydantic models and pipecat's (a pipecat validation failure kills its
receive loop, so an event that fails it would break pipecat). Raw, because tests send what the SDK will not."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, get_args

import numpy as np
from openai.types.realtime import realtime_server_event
from websockets.asyncio.client import ClientConnection, connect

from broker import free_port
from serving import serving

SDK_EVENTS = {
    get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in get_args(get_args(realtime_server_event.RealtimeServerEvent)[0])
}
try:
    from pipecat.services.openai.realtime.events import parse_server_event as pipecat_parse
except ImportError:  # the check is skipped where pipecat is not installed
    pipecat_parse = None


def check_event(text: str, unchecked: frozenset[str] = frozenset()) -> dict[str, Any]:
    raw = json.loads(text)
    if raw["type"] in unchecked:
        return raw
    if raw["type"] in SDK_EVENTS:
        SDK_EVENTS[raw["type"]].model_validate(raw)
    if pipecat_parse is not None:
        pipecat_parse(text)
    return raw


def make_config(assistant: Any, **server: Any) -> Any:
    config = assistant.config.model_copy(deep=True)
    config.server.port = free_port()
    config.wyoming.enabled = False
    for key, value in server.items():
        setattr(config.server, key, value)
    return config


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


class Client:
    """One connection; ``until`` reads events (all kept in ``seen``) up to the first of a type."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.seen: list[dict[str, Any]] = []
        self.unchecked: frozenset[str] = frozenset()  # event types whose schema check a test turns off

    async def send(self, **event: Any) -> None:
        await self.ws.send(json.dumps(event))

    async def until(
        self, kind: str, timeout: float = 150.0, where: Callable[[dict[str, Any]], bool] = lambda e: True
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout):
            while True:
                event = check_event(await self.ws.recv(), self.unchecked)
                self.seen.append(event)
                out.append(event)
                if event["type"] == kind and where(event):
                    return out

    async def error_for(self, message: str | bytes) -> dict[str, Any]:
        await self.ws.send(message)
        return (await self.until("error", 30))[-1]["error"]

    async def text_turn(self, text: str, **response: Any) -> list[dict[str, Any]]:
        await self.send(
            type="conversation.item.create",
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        )
        await self.send(type="response.create", **({"response": response} if response else {}))
        return await self.until("response.done")


@contextlib.asynccontextmanager
async def realtime(config: Any, assistant: Any) -> AsyncIterator[tuple[Client, Any]]:
    """serve() with one raw client connected; yields it and the server-side Session of that connection."""
    async with serving(config, assistant):
        async with connect(f"ws://127.0.0.1:{config.server.port}/v1/realtime") as ws:
            client = Client(ws)
            created = (await client.until("session.created", 30))[-1]
            session = next(s for s in assistant._sessions if s.id == created["session"]["id"])
            yield client, session


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def errors(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["error"] for e in events if e["type"] == "error"]
