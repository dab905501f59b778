"""Hostile inputs for `specvoice bench soak`: a seeded mutation fuzzer for each server (Wyoming, the websocket
API, the MQTT bridge), the slowloris scenario, and a throwaway mosquitto.

Every input starts from a valid message of the protocol (so many get past the first check and reach deeper
code) and is then mutated: a value replaced by one of another JSON type, a key dropped or added, bytes
flipped, cut or inserted, lengths that lie, deep nesting, bytes that are not UTF-8. The same seed gives the same
inputs. What each sender counts: inputs sent, error answers, connections the server closed, and failures (a
connection that hung, a websocket closed with 1011, a probe that was not answered).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from wyoming.event import Event, async_read_event, async_write_event

MOSQUITTO = "/usr/sbin/mosquitto"
HANG_S = 120.0  # an answer slower than this (a queued LLM turn included) counts as a hang
JUNK_TEXT = ["", " ", "\n", "é" * 50, "a" * 3000, "\ud7ff\ufffd\u202e", "Dr. e.g. 3.14,", "{}", "null", "<b>hi</b>"]


def junk(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of any type, often of the wrong one for where it goes."""
    kind = rng.randrange(9 if depth < 3 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([-1, 0, 1, 2, 3, 16000, 2**31, 2**63, -(2**70)])
    if kind == 3:
        return rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf")])
    if kind in (4, 5):
        return rng.choice(JUNK_TEXT)
    if kind == 6:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(1, 40)))
    if kind == 7:
        return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["text", "type", "data", "x", ""]): junk(rng, depth + 1) for _ in range(rng.randrange(4))}


