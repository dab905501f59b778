"""Hostile clients at the websocket's door: cross-site websocket hijacking (a page the user opens connecting to
the assistant on localhost), DNS rebinding, missing tokens where home actions are on; and the limits behind the
door: oversized text, an unbounded conversation, unbounded manual commits, a flood of bad messages in the log.
A real server on the small models, real websocket clients."""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request

from voice.assistant import Assistant
from voice.config import ConfigError
from voice.logs import ClientWarnings, RateLimitedLog
from voice.server import check_exposure
from voice.transports.realtime.server import HANDSHAKE_FAILED, HandshakeLog, origin_allowed

from broker import free_port
from realtime_client import Client, b64, make_config, realtime
from serving import serving

TOKEN = "hostile-test-token"


@pytest.fixture(scope="module")
def assistant(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 8
    return Assistant.load_sync(config)


async def opens(url: str, **kwargs) -> bool:
    """True when the handshake succeeds and the session starts."""
    async with connect(url, **kwargs) as ws:
        return json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "session.created"


async def test_a_cross_origin_websocket_is_refused_with_403(assistant):
    config = make_config(assistant, allowed_origins=["https://home.example.com"])
    port = config.server.port
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    async with serving(config, assistant):
        for origin in ("http://evil.example", "null", f"http://localhost:{port}", f"https://127.0.0.1:{port}0"):
            with pytest.raises(InvalidStatus) as refused:
                await opens(url, origin=origin)
            assert refused.value.response.status_code == 403, origin
            assert b"server.allowed_origins" in refused.value.response.body
        # DNS rebinding: the attacker's name resolves to this machine, so Origin and Host agree; a name must be listed
        with pytest.raises(InvalidStatus) as refused:
            await opens(
                f"ws://evil.example:{port}/v1/realtime",
                origin=f"http://evil.example:{port}",
                host="127.0.0.1",
                port=port,
            )
        assert refused.value.response.status_code == 403
        assert await opens(url)  # a native client sends no Origin
        assert await opens(url, origin=f"http://127.0.0.1:{port}")  # the server's own page
        assert await opens(url, origin="https://home.example.com")  # listed
        assert await opens(f"ws://localhost:{port}/v1/realtime", origin=f"http://localhost:{port}")


def test_origin_rule():
    assert origin_allowed(None, "127.0.0.1:8765", [])
    assert origin_allowed("http://127.0.0.1:8765", "127.0.0.1:8765", [])
    assert origin_allowed("http://[::1]:8765", "[::1]:8765", [])
    assert origin_allowed("http://192.168.1.5:8765", "192.168.1.5:8765", [])  # a LAN page by address
    assert not origin_allowed("http://myhost.lan:8765", "myhost.lan:8765", [])  # a name: list it
    assert origin_allowed("http://myhost.lan:8765", "myhost.lan:8765", ["http://myhost.lan:8765"])
    assert not origin_allowed("http://127.0.0.1:8765", None, [])
    assert not origin_allowed("file://", "127.0.0.1:8765", [])


def test_home_actions_need_a_token_even_on_localhost(small_config):
    config = small_config.model_copy(deep=True)
    config.mqtt.enabled, config.mqtt.allowed_actions = True, {"home/light/set": ["ON", "OFF"]}
    with pytest.raises(ConfigError, match="server.token"):
        check_exposure(config)
    config.server.token = TOKEN
    check_exposure(config)
    config.server.token, config.mqtt.enabled = None, False  # actions that nothing publishes: no token needed
    check_exposure(config)


async def test_token_by_header_subprotocol_or_query_and_nothing_else(assistant):
    config = make_config(assistant, token=TOKEN)
    url = f"ws://127.0.0.1:{config.server.port}/v1/realtime"
    async with serving(config, assistant):
        assert await opens(url, additional_headers={"Authorization": f"Bearer {TOKEN}"})
        assert await opens(url, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"])
        assert await opens(f"{url}?token={TOKEN}")
        for kwargs in (
            {},
            {"additional_headers": {"Authorization": "Bearer nope"}},
            {"subprotocols": ["realtime", "openai-insecure-api-key.nope"]},
        ):
            with pytest.raises(ConnectionClosed) as closed:
                await opens(url, **kwargs)
            assert closed.value.rcvd.code == 1008


async def test_oversized_text_and_an_endless_conversation_are_bounded(assistant):
    """Text fields are capped (server.max_text_chars); the conversation keeps at most server.max_items items
    and a history whose text stays cheap to tokenize; the session still answers."""
    config = make_config(assistant, max_text_chars=4096, max_items=32)
    async with realtime(config, assistant) as (client, session):
        err = await client.error_for(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "x" * 5000}],
                    },
                }
            )
        )
        assert err["code"] == "invalid_value" and "server.max_text_chars" in err["message"]
        err = await client.error_for(
            json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "y" * 5000}})
        )
        assert "server.max_text_chars" in err["message"]
        for i in range(200):
            await client.send(
                type="conversation.item.create",
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"{i} " + "z" * 4000}],
                },
            )
        await client.until("conversation.item.done", where=lambda e: e["item"]["content"][0]["text"].startswith("199 "))
        conn_items = len([m for m in session.history if m["role"] == "user"])
        text = sum(len(m["content"]) for m in session.history)
        assert conn_items <= 32 and text <= 8 * assistant.config.dialog.history_tokens + 4100, (conn_items, text)
        events = await client.text_turn("Hello.", output_modalities=["text"])
        assert events[-1]["response"]["status"] == "completed"


