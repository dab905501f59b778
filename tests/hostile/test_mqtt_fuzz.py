"""Property-based fuzzing of MQTT payloads against the running bridge (real mosquitto, the small models).

Hypothesis publishes whatever a client could: random bytes, invalid UTF-8, huge or deeply nested JSON, wrong field
types, unknown fields, bad conversation ids, retained commands, Home Assistant status floods, on every topic the
bridge listens to. Properties: the bridge never stops, never logs an error or a traceback, never reports an
internal failure, every bad payload costs at most one rate-limited error report, and afterwards it still speaks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voice.assistant import Assistant
from voice.config import MQTTConfig
from voice.transports.mqtt.bridge import MqttBridge

from broker import Broker, Home

TOPICS = [
    "specvoice/say",
    "specvoice/ask",
    "specvoice/cancel",
    "homeassistant/status",
    "home/doorbell",
    "home/garage/motion",
]
EVENTS = {"home/doorbell": "{name} is at the door.", "home/+/motion": "Motion on {topic}."}

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=1200))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
field = st.sampled_from(["text", "id", "speak", "conversation_id", "name", "voice", ""])
command = st.dictionaries(field, json_value, max_size=5)
payloads = st.one_of(
    st.binary(max_size=20_000),
    st.text(max_size=1500).map(str.encode),
    command.map(lambda d: json.dumps(d).encode()),
    st.integers(1, 30_000).map(lambda n: b"[" * n),  # nesting deeper than any parser allows
    st.integers(1, 3000).map(lambda n: ('{"text": ' + "[" * n + '"x"' + "]" * n + "}").encode()),
    st.sampled_from([b"online", b"offline", b"PRESS", b"", b"{", b"null", b'{"text": "\\ud800"}']),
)


class Harness:
    """The bridge and a home client on one event loop in a thread, so hypothesis can drive it from a plain test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz loop", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def harness(small_config, tmp_path_factory):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 4
    with Broker(tmp_path_factory.mktemp("broker")) as broker:
        config.mqtt = MQTTConfig(
            enabled=True,
            port=broker.port,
            client_id="specvoice-fuzz",
            events=EVENTS,
            reconnect_min_s=0.2,
            reconnect_max_s=1.0,
        )
        h = Harness()
        h.assistant = Assistant.load_sync(config)
        h.bridge = MqttBridge(config, h.assistant)

        async def start() -> None:
            h.task = asyncio.create_task(h.bridge.run())
            await asyncio.wait_for(h.bridge.connected.wait(), 30)
            h.home = await Home(broker, ("specvoice/#",), identifier="fuzzer").connect()

        h.call(start())
        yield h

        async def stop() -> None:
            for topic in TOPICS:  # no retained command is left behind on the broker
                await h.home.publish(topic, b"", retain=True)
            await h.home.close()
            h.task.cancel()
            await asyncio.gather(h.task, return_exceptions=True)
            await h.assistant.close()

        h.call(stop())
        h.close()


def test_fuzzed_payloads_never_break_the_bridge(harness):
    recorder = Recorder()
    logging.getLogger("specvoice").addHandler(recorder)
    try:

        @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(topic=st.sampled_from(TOPICS), payload=payloads, retain=st.sampled_from([False, False, False, True]))
        def publish(topic: str, payload: bytes, retain: bool) -> None:
            harness.call(harness.home.publish(topic, payload, retain=retain))
            assert not harness.task.done(), f"the bridge stopped: {harness.task.exception()!r}"

        publish()

        async def still_speaks() -> dict:
            await harness.home.publish("specvoice/cancel", b"PRESS")
            async with asyncio.timeout(300):  # let whatever the fuzzer queued run out
                while not harness.bridge.commands.queue.empty() or harness.bridge.commands.current_session:
                    await asyncio.sleep(0.2)
            mark = harness.home.mark()
            await harness.home.publish("specvoice/say", b"Still working.")
            return await harness.home.wait_for(
                "specvoice/spoken", lambda s: s["text"] == "Still working.", since=mark, timeout=120
            )

        assert harness.call(still_speaks(), timeout=480)["audio_s"] > 0.3
    finally:
        logging.getLogger("specvoice").removeHandler(recorder)
    assert not harness.task.done()
    bad = [r for r in recorder.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == [], [f"{r.levelname} {r.getMessage()} {r.exc_info}" for r in bad][:5]
    errors = [json.loads(t) for t in harness.home.texts("specvoice/error")]
    assert errors, "the fuzzer's bad payloads earned error reports"
    assert {e["kind"] for e in errors} <= {"payload", "busy", "turn"}, {e["kind"] for e in errors}
    assert all("fix:" in e["error"] for e in errors if e["kind"] != "turn")
