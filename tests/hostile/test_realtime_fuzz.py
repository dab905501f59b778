"""Property-based fuzzing of the websocket API against a running server (small real models): hypothesis writes
sequences of client messages, from plausible events with wrong values to arbitrary JSON and non-JSON, and each
sequence runs on a fresh connection. The properties, checked after every message:

- the server answers every message: a barrier (a retrieve of an unknown item) after it gets its own error back;
- a bad message costs at most one ``error`` event, with a code and a message, and never a ``server_error``
  (which would mean an exception escaped: a bug a client can trigger);
- the connection stays open, and nothing a client sends puts a traceback in the log;
- afterwards the server still answers a normal text turn.

The server runs on its own event loop in a thread, so hypothesis can drive it from plain (sync) test code.
"""

from __future__ import annotations

import base64
import json

import pytest
from hostile import ServerThread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from voice.transports.realtime.events import SCHEMAS

from realtime_client import check_event, make_config

TYPES = sorted(SCHEMAS) + ["response.explode", "", "session.update ", "output_audio_buffer.clear"]


@pytest.fixture(scope="module")
def server(hostile_assistant, tracebacks):
    """serve() in its own thread (tests/hostile/hostile.py), on the suite's small models; every log record with a
    traceback is collected (conftest.py)."""
    config = make_config(hostile_assistant, max_text_chars=2048, max_items=64, idle_timeout_s=60.0)
    running = ServerThread(config, hostile_assistant).start()
    running.tracebacks = tracebacks.records  # type: ignore[attr-defined]
    try:
        yield running
    finally:
        running.stop()


# ---- what hypothesis writes -------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**40), 10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(
        [
            "audio/pcm",
            "audio/pcmu",
            "user",
            "system",
            "assistant",
            "message",
            "inf",
            "function_call",
            "function_call_output",
            "input_text",
            "server_vad",
            "none",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)
audio = st.binary(max_size=600).map(lambda b: base64.b64encode(b).decode())
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_audio", "input_image", "text", "bogus"])},
    optional={"text": st.one_of(st.text(max_size=60), values), "transcript": values, "audio": audio},
)
item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "x"])},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "tool"]),
        "content": st.lists(part, max_size=3),
        "id": st.text(max_size=10),
        "call_id": st.text(max_size=10),
        "name": st.text(max_size=10),
        "arguments": st.text(max_size=30),
        "output": st.text(max_size=30),
    },
)
fmt = st.fixed_dictionaries(
    {"type": st.sampled_from(["audio/pcm", "audio/pcmu", "audio/pcma", "audio/wav"])},
    optional={"rate": st.sampled_from([8000, 16000, 24000, 11025, 0, -1, 10**30])},
)
session = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["realtime", "transcription"]),
        "instructions": st.text(max_size=80),
        "output_modalities": st.lists(st.sampled_from(["audio", "text", "video"]), max_size=3),
        "tools": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["function", "mcp"]), "name": st.text(max_size=12)},
                optional={"parameters": values},
            ),
            max_size=3,
        ),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), values),
        "max_output_tokens": st.one_of(st.integers(-5, 5000), st.just("inf")),
        "temperature": values,
        "audio": st.fixed_dictionaries(
            {},
            optional={
                "input": st.fixed_dictionaries(
                    {},
                    optional={
                        "format": fmt,
                        "turn_detection": st.one_of(
                            st.none(),
                            st.fixed_dictionaries({"type": st.sampled_from(["server_vad", "semantic_vad", "x"])}),
                        ),
                    },
                ),
                "output": st.fixed_dictionaries({}, optional={"format": fmt, "voice": values, "speed": values}),
            },
        ),
    },
)
response = st.fixed_dictionaries(
    {},
    optional={
        "output_modalities": st.lists(st.sampled_from(["audio", "text"]), max_size=2),
        "instructions": st.text(max_size=40),
        "conversation": st.sampled_from(["auto", "none", "conv_1"]),
        "metadata": values,
        "max_output_tokens": st.integers(1, 3),
        "input": values,
    },
)
events = st.fixed_dictionaries(
    {"type": st.sampled_from(TYPES)},
    optional={
        "event_id": st.one_of(st.text(max_size=20), values),
        "audio": st.one_of(audio, values),
        "item": st.one_of(item, values),
        "session": st.one_of(session, values),
        "response": st.one_of(response, values),
        "item_id": st.one_of(st.text(max_size=10), values),
        "audio_end_ms": values,
        "content_index": values,
        "previous_item_id": st.one_of(st.sampled_from(["root", None]), st.text(max_size=8)),
        "response_id": values,
        "extra": values,
    },
)
messages = st.one_of(
    events.map(json.dumps),
    values.map(json.dumps),
    st.text(max_size=200),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 200).map(lambda n: '{"type": "session.update", "session": ' + '{"a": ' * n + "1" + "}" * n + "}"),
    st.integers(4300, 6000).map(lambda n: '{"type": "conversation.item.truncate", "audio_end_ms": ' + "9" * n + "}"),
    st.sampled_from(
        [
            '{"type": "response.create", "response": {"temperature": NaN}}',
            "{}",
            "null",
            '"x"',
            '{"type": "input_audio_buffer.append", "audio": "' + "A" * 5000 + '"}',
        ]
    ),
)


def run_sequence(url: str, sequence: list[str]) -> None:
    with connect(url, max_size=None, open_timeout=30) as ws:
        assert check_event(ws.recv(30))["type"] == "session.created"
        for n, message in enumerate(sequence):
            ws.send(message)
            barrier = f"barrier-{n}"
            ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "no-such-item", "event_id": barrier}))
            errors = []
            while True:
                event = json.loads(ws.recv(120))
                if event["type"] == "error":
                    if event["error"]["event_id"] == barrier:
                        break
                    errors.append(event["error"])
            assert all(e["type"] != "server_error" for e in errors), (message[:300], errors)
            assert all(e["code"] and e["message"] for e in errors)
            if message not in ('{"type": "response.create"}',):
                # a response in progress may also fail a later create: at most one error per message otherwise
                assert len([e for e in errors if e["code"] != "conversation_already_has_active_response"]) <= 1, (
                    message[:300],
                    errors,
                )


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(sequence=st.lists(messages, min_size=1, max_size=4))
def test_fuzzed_messages_never_break_the_server(server, sequence):
    before = len(server.tracebacks)
    run_sequence(f"ws://127.0.0.1:{server.config.server.port}/v1/realtime", sequence)
    new = server.tracebacks[before:]
    assert not new, [(r.getMessage(), r.exc_info) for r in new]


def test_the_server_still_answers_after_the_fuzzing(server):
    with connect(f"ws://127.0.0.1:{server.config.server.port}/v1/realtime", open_timeout=30) as ws:
        assert json.loads(ws.recv(30))["type"] == "session.created"
        ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello."}]},
                }
            )
        )
        ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
        while (event := json.loads(ws.recv(150)))["type"] != "response.done":
            assert event["type"] != "error", event
        assert event["response"]["status"] == "completed"
    assert not server.tracebacks