async def test_manual_commits_are_bounded(assistant):
    async with realtime(make_config(assistant), assistant) as (client, _):
        await client.send(
            type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        await client.until("session.updated")
        noise = (np.random.default_rng(0).normal(0, 2000, 24000 // 5)).astype(np.int16)  # 200 ms
        codes = []
        for _ in range(8):  # far faster than Whisper can transcribe them
            await client.send(type="input_audio_buffer.append", audio=b64(noise))
            await client.send(type="input_audio_buffer.commit")
        await client.send(type="conversation.item.retrieve", item_id="barrier", event_id="barrier")
        events = await client.until("error", where=lambda e: e["error"]["event_id"] == "barrier")
        codes = [e["error"]["code"] for e in events if e["type"] == "error"][:-1]
        committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
        assert "too_many_commits" in codes and len(committed) + codes.count("too_many_commits") == 8
        assert 1 <= len(committed) <= 8 - codes.count("too_many_commits")


async def test_a_flood_of_bad_messages_is_a_few_log_lines(assistant, caplog):
    caplog.set_level(logging.WARNING, logger="specvoice")
    async with realtime(make_config(assistant), assistant) as (client, _):
        for _ in range(50):
            await client.ws.send("{not json")
        await client.until("error", where=lambda e: len([x for x in client.seen if x["type"] == "error"]) == 50)
    lines = [r for r in caplog.records if r.name == "specvoice.realtime" and r.getMessage() == "client error"]
    assert 1 <= len(lines) <= 6, len(lines)
    assert not [r for r in caplog.records if r.exc_info], "a client's bad input must never log a traceback"


def test_rate_limited_log_counts_what_it_held_back(caplog):
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("specvoice.test"), burst=2, period_s=10.0, clock=lambda: now[0], peer="x")
    caplog.set_level(logging.WARNING, logger="specvoice.test")
    assert [log.warning("bad") for _ in range(5)] == [True, True, False, False, False]
    now[0] = 5.0  # one token back
    assert log.warning("bad")
    assert caplog.records[-1].suppressed == 3 and caplog.records[-1].peer == "x"


async def test_a_closed_client_mid_flood_leaves_others_working(assistant):
    async with realtime(make_config(assistant), assistant) as (client, _):
        port = client.ws.remote_address[1]
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as other:
            flood = Client(other)
            await flood.until("session.created")
            for _ in range(20):
                await other.send(
                    json.dumps({"type": "input_audio_buffer.append", "audio": b64(np.zeros(2400, np.int16))})
                )
        events = await client.text_turn("Hi.", output_modalities=["text"])
        assert events[-1]["response"]["status"] == "completed"


# What a client can send, or not, before a websocket handshake: none may cost a traceback in the log
BAD_CLIENTS = {
    "a bare connect (a port scan, a load balancer's TCP health check)": b"",
    "garbage": b"GARBAGE\r\n\r\n",
    "a broken request line": b"GET / HTTP/1.1 extra\r\n\r\n",
    "plain HTTP to the websocket path": b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\n\r\n",
}


async def send_and_hang_up(port: int, data: bytes) -> None:
    """Connect, send ``data`` (if any) and read what the server answers until it closes; hang up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await asyncio.wait_for(reader.read(), 10)
    writer.close()
    await writer.wait_closed()


async def warnings_about(caplog: pytest.LogCaptureFixture, port: int, data: bytes) -> list[logging.LogRecord]:
    """The records at WARNING or above that one client sending ``data`` caused (websockets logs after it closed
    the connection: wait up to 10 s for the first, then a moment for any second)."""
    before = len(caplog.records)
    await send_and_hang_up(port, data)
    for _ in range(200):
        if any(r.levelno >= logging.WARNING for r in caplog.records[before:]):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    return [r for r in caplog.records[before:] if r.levelno >= logging.WARNING]


async def test_a_bad_client_before_the_handshake_is_one_warning_line_and_no_traceback(assistant, caplog):
    for name in ("specvoice", "websockets", "asyncio"):
        caplog.set_level(logging.DEBUG, logger=name)
    config = make_config(assistant)
    config.wyoming.enabled, config.wyoming.port = True, free_port()
    async with serving(config, assistant):
        reasons = {}
        for client, data in BAD_CLIENTS.items():
            lines = await warnings_about(caplog, config.server.port, data)
            assert [(r.getMessage(), r.client) for r in lines] == [("websocket handshake failed", "127.0.0.1")], client
            reasons[client] = lines[0].reason
        assert reasons == {
            "a bare connect (a port scan, a load balancer's TCP health check)": "did not receive a valid HTTP "
            "request; connection closed while reading HTTP request line; stream ends after 0 bytes, before end of line",
            "garbage": "did not receive a valid HTTP request; invalid HTTP request line: GARBAGE",
            "a broken request line": "did not receive a valid HTTP request; unsupported protocol; "
            "expected HTTP/1.1: GET / HTTP/1.1 extra",
            "plain HTTP to the websocket path": "missing Connection header",  # answered 426 Upgrade Required
        }
        before = len(caplog.records)
        for _ in range(20):  # a client that loops garbage: ClientWarnings lets 5 lines a minute through
            await send_and_hang_up(config.server.port, b"GARBAGE\r\n\r\n")
        await asyncio.sleep(0.5)
        assert 1 <= len([r for r in caplog.records[before:] if r.levelno >= logging.WARNING]) <= 2

        for data in (b"", b"GARBAGE\r\n\r\n", b"\x00" * 70000):  # the same at the Wyoming door
            await send_and_hang_up(config.wyoming.port, data)
        wyoming = [r for r in caplog.records if r.name == "specvoice.wyoming" and r.levelno >= logging.WARNING]
        assert [r.client for r in wyoming] == ["127.0.0.1"] * 2, wyoming  # the garbage; a bare connect is silent

        assert await opens(f"ws://127.0.0.1:{config.server.port}/v1/realtime")  # still serving
    # websockets' own debug lines may carry one (its debug logging is opt-in); nothing at warning or above may
    serious = [r for r in caplog.records if r.levelno >= logging.ERROR or (r.exc_info and r.levelno >= logging.WARNING)]
    assert not serious, [f"{r.name}: {r.getMessage()}" for r in serious]


async def test_a_handshake_that_fails_by_our_bug_still_logs_its_traceback(caplog):
    """HandshakeLog quiets what clients cause, not our own bugs: a process_request that raises is logged by
    websockets as before, an error with the traceback."""

    def broken(connection: ServerConnection, request: Request) -> None:
        raise RuntimeError("a bug in process_request")

    caplog.set_level(logging.WARNING)
    logger = HandshakeLog(ClientWarnings(logging.getLogger("specvoice.test")))
    async with serve(lambda ws: ws.close(), "127.0.0.1", 0, process_request=broken, logger=logger) as server:
        with pytest.raises(InvalidStatus):
            await opens(f"ws://127.0.0.1:{next(iter(server.sockets)).getsockname()[1]}/")
    [record] = caplog.records
    assert (record.name, record.levelno, record.getMessage()) == ("websockets.server", logging.ERROR, HANDSHAKE_FAILED)
    assert record.exc_info and isinstance(record.exc_info[1], RuntimeError)
