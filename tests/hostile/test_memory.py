"""A closed connection's session is freed soon after it closes, without waiting for one of Python's rare full
collections (voice/memory.py): the soak benchmark's hostile phase grew RSS by ~400 MB while closed sessions, each
a reference cycle with its transport and holding its KV caches, waited for one.

The automatic collector is switched off during the test, so only what the product does itself (the Assistant's
Trimmer, after sessions close) can free them; the models are frozen first, as `serve()` does once it loaded them.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hostile import server_config
from websockets.asyncio.client import connect
from wyoming.event import Event, async_read_event, async_write_event

from voice.memory import release_free_memory, settle_after_load

from serving import serving


@pytest.fixture
def frozen_no_auto_gc() -> Iterator[None]:
    """The models frozen as in `serve()`; no automatic collection (undone after the test)."""
    settle_after_load()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def watch_sessions(assistant: Any, monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref]:
    """Weak references to every session the assistant makes from now on, its conversation and its listener."""
    refs: list[weakref.ref] = []
    make = assistant.session

    def session(*args: Any, **kwargs: Any) -> Any:
        made = make(*args, **kwargs)
        refs.extend([weakref.ref(made), weakref.ref(made.conversation), weakref.ref(made.listener)])
        return made

    monkeypatch.setattr(assistant, "session", session)
    return refs


async def websocket_turn(url: str) -> None:
    """A spoken question (appended, committed), a text item, a response; then a bad event; then close."""
    speech = (np.sin(np.arange(24000) * 0.05) * 3000).astype(np.int16).tobytes()
    async with connect(url) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(speech).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
        while json.loads(await asyncio.wait_for(ws.recv(), 120))["type"] != "response.done":
            pass
        await ws.send("{not json")
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "error"


async def wyoming_exchange(port: int, events: list[Event], last: str) -> None:
    """Send ``events`` on one connection, read until an event of type ``last``, close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for event in events:
            await async_write_event(event, writer)
        while (answer := await asyncio.wait_for(async_read_event(reader), 120)) is not None and answer.type != last:
            pass
        assert answer is not None, f"closed before {last}"
    finally:
        writer.close()


async def test_closed_sessions_are_freed_soon_after(hostile_assistant, frozen_no_auto_gc, monkeypatch):
    assistant = hostile_assistant
    refs = watch_sessions(assistant, monkeypatch)
    config = server_config(assistant)
    fmt = {"rate": 16000, "width": 2, "channels": 1}
    async with serving(config, assistant):
        runs = assistant.memory.runs
        await websocket_turn(f"ws://127.0.0.1:{config.server.port}/v1/realtime")
        port = config.wyoming.port
        await wyoming_exchange(port, [Event("synthesize", {"text": "Hello there."})], "audio-stop")
        await wyoming_exchange(port, [Event("transcript", {"text": "Say hi."})], "handled-stop")
        audio = [Event("audio-start", fmt), Event("audio-chunk", fmt, bytes(3200)), Event("audio-stop")]
        await wyoming_exchange(port, [Event("transcribe", {"language": "en"}), *audio], "transcript")
        assert len(refs) == 9, "each connection made a session"
        for _ in range(300):  # the Trimmer runs within its interval (5 s) of the last close
            if assistant.memory.runs > runs and all(ref() is None for ref in refs):
                break
            await asyncio.sleep(0.1)
        alive = sorted({type(ref()).__name__ for ref in refs if ref() is not None})
        assert not alive, f"still alive after their connections closed: {alive}"


def test_release_free_memory_runs_on_glibc():
    """malloc_trim exists on glibc (the product's Linux); elsewhere the call is a no-op returning False."""
    assert release_free_memory() in (True, False)