def mutate_json(rng: random.Random, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (a copy) with one value replaced, one key dropped, or one key added, somewhere inside it."""
    obj = json.loads(json.dumps(obj))
    target: Any = obj
    while isinstance(target, dict) and target and rng.random() < 0.5:
        inner = target[rng.choice(list(target))]
        if not isinstance(inner, dict) or not inner:
            break
        target = inner
    op = rng.randrange(3)
    if op == 0 and target:
        target[rng.choice(list(target))] = junk(rng)
    elif op == 1 and target:
        del target[rng.choice(list(target))]
    else:
        target[rng.choice(["text", "type", "rate", "extra", "é"])] = junk(rng)
    return obj


def mutate_bytes(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randrange(1, 4)):
        op, at = rng.randrange(4), rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        elif op == 2:
            del data[at : at + rng.randrange(1, 16)]
        else:
            data[at:at] = rng.choice([b"\n", b"\xff\xfe", b"[" * 3000, b'"', b"\\u0000"])
    return bytes(data)


# ---- Wyoming --------------------------------------------------------------------------------------------------


def _frame(event: Event) -> bytes:
    data = json.dumps(event.data).encode() if event.data else b""
    header: dict[str, Any] = {"type": event.type}
    if data:
        header["data_length"] = len(data)
    if event.payload:
        header["payload_length"] = len(event.payload)
    return json.dumps(header).encode() + b"\n" + data + (event.payload or b"")


def _wyoming_seeds(rng: random.Random) -> list[list[Event]]:
    fmt = {"rate": 16000, "width": 2, "channels": 1}
    noise = bytes(rng.randrange(256) for _ in range(3200))
    return [
        [Event("describe")],
        [Event("synthesize", {"text": "Hello there."})],
        [
            Event("synthesize-start"),
            Event("synthesize-chunk", {"text": "Good morning. The"}),
            Event("synthesize-chunk", {"text": " weather is fine."}),
            Event("synthesize-stop"),
        ],
        [
            Event("transcribe", {"language": "en"}),
            Event("audio-start", fmt),
            Event("audio-chunk", fmt, noise),
            Event("audio-stop"),
        ],
        [Event("transcript", {"text": "What time is it?", "context": {"conversation_id": "soak-1"}})],
    ]


def wyoming_warmup() -> list[bytes]:
    """Each seed request once, as sent by an honest client: every model does its first work."""
    return [b"".join(_frame(e) for e in events) for events in _wyoming_seeds(random.Random(0))]


def wyoming_input(rng: random.Random) -> bytes:
    """One connection's worth of bytes: a seed request with one or more of its events mutated."""
    events = rng.choice(_wyoming_seeds(rng))
    frames = []
    for event in events:
        if rng.random() < 0.4:
            event = Event(event.type, mutate_json(rng, event.data), event.payload)
        frame = _frame(event)
        frames.append(mutate_bytes(rng, frame) if rng.random() < 0.35 else frame)
    return b"".join(frames)


async def wyoming_exchange(port: int, data: bytes, counts: Counter[str]) -> None:
    """Send ``data`` and an honest describe, close our side, read the answers until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    kinds: list[str] = []
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(data + _frame(Event("describe")))
            await writer.drain()
            writer.write_eof()
        async with asyncio.timeout(HANG_S):
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while (event := await async_read_event(reader)) is not None:
                    kinds.append(event.type)
                    if event.type == "error":
                        counts["wyoming error events"] += 1
                        if event.data.get("code") == "server_error":
                            counts["internal errors"] += 1
    except TimeoutError:
        counts["hangs"] += 1
    finally:
        writer.close()
    counts["wyoming connections"] += 1
    if "info" not in kinds:
        counts["wyoming connections closed"] += 1


# ---- websocket (OpenAI Realtime subset) -----------------------------------------------------------------------


def _ws_seeds(rng: random.Random) -> list[dict[str, Any]]:
    audio = base64.b64encode(bytes(rng.randrange(256) for _ in range(4800))).decode()
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}
    return [
        {
            "type": "session.update",
            "session": {"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]},
        },
        {"type": "input_audio_buffer.append", "audio": audio},
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.clear"},
        {"type": "conversation.item.create", "item": user},
        {"type": "response.create", "response": {"output_modalities": ["text"]}},
        {"type": "response.cancel"},
        {"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0, "audio_end_ms": 100},
    ]


def websocket_warmup() -> list[str | bytes]:
    """An honest session: settings, audio appended and committed, a question, a response."""
    seeds = _ws_seeds(random.Random(0))
    messages: list[str | bytes] = [json.dumps(seeds[i]) for i in (1, 2, 4)]
    return messages + [json.dumps({"type": "response.create"})]  # spoken reply


def websocket_inputs(rng: random.Random, n: int) -> list[str | bytes]:
    out: list[str | bytes] = []
    for _ in range(n):
        seed = rng.choice(_ws_seeds(rng))
        roll = rng.random()
        if roll < 0.55:
            out.append(json.dumps(mutate_json(rng, seed)))
        elif roll < 0.8:
            out.append(mutate_bytes(rng, json.dumps(seed).encode()).decode("utf-8", "replace"))
        elif roll < 0.9:
            out.append(mutate_bytes(rng, json.dumps(seed).encode()))  # a binary frame
        else:
            out.append(json.dumps(seed))
    return out


async def websocket_session(url: str, messages: list[str | bytes], counts: Counter[str]) -> None:
    """One connection: send the messages, read until the server goes quiet, close."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    counts["websocket connections"] += 1
    try:
        async with asyncio.timeout(HANG_S), connect(url, max_size=None) as ws:
            for message in messages:
                await ws.send(message)
            with contextlib.suppress(TimeoutError):
                while True:  # until nothing came for a second
                    reply = json.loads(await asyncio.wait_for(ws.recv(), 1.0))
                    if reply.get("type") == "error":
                        counts["websocket error events"] += 1
    except ConnectionClosed as closed:
        counts["websocket connections closed"] += 1
        if closed.rcvd is not None and closed.rcvd.code == 1011:
            counts["internal errors"] += 1
    except TimeoutError:
        counts["hangs"] += 1


# ---- MQTT -----------------------------------------------------------------------------------------------------


def mqtt_inputs(rng: random.Random, prefix: str, n: int) -> list[tuple[str, bytes, bool]]:
    """(topic, payload, retain) triples: the bridge's command topics with mutated payloads."""
    seeds = [
        (f"{prefix}/say", {"text": "The door is open."}),
        (f"{prefix}/ask", {"text": "Say hi.", "id": "soak"}),
        (f"{prefix}/cancel", {}),
        ("homeassistant/status", None),
    ]
    out = []
    for _ in range(n):
        topic, seed = rng.choice(seeds)
        if seed is None:
            payload = rng.choice([b"online", b"offline", b"", b"\xff" * 10])
        elif rng.random() < 0.5:
            payload = json.dumps(mutate_json(rng, seed)).encode()
        else:
            payload = mutate_bytes(rng, rng.choice([json.dumps(seed).encode(), b"Say hi."]))
        if rng.random() < 0.1:
            topic += rng.choice(["/extra", "x", "/é"])
        out.append((topic, payload, rng.random() < 0.05))
    return out


class Mosquitto:
    """A broker for the run: a free loopback port, no persistence, removed afterwards. ``stop`` and ``start``
    take it away and bring it back on the same port (bench faults)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="specvoice-soak-"))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        (self.dir / "mosquitto.conf").write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.dir / "mosquitto.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def __enter__(self) -> Mosquitto:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


async def mqtt_publish(
    host: str, port: int, inputs: list[tuple[str, bytes, bool]], prefix: str, counts: Counter[str]
) -> None:
    """Publish every input, then ask a real question and wait for its answer (the bridge is alive)."""
    import aiomqtt

    async with aiomqtt.Client(host, port, identifier="specvoice-soak") as client:
        await client.subscribe([(f"{prefix}/answer", 1), (f"{prefix}/error", 1)])
        for topic, payload, retain in inputs:
            await client.publish(topic, payload, qos=1, retain=retain)
            counts["mqtt messages"] += 1
        await client.publish(f"{prefix}/ask", json.dumps({"text": "Say hi.", "id": "soak-probe"}), qos=1)
        try:
            async with asyncio.timeout(HANG_S * 3):  # the probe waits behind every question queued before it
                async for message in client.messages:
                    if message.topic.matches(f"{prefix}/error"):
                        counts["mqtt error messages"] += 1
                    elif b"soak-probe" in bytes(message.payload):
                        return
        except TimeoutError:
            counts["probes unanswered"] += 1


# ---- slowloris ------------------------------------------------------------------------------------------------


async def slowloris(wyoming_port: int, ws_url: str, n: int) -> dict[str, float]:
    """``n`` Wyoming connections that stall after a first complete event (holding slots) and ``n`` inside
    their first event, inside the data or the payload; then the seconds until a normal Wyoming client and a
    websocket client are served (each retrying while the server says busy)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    data = b'{"type": "synthesize", "data_length": 100}\n{"text": "never fin'
    payload = b'{"type": "audio-chunk", "data": {"rate": 16000, "width": 2, "channels": 1}, "payload_length": 4096}\n'
    writers = []
    for i in range(2 * n):
        reader, writer = await asyncio.open_connection("127.0.0.1", wyoming_port)
        writers.append(writer)
        if i < n:
            await async_write_event(Event("describe"), writer)
            await asyncio.wait_for(async_read_event(reader), 30)
        writer.write(data if i % 2 else payload + b"\0" * 100)
        await writer.drain()

    async def wyoming_once() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", wyoming_port)
        try:
            await async_write_event(Event("describe"), writer)
            answer = await async_read_event(reader)
            return answer is not None and answer.type == "info"
        finally:
            writer.close()

    async def websocket_once() -> bool:
        try:
            async with connect(ws_url) as ws:
                return json.loads(await ws.recv()).get("type") == "session.created"
        except ConnectionClosed:
            return False

    async def until(once: Any) -> float:
        start = time.monotonic()
        while not await once():
            await asyncio.sleep(0.1)
        return round(time.monotonic() - start, 2)

    try:
        wyoming_s, websocket_s = await asyncio.wait_for(
            asyncio.gather(until(wyoming_once), until(websocket_once)), HANG_S
        )
    except TimeoutError:
        wyoming_s = websocket_s = float("inf")
    finally:
        for writer in writers:
            writer.close()
    return {"stalled": 2 * n, "wyoming_served_s": wyoming_s, "websocket_served_s": websocket_s}
