"""Property-based fuzzing of the Wyoming server (the small real models behind it): events of every type with
fields of every JSON type, broken framing (headers that are not objects, lengths that lie or are not numbers,
bytes that are not UTF-8, deep nesting), in sequences of up to five, each followed by an honest `describe`.

What must hold for every input: the server answers or closes (never hangs), everything it sends is a
well-formed Wyoming event, an `error` always has a text and a code, a connection that was not closed for a
framing problem still answers `describe`; and over the whole run: no traceback logged, no session or slot
left behind, and a normal client is served as before. Examples are derandomized and bounded in number, so the
run is the same every time and short.
"""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.request
from typing import Any

import pytest
from hostile import ServerThread, server_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wyoming.event import Event, read_event, write_event

EXAMPLES = 150
CLOSING = {"bad_header", "message_too_big", "read_timeout", "idle_timeout", "incomplete_event", "busy"}
TYPES = [
    "describe",
    "transcribe",
    "audio-start",
    "audio-chunk",
    "audio-stop",
    "synthesize",
    "synthesize-start",
    "synthesize-chunk",
    "synthesize-stop",
    "transcript",
    "ping",
    "info",
    "error",
    "detect",
    "",
    "é" * 3,
]
FIELDS = ["text", "rate", "width", "channels", "language", "context", "voice", "name", "timestamp", "data"]
SENT = {
    "info",
    "error",
    "transcript-start",
    "transcript-chunk",
    "transcript",
    "transcript-stop",
    "audio-start",
    "audio-chunk",
    "audio-stop",
    "synthesize-stopped",
    "handled-start",
    "handled-chunk",
    "handled",
    "not-handled",
    "handled-stop",
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from([16000, 22050, 2, 1, "hello there.", "conversation-1"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)

# a plausible event: a known type, known field names with values of any JSON type, maybe a payload
events = st.builds(
    lambda kind, data, payload: Event(kind, data, payload),
    st.sampled_from(TYPES),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4),
    st.none() | st.binary(max_size=2048),
)


def honest(event: Event) -> bytes:
    """An event framed by the wyoming package's own writer."""
    out = _Buffer()
    write_event(event, out)
    return out.data


class _Buffer:
    def __init__(self) -> None:
        self.data = b""

    def writelines(self, parts: Any) -> None:
        self.data += b"".join(parts)

    def write(self, part: bytes) -> None:
        self.data += part

    def flush(self) -> None:
        pass


def header(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


texts = st.text(max_size=60) | st.sampled_from(["Hello there.", "a" * 300, "Dr. e.g. 3.14, " * 5, "\n\n"])
audio_format = st.fixed_dictionaries(
    {
        "rate": st.sampled_from([8000, 16000, 22050, 44100, 96000, 7999, 0, -1, 16000.5]),
        "width": st.sampled_from([1, 2, 4, 3, True]),
        "channels": st.sampled_from([1, 2, 0, 3]),
    }
)

# whole requests, each event honest but the values not: what a confused or hostile client of each service sends
requests = st.one_of(
    st.builds(
        lambda fmt, chunks: b"".join(
            honest(e)
            for e in [Event("audio-start", fmt), *[Event("audio-chunk", fmt, c) for c in chunks], Event("audio-stop")]
        ),
        audio_format,
        st.lists(st.binary(min_size=1, max_size=4096), max_size=4),
    ),
    st.builds(
        lambda parts, copy: b"".join(
            honest(e)
            for e in [
                Event("synthesize-start"),
                *[Event("synthesize-chunk", {"text": p}) for p in parts],
                *([Event("synthesize", {"text": "".join(parts)})] if copy else []),
                Event("synthesize-stop"),
            ]
        ),
        st.lists(texts, max_size=5),
        st.booleans(),
    ),
    st.builds(
        lambda text, context: honest(Event("transcript", {"text": text, "context": context})),
        texts,
        st.none() | json_values | st.fixed_dictionaries({"conversation_id": json_values}),
    ),
)

frames = st.one_of(
    requests,
    events.map(honest),
    events.map(honest),  # twice as likely as any one kind of broken framing
    json_values.map(header),  # a header that is any JSON value
    st.builds(
        lambda kind, length, body: header({"type": kind, "data_length": length}) + body,  # lying lengths
        st.sampled_from(TYPES),
        json_values,
        st.binary(max_size=64),
    ),
    st.builds(
        lambda kind, length, body: header({"type": kind, "payload_length": length}) + body,
        st.sampled_from(TYPES),
        st.integers(min_value=-5, max_value=200) | json_values,
        st.binary(max_size=64),
    ),
    st.binary(max_size=200).map(lambda raw: raw + b"\n"),  # not JSON, not UTF-8
    st.integers(min_value=1, max_value=3000).map(lambda depth: b"[" * depth + b"]" * depth + b"\n"),
)


@pytest.fixture(scope="module")
def server(hostile_assistant, tracebacks):
    thread = ServerThread(server_config(hostile_assistant, wyoming__read_timeout_s=1.0), hostile_assistant).start()
    yield thread
    thread.stop()


def exchange(port: int, data: bytes) -> list[Event]:
    """Send ``data`` and an honest describe, close our side, read every event until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        with contextlib.suppress(ConnectionError):  # the server may close before it has read everything
            sock.sendall(data + honest(Event("describe")))
            sock.shutdown(socket.SHUT_WR)
        received = []
        with sock.makefile("rb") as stream, contextlib.suppress(ConnectionError):
            while (event := read_event(stream)) is not None:
                received.append(event)
    return received


count = {"inputs": 0, "connections": 0, "errors": 0, "closed_for_framing": 0}


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(sequence=st.lists(frames, min_size=1, max_size=5))
def test_any_sequence_of_events_is_answered_or_refused(server, sequence):
    received = exchange(server.config.wyoming.port, b"".join(sequence))
    count["inputs"] += len(sequence)
    count["connections"] += 1
    kinds = [e.type for e in received]
    assert set(kinds) <= SENT, kinds
    errors = [e.data for e in received if e.type == "error"]
    count["errors"] += len(errors)
    for error in errors:
        assert isinstance(error.get("text"), str) and error["text"] and isinstance(error.get("code"), str), error
    if any(error["code"] in CLOSING for error in errors):
        count["closed_for_framing"] += 1
        assert kinds[-1] == "error"  # the connection ended right after it
    else:
        assert "info" in kinds, kinds  # the connection kept working: our describe was answered


def sessions_gauge(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return next(
            line
            for line in response.read().decode().splitlines()
            if line.startswith('specvoice_sessions{transport="wyoming"}')
        )


def test_after_the_fuzzing_nothing_is_left_behind_and_nothing_logged_a_traceback(server, tracebacks):
    print(
        f"\nwyoming fuzz: {count['inputs']} inputs on {count['connections']} connections, {count['errors']} "
        f"error events, {count['closed_for_framing']} connections closed for framing, "
        f"{len(tracebacks.records)} tracebacks"
    )
    assert count["connections"] == EXAMPLES
    assert not tracebacks.records, "\n".join(tracebacks.lines())
    assert sessions_gauge(server.config.server.port).endswith(" 0.0")  # every slot came back
    served = exchange(server.config.wyoming.port, honest(Event("synthesize", {"text": "Still here."})))
    assert [e.type for e in served][:1] == ["audio-start"] and "audio-stop" in [e.type for e in served]
    kept = server.call(lambda: len(server.assistant._sessions))
    assert kept <= server.config.wyoming.max_conversations  # only conversations kept by id (bounded)
    server.stop()
    assert not server.assistant._sessions, "sessions left open after the server stopped"
