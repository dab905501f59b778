"""What the MQTT bridge does against clients that misbehave, on a real mosquitto broker and the small models:
retained commands, a full command queue, a rediscovery flood, messages too big for the broker, other transports'
words, conversations kept apart per conversation_id. (The outbox's own rules are tested without a broker.)"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from voice.assistant import Assistant
from voice.transports.mqtt.bridge import MqttBridge
from voice.transports.mqtt.outbox import Outbox, TokenBucket
from voice.transports.mqtt.payloads import Outgoing, Priority

from broker import Broker, Home
from test_mqtt_bridge import ENTITIES, bridge_config, running


@pytest.fixture(scope="module")
def assistant(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 16
    return Assistant.load_sync(config)


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "broker") as running_broker:
        yield running_broker


# ---- the outbox, on its own ----------------------------------------------------------------------------------


def test_outbox_sends_control_then_results_then_telemetry_and_drops_telemetry_first():
    box = Outbox(limit=3)
    trace = Outgoing("p/turn", "t1", priority=Priority.TELEMETRY)
    assert box.put(trace) is None
    assert box.put(Outgoing("p/answer", "a1")) is None
    assert box.put(Outgoing("p/state", "thinking", True, Priority.CONTROL)) is None
    assert box.put(Outgoing("p/answer", "a2")) is None
    assert box.put(Outgoing("p/answer", "a3")) is trace  # full: the telemetry goes, not an answer
    assert box.put(Outgoing("p/latency", "l1", priority=Priority.TELEMETRY)).payload == "l1"  # nothing less urgent
    for state in ("speaking", "idle"):  # the state is replaced, never queued twice, and never counts as full
        assert box.put(Outgoing("p/state", state, True, Priority.CONTROL)) is None
    order = []
    while (head := box.head()) is not None:
        order.append(head.payload)
        box.done(head)
    assert order == ["idle", "a1", "a2", "a3"] and box.dropped == 2


def test_token_bucket_allows_a_burst_then_a_rate_per_key():
    bucket = TokenBucket(rate=0.001, burst=3)
    assert [bucket.allow("a") for _ in range(5)] == [True, True, True, False, False]
    assert bucket.allow("b") and bucket.take_refused("a") == 2


# ---- against a broker --------------------------------------------------------------------------------------------


async def test_retained_say_is_not_spoken_even_after_a_reconnect(assistant, broker, caplog):
    async with Home(broker, ("specvoice/#",)) as home:
        await home.publish("specvoice/say", "Yesterday's announcement.", retain=True)
        bridge = MqttBridge(bridge_config(assistant, broker, reconnect_min_s=0.2), assistant)
        with caplog.at_level(logging.WARNING, logger="specvoice.mqtt"):
            async with running(bridge):
                broker.restart()  # the bridge subscribes again, and the broker replays the retained say again
                await home.reconnect()
                async with asyncio.timeout(30):
                    while not bridge.connected.is_set():
                        await asyncio.sleep(0.1)
                mark = home.mark()
                await home.publish("specvoice/say", "Today's announcement.")
                spoken = await home.wait_for("specvoice/spoken", since=mark)
        assert spoken["text"] == "Today's announcement."
        assert [json.loads(t)["text"] for t in home.texts("specvoice/spoken")] == ["Today's announcement."]
    retained = [r for r in caplog.records if "retained message on a command topic" in r.getMessage()]
    assert len(retained) == 1  # once, however often the broker replays it (rate-limited per topic)


async def test_a_full_command_queue_refuses_with_a_busy_error(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker, max_queued_commands=2), assistant)
    async with running(bridge) as task, Home(broker, ("specvoice/#",)) as home:
        mark = home.mark()
        for i in range(8):
            await home.publish("specvoice/say", f"Announcement number {i}.")
        busy = await home.wait_for("specvoice/error", lambda e: e["kind"] == "busy", since=mark)
        assert "mqtt.max_queued_commands" in busy["error"] and busy["topic"] == "specvoice/say"
        # every say is either spoken or refused, none lost: one running and two waiting at most when they came
        outcomes = await home.wait_count(
            "specvoice/+",
            8,
            since=mark,
            timeout=120,
            where=lambda m: m.topic.value.endswith("spoken") or b'"busy"' in m.payload,
        )
        spoken = [m for m in outcomes if m.topic.value.endswith("spoken")]
        assert len(outcomes) == 8 and 3 <= len(spoken) < 8 and not task.done()


async def test_rediscovery_requests_are_rate_limited(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker, node_id="hall"), assistant)
    bridge.rediscovery_interval_s = 2.0
    configs = "homeassistant/+/hall/+/config"
    async with running(bridge), Home(broker, ("homeassistant/#",), identifier="ha") as home:
        await home.wait_count(configs, len(ENTITIES), timeout=10)
        mark = home.mark()
        for _ in range(40):  # anyone may publish here
            await home.publish("homeassistant/status", "online")
        await home.wait_count(configs, 2 * len(ENTITIES), since=mark, timeout=15)  # at once, then once more
        await asyncio.sleep(3.0)
        assert len(home.received(configs, mark)) == 2 * len(ENTITIES)


async def test_messages_too_big_for_the_broker_are_skipped_and_the_bridge_goes_on(assistant, tmp_path, caplog):
    long_text = "The quick brown fox jumps over the lazy dog. " * 21  # 945 characters
    with Broker(tmp_path / "small", max_packet_size=1000) as broker:  # "spoken" for it is ~1030 bytes
        bridge = MqttBridge(bridge_config(assistant, broker, reconnect_min_s=0.2), assistant)
        with caplog.at_level(logging.WARNING, logger="specvoice.mqtt"):
            async with running(bridge) as task, Home(broker, ("specvoice/#",)) as home:
                mark = home.mark()
                await home.publish("specvoice/say", long_text)
                await home.publish("specvoice/say", "Short one.")
                spoken = await home.wait_for("specvoice/spoken", since=mark, timeout=120)
                assert spoken["text"] == "Short one." and not task.done()
                # a limit we know is kept without asking the broker
                bridge.cfg.max_packet_bytes = 1024
                mark = home.mark()
                await home.publish("specvoice/say", long_text)
                await home.publish("specvoice/say", "Another short one.")
                spoken = await home.wait_for("specvoice/spoken", since=mark, timeout=120)
                assert spoken["text"] == "Another short one."
        assert bridge.skipped == 2
    reasons = [r.reason for r in caplog.records if r.getMessage() == "mqtt message skipped"]
    assert len(reasons) == 2 and "closed the connection twice" in reasons[0] and "max_packet_bytes" in reasons[1]


async def test_only_mqtt_and_local_turns_are_published_unless_asked(assistant, broker):
    async with Home(broker, ("specvoice/#",)) as home:
        for publish in ("local", "all"):
            bridge = MqttBridge(bridge_config(assistant, broker, publish_turns=publish), assistant)
            async with running(bridge):
                websocket_like = assistant.session(name=f"web-{publish}")  # any other transport's session
                try:
                    mark = home.mark()
                    print("ask", publish, flush=True)
                    async with asyncio.timeout(60):
                        await websocket_like.ask("Say hello.", speak=False)
                    print("asked", flush=True)
                    await home.publish("specvoice/ask", json.dumps({"text": "Say goodbye.", "speak": False}))
                    await home.wait_for("specvoice/answer", since=mark, timeout=120)
                    print("answer", flush=True)
                    await home.wait_for("specvoice/turn", since=mark, timeout=10)
                    print("turn", flush=True)
                finally:
                    try:
                        async with asyncio.timeout(20):
                            await websocket_like.close()
                    except TimeoutError:
                        for t in asyncio.all_tasks():
                            t.print_stack()
                        raise
                    print("closed", flush=True)
            print("bridge stopped", flush=True)
            sessions = {json.loads(t)["session"] for t in home.texts("specvoice/reply", mark)}
            assert sessions == ({"mqtt"} if publish == "local" else {"mqtt", "web-all"})
            assert all(not m.retain for m in home.received("specvoice/reply", mark))


async def test_each_conversation_id_has_its_own_history(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker), assistant)
    async with running(bridge), Home(broker, ("specvoice/#",)) as home:
        asks = [
            ("alice", "My cat is called Tom."),
            ("bob", "My dog is called Rex."),
            (None, "What is my cat called?"),
            ("alice", "What is my cat called?"),
        ]
        mark = home.mark()
        for conversation, text in asks:
            body = {"text": text, "speak": False, **({"conversation_id": conversation} if conversation else {})}
            await home.publish("specvoice/ask", json.dumps(body))
        answers = [json.loads(m.payload) for m in await home.wait_count("specvoice/answer", 4, since=mark, timeout=240)]
        assert [a["conversation_id"] for a in answers] == ["alice", "bob", None, "alice"]
        histories = {
            key: [m["content"] for m in session.history if m["role"] == "user"]
            for key, (session, _) in bridge.commands.conversations.items()
        }
        assert histories == {
            "alice": ["My cat is called Tom.", "What is my cat called?"],
            "bob": ["My dog is called Rex."],
        }
        anonymous = [m["content"] for m in bridge.commands.speaker.history if m["role"] == "user"]
        assert anonymous == ["What is my cat called?"]  # started afresh: it never saw Alice's words
        await home.publish("specvoice/ask", json.dumps({"text": "hi", "conversation_id": "no spaces allowed"}))
        error = await home.wait_for("specvoice/error", since=mark, timeout=10)
        assert error["kind"] == "payload" and "conversation_id" in error["error"] and "fix:" in error["error"]
