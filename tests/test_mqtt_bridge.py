"""The MQTT bridge against a real mosquitto broker, on the real assistant with the small models; the "home" is
an aiomqtt client. Discovery, say/ask round trips, event triggers, home actions, malformed payloads, cancel,
a broker restart in the middle of a conversation, backoff, TLS with credentials, and the last will of a
killed process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import aiomqtt
import pytest

from audio.sinks import WavSink
from voice.assistant import Assistant
from voice.config import Config, MQTTConfig
from voice.config_servers import HomeDeviceConfig
from voice.dialog.actions import ActionParser
from voice.dialog.home import Home as NamedHome
from voice.events import ActionRequested
from voice.transports.mqtt.bridge import MqttBridge

from broker import Broker, Home, make_tls_files

ROOT = Path(__file__).resolve().parent.parent
LIGHT, LOCK = "home/kitchen/light/set", "home/front_door/lock/set"


@pytest.fixture(scope="module")
def assistant(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 32
    return Assistant.load_sync(config)


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "broker") as running:
        yield running


def bridge_config(assistant, broker: Broker, **mqtt) -> Config:
    config = assistant.config.model_copy(deep=True)
    defaults = dict(
        enabled=True,
        host=broker.host,
        port=broker.port,
        client_id="specvoice-test",
        reconnect_min_s=0.2,
        reconnect_max_s=1.0,
    )
    config.mqtt = MQTTConfig(**{**defaults, **mqtt})
    return config


@contextlib.asynccontextmanager
async def running(bridge: MqttBridge, *, wait_connected: bool = True):
    """Run the bridge as serve does (a task); on exit, stop it and check that it never crashed."""
    task = asyncio.create_task(bridge.run())
    try:
        if wait_connected:
            async with asyncio.timeout(30):
                await bridge.connected.wait()
        yield task
    finally:
        assert not task.done() or task.cancelled(), f"the bridge stopped by itself: {task.exception()!r}"
        task.cancel()
        try:
            async with asyncio.timeout(30):
                await asyncio.gather(task, return_exceptions=True)
        except TimeoutError:
            for t in asyncio.all_tasks():
                t.print_stack()
            raise


# ---- discovery and availability --------------------------------------------------------------------------------

CONFIGS = "homeassistant/+/kitchen/+/config"


ENTITIES = [
    ("sensor", "state"),
    ("sensor", "transcript"),
    ("sensor", "reply"),
    ("sensor", "latency"),
    ("sensor", "acceptance"),
    ("text", "say"),
    ("text", "ask"),
    ("notify", "speak"),
    ("button", "stop"),
    ("event", "event"),
]


async def test_discovery_is_retained_and_sent_again_when_home_assistant_comes_online(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker, node_id="kitchen"), assistant)
    n = len(ENTITIES)
    async with running(bridge):
        # a home that connects later still gets every config: they are retained
        async with Home(
            broker, ("homeassistant/#", "specvoice/availability", "specvoice/state", "specvoice/error"), identifier="ha"
        ) as home:
            retained = await home.wait_count(CONFIGS, n, where=lambda m: m.retain, timeout=10)
            configs = {m.topic.value: json.loads(m.payload) for m in retained}
            assert set(configs) == {f"homeassistant/{c}/kitchen/{o}/config" for c, o in ENTITIES}
            state = configs["homeassistant/sensor/kitchen/state/config"]
            assert state["state_topic"] == "specvoice/state"
            assert state["options"] == ["idle", "listening", "thinking", "speaking"]
            assert configs["homeassistant/text/kitchen/say/config"]["command_topic"] == "specvoice/say"
            assert configs["homeassistant/text/kitchen/ask/config"]["command_topic"] == "specvoice/ask"
            assert configs["homeassistant/notify/kitchen/speak/config"]["command_topic"] == "specvoice/say"
            assert configs["homeassistant/button/kitchen/stop/config"]["command_topic"] == "specvoice/cancel"
            assert configs["homeassistant/sensor/kitchen/latency/config"]["unit_of_measurement"] == "ms"
            event = configs["homeassistant/event/kitchen/event/config"]
            assert event["state_topic"] == "specvoice/event" and event["event_types"] == ["wake_word", "turn_end"]
            for name in ("transcript", "reply"):  # the full text as an attribute: a state holds 255 characters
                sensor = configs[f"homeassistant/sensor/kitchen/{name}/config"]
                assert sensor["json_attributes_topic"] == sensor["state_topic"] == f"specvoice/{name}"
                assert "value_json.text[:255]" in sensor["value_template"]
            diagnostic = {topic.split("/")[3] for topic, c in configs.items() if c.get("entity_category")}
            assert diagnostic == {"latency", "acceptance"}
            assert len({c["unique_id"] for c in configs.values()}) == n
            for config in configs.values():
                assert config["availability_topic"] == "specvoice/availability"
                assert config["device"]["identifiers"] == ["specvoice_kitchen"]
                assert config["origin"]["name"] == "specvoice" and config["origin"]["sw_version"]
                assert config["device"]["sw_version"] == config["origin"]["sw_version"]
            assert await home.wait_for("specvoice/availability") == "online"
            assert await home.wait_for("specvoice/state") == "idle"

            # Home Assistant restarts and says so: the configs come again, live (not from the retained store)
            mark = home.mark()
            await home.publish("homeassistant/status", "online")
            live = await home.wait_count(CONFIGS, n, since=mark, where=lambda m: not m.retain, timeout=10)
            assert {m.topic.value: json.loads(m.payload) for m in live} == configs

            # "offline" from Home Assistant sends nothing. The bridge handles messages in order and publishes
            # discovery configs ahead of error reports: once the error for the empty "say" is here, any config
            # that "offline" had caused would be here too.
            mark = home.mark()
            await home.publish("homeassistant/status", "offline")
            await home.publish("specvoice/say", "")
            await home.wait_for("specvoice/error", since=mark, timeout=10)
            assert home.received(CONFIGS, mark) == []


async def test_a_clean_stop_says_offline(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker), assistant)
    async with Home(broker, ("specvoice/availability",)) as home:
        async with running(bridge):
            assert await home.wait_for("specvoice/availability") == "online"
            mark = home.mark()
        assert await home.wait_for("specvoice/availability", since=mark, timeout=10) == "offline"
        assert home.received("specvoice/availability", mark)[-1].retain is False  # live copy of a retained message


# ---- say, ask, events --------------------------------------------------------------------------------------------


async def test_say_round_trip(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker), assistant)
    async with running(bridge), Home(broker, ("specvoice/#",)) as home:
        mark = home.mark()
        await home.publish("specvoice/say", "The washing machine has finished.")
        spoken = await home.wait_for("specvoice/spoken", since=mark)
        assert spoken["text"] == "The washing machine has finished." and spoken["source"] == "specvoice/say"
        assert spoken["interrupted"] is False
        assert 1.0 < spoken["audio_s"] < 6.0  # piper spoke the sentence (about two seconds)
        states = home.texts("specvoice/state", mark, live=True)
        assert states[:2] == ["speaking", "idle"] and states[-1] == "idle"


async def test_ask_round_trip_publishes_answer_reply_turn_and_latency(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker), assistant)
    async with running(bridge), Home(broker, ("specvoice/#",)) as home:
        mark = home.mark()
        await home.publish(
            "specvoice/ask", json.dumps({"text": "What colour is the sky on a clear day?", "id": "q-17"})
        )
        answer = await home.wait_for("specvoice/answer", since=mark, timeout=120)
        assert answer["id"] == "q-17" and answer["question"] == "What colour is the sky on a clear day?"
        assert len(answer["reply"].split()) >= 2 and answer["interrupted"] is False and answer["audio_s"] > 0.5
        assert answer["conversation_id"] is None
        [reply] = [json.loads(t) for t in home.texts("specvoice/reply", mark)]
        assert reply["text"] == answer["reply"] and reply["session"] == "mqtt"
        # telemetry comes after the results (the outbox sends answers first)
        turn = await home.wait_for("specvoice/turn", since=mark, timeout=10)
        assert turn["session"] == "mqtt" and turn["reply"] == answer["reply"]
        assert turn["transcript"] == answer["question"]
        latency = await home.wait_for("specvoice/latency", since=mark, timeout=10)
        assert latency["stage"] == "text_to_voice"
        decoder = turn["trace"]["decoder"]
        assert latency["acceptance_pct"] == (
            round(100 * decoder["accepted_per_drafted"], 1) if decoder["drafted"] else None
        )
        assert latency["ms"] == turn["trace"]["stages_ms"]["text_to_voice"] > 0
        states = home.texts("specvoice/state", mark, live=True)
        assert states[0] == "thinking" and "speaking" in states and states[-1] == "idle"
        event = await home.wait_for("specvoice/event", since=mark, timeout=10)
        assert event == {"event_type": "turn_end", "session": "mqtt", "turn_id": turn["turn_id"], "interrupted": False}
    # the latency is retained for anyone who connects later; the words are not (mqtt.retain_results)
    async with Home(broker, ("specvoice/#", "sync/late"), identifier="late") as late:
        assert (await late.wait_for("specvoice/latency", timeout=10))["ms"] == latency["ms"]
        await late.publish("sync/late", "x")  # comes back after every retained message of the subscription
        await late.wait_for("sync/late", timeout=10)
        assert late.received("specvoice/reply") == [] and late.received("specvoice/transcript") == []


async def test_event_triggers_announce_their_templated_sentence(assistant, broker):
    events = {
        "home/doorbell": "{name} is at the front door.",
        "home/+/motion": "Motion on {topic}.",
        "home/oven/done": "The oven is done: {payload}.",
    }
    bridge = MqttBridge(bridge_config(assistant, broker, events=events), assistant)
    async with running(bridge), Home(broker, ("specvoice/#",)) as home:
        mark = home.mark()
        await home.publish("home/doorbell", json.dumps({"name": "Alice", "button": 1}))
        await home.publish("home/garage/motion", "")
        await home.publish("home/oven/done", "the bread is ready")
        await home.publish("home/doorbell", json.dumps({"who": "Bob"}))  # the template needs "name"
        await home.publish("home/doorbell", json.dumps({"name": "Carol"}))
        spoken = [json.loads(m.payload) for m in await home.wait_count("specvoice/spoken", 4, since=mark)]
        assert [(s["text"], s["source"]) for s in spoken] == [
            ("Alice is at the front door.", "home/doorbell"),
            ("Motion on home/garage/motion.", "home/garage/motion"),
            ("The oven is done: the bread is ready.", "home/oven/done"),
            ("Carol is at the front door.", "home/doorbell"),
        ]
        assert all(s["audio_s"] > 0.5 for s in spoken)
        [error] = [json.loads(t) for t in home.texts("specvoice/error", mark)]
        assert error["kind"] == "payload" and error["topic"] == "home/doorbell"
        assert "needs the field 'name'" in error["error"] and "fix:" in error["error"]


async def test_malformed_payloads_get_a_clear_error_and_the_next_message_works(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker), assistant)
    bad = [
        ("specvoice/ask", b"{not json", "invalid JSON"),
        ("specvoice/ask", b'{"text": 42}', "field 'text' must be a string"),
        ("specvoice/ask", b'{"text": "hi", "voice": "loud"}', "unknown field(s) 'voice'"),
        ("specvoice/ask", b'{"text": "hi", "speak": "yes"}', "field 'speak' must be bool"),
        ("specvoice/say", b"", "no text to use"),
        ("specvoice/say", b"   ", "no text to use"),
        ("specvoice/say", b"\xff\xfe\x00", "not UTF-8"),
        ("specvoice/say", b'{"text": ""}', "no text to use"),
        ("specvoice/say", b"x" * 20000, "over the 16384 byte limit"),
        ("specvoice/say", ("y" * 1001).encode(), "over the 1000 limit"),
    ]
    async with running(bridge) as task, Home(broker, ("specvoice/#",)) as home:
        mark = home.mark()
        for topic, payload, _ in bad:
            await home.publish(topic, payload)
        errors = [json.loads(m.payload) for m in await home.wait_count("specvoice/error", len(bad), since=mark)]
        assert len(errors) == len(bad)
        for error, (topic, _, words) in zip(errors, bad, strict=False):
            assert error["kind"] == "payload" and error["topic"] == topic
            assert words in error["error"] and "fix:" in error["error"], error
        assert not task.done()
        # and the bridge goes on working
        await home.publish("specvoice/say", "Still here.")
        spoken = await home.wait_for("specvoice/spoken", since=mark)
        assert spoken["text"] == "Still here." and spoken["audio_s"] > 0.3


async def test_cancel_stops_speech_in_progress(assistant, broker):
    sink = WavSink(None, assistant.tts_sample_rate, realtime=True)  # plays at the pace of a real speaker
    bridge = MqttBridge(bridge_config(assistant, broker), assistant, sink=sink)
    long_text = (
        "This is a long announcement that goes on for quite a while, so that there is time to stop it. "
        "It has several sentences. Each of them takes a few seconds to speak. Nobody wants to hear all "
        "of it, which is why the stop button exists."
    )
    try:
        async with running(bridge), Home(broker, ("specvoice/#",)) as home:
            mark = home.mark()
            await home.publish("specvoice/say", long_text)
            await home.wait_for("specvoice/state", lambda s: s == "speaking", since=mark)
            await asyncio.sleep(0.5)
            await home.publish("specvoice/cancel", "PRESS")
            spoken = await home.wait_for("specvoice/spoken", since=mark)
            assert spoken["interrupted"] is True
            played_s = sink.played_samples / sink.sample_rate
            assert 0.2 < played_s < 5.0  # the whole text is over ten seconds of speech
            assert home.texts("specvoice/state", mark)[-1] == "idle"
    finally:
        sink.close()


# ---- home actions ------------------------------------------------------------------------------------------------


async def test_allowed_actions_are_published_and_others_refused(assistant, broker):
    allowed = {LIGHT: ["ON", "OFF"]}
    bridge = MqttBridge(bridge_config(assistant, broker, allowed_actions=allowed), assistant)
    async with running(bridge), Home(broker, ("home/#", "specvoice/#")) as home:
        mark = home.mark()
        # what the pipeline does with a reply: parse its markers, emit each request on the session
        parser = ActionParser(allowed)
        reply = f"Sure. [ACTION {LIGHT} on] The lights are on. [ACTION {LOCK} UNLOCK] [ACTION {LIGHT} DIM]"
        assert parser.push(reply) + parser.flush() == "Sure.  The lights are on.  Sorry, I can't do that."
        session = assistant.session(name="voice")
        try:
            for request in parser.requests:
                session.emit(request)
            # a request that claims to be allowed, for a topic this bridge does not allow, is refused too
            session.emit(ActionRequested(LOCK, "UNLOCK", True))
            await home.wait_for(LIGHT, since=mark)
            await home.wait_count("specvoice/error", 3, since=mark, timeout=10)
        finally:
            await session.close()
        assert home.texts(LIGHT, mark) == ["ON"]
        assert home.received(LIGHT, mark)[0].qos == 1 and not home.received(LIGHT, mark)[0].retain
        assert home.texts(LOCK, mark) == []
        assert json.loads(home.texts("specvoice/action", mark)[0]) == {
            "topic": LIGHT,
            "payload": "ON",
            "session": "voice",
        }
        errors = [json.loads(t) for t in home.texts("specvoice/error", mark)]
        assert [(e["kind"], e["topic"], e["payload"]) for e in errors] == [
            ("action", LOCK, "UNLOCK"),
            ("action", LIGHT, "DIM"),
            ("action", LOCK, "UNLOCK"),
        ]
        assert "not on the allow-list" in errors[0]["error"] and "'ON', 'OFF'" in errors[1]["error"]
        assert "not on this bridge's mqtt.allowed_actions" in errors[2]["error"]


async def test_state_topics_are_followed_and_shown_to_the_model_with_a_state_question(assistant, broker):
    """A device's retained state is kept from the moment the bridge connects, a live one replaces it, and a
    question about state reaches the model with the state; a command does not (the prompt prefix stays)."""
    door = HomeDeviceConfig(
        name="garage door",
        topic="home/garage/door/set",
        payloads=["OPEN", "CLOSE"],
        state_topic="home/garage/door/state",
    )
    config = bridge_config(assistant, broker, devices=[door])
    saved, assistant.home = assistant.home, NamedHome.from_config(config.mqtt)  # the home a device config would give
    try:
        async with Home(broker, ("specvoice/#", "home/#")) as home:
            await home.publish("home/garage/door/state", "closed", retain=True)
            bridge = MqttBridge(config, assistant)
            async with running(bridge):
                await asyncio.sleep(0.5)
                assert assistant.home.states == {"home/garage/door/state": "closed"}
                await home.publish("home/garage/door/state", "open")
                mark = home.mark()
                await home.publish("specvoice/ask", json.dumps({"text": "Is the garage door open?"}))
                await home.wait_for("specvoice/answer", since=mark, timeout=120)
                asked = [m["content"] for m in bridge.commands.speaker.history if m["role"] == "user"]
                said = "Yes, the garage door is open."  # the answer the state gives (voice/dialog/state_reply.py)
                assert asked == [f"Is the garage door open?\n(state now: garage door = open; the answer: {said})"]
                assert home.texts("home/garage/door/set", mark) == []  # a question never acts
                await home.publish("home/garage/door/state", "", retain=True)  # clear the retained state
    finally:
        assistant.home = saved


def test_unsafe_or_broken_settings_are_refused_at_start(assistant, broker):
    with pytest.raises(ValueError, match="would let the model command the assistant"):
        MqttBridge(bridge_config(assistant, broker, allowed_actions={"specvoice/say": ["hi"]}), assistant)
    with pytest.raises(ValueError, match="not a valid template"):
        MqttBridge(bridge_config(assistant, broker, events={"home/bell": "{name"}), assistant)
    with pytest.raises(ValueError, match="mqtt.ca_file = '/nonexistent/ca.pem' does not exist; fix:"):
        MqttBridge(bridge_config(assistant, broker, tls=True, ca_file="/nonexistent/ca.pem"), assistant)


# ---- a broker restart, reconnection, credentials, the last will ------------------------------------------------


async def test_broker_restart_mid_conversation_loses_no_qos1_command(assistant, broker):
    bridge = MqttBridge(bridge_config(assistant, broker, reconnect_min_s=3.0, reconnect_max_s=3.0), assistant)
    async with running(bridge) as task:
        home = await Home(broker, ("specvoice/#",)).connect()
        try:
            mark = home.mark()
            await home.publish("specvoice/ask", json.dumps({"text": "Name three farm animals.", "id": 1}))
            await home.wait_for("specvoice/state", lambda s: s == "thinking", since=mark)
            broker.restart()  # the reply is still being generated
            await home.reconnect()
            assert not bridge.connected.is_set()  # the bridge is still waiting to retry (backoff)
            await home.publish("specvoice/say", "The oven is ready.")  # the broker queues it for the bridge
            answer = await home.wait_for("specvoice/answer", since=mark, timeout=120)
            spoken = await home.wait_for("specvoice/spoken", since=mark, timeout=60)
            assert answer["id"] == 1 and answer["reply"] and not answer["interrupted"]
            assert spoken["text"] == "The oven is ready." and spoken["audio_s"] > 0.5
            # the broker fired the bridge's will when it went down, and the bridge said "online" again, live (not
            # the retained copy the home got when it subscribed again)
            assert home.texts("specvoice/availability", mark, live=True)[-1] == "online"
            assert bridge.connected.is_set() and not task.done()
        finally:
            await home.close()
    log = broker.log()
    # the bridge came back with the same id and kept its session (c0 = clean session off)
    assert log.count("as specvoice-test (p2, c0") >= 2, log


async def test_bridge_started_before_the_broker_connects_when_it_comes_up(assistant, tmp_path):
    broker = Broker(tmp_path / "later")
    bridge = MqttBridge(bridge_config(assistant, broker), assistant)
    async with running(bridge, wait_connected=False):
        await asyncio.sleep(1.0)
        assert not bridge.connected.is_set() and "fix: check that the broker runs" in bridge.last_error
        broker.start()
        try:
            async with asyncio.timeout(15):
                await bridge.connected.wait()
            assert bridge.last_error is None
        finally:
            broker.stop()


async def test_tls_and_credentials(assistant, tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    with Broker(tmp_path / "secure", users={"voice": "s3cret", "home": "h0me"}, tls=tls) as broker:
        good = dict(tls=True, ca_file=str(tls.ca), username="voice", password="s3cret")
        bridge = MqttBridge(bridge_config(assistant, broker, **good), assistant)
        home_tls = aiomqtt.TLSParameters(ca_certs=str(tls.ca))
        async with (
            running(bridge),
            Home(broker, ("specvoice/#",), username="home", password="h0me", tls_params=home_tls) as home,
        ):
            await home.publish("specvoice/say", "Secure hello.")
            assert (await home.wait_for("specvoice/spoken"))["text"] == "Secure hello."
        wrong = MqttBridge(bridge_config(assistant, broker, **{**good, "password": "nope"}), assistant)
        async with running(wrong, wait_connected=False) as task:
            await asyncio.sleep(1.0)
            assert not wrong.connected.is_set() and not task.done()
            assert "mqtt.username and mqtt.password" in wrong.last_error
        untrusted = MqttBridge(bridge_config(assistant, broker, **{**good, "ca_file": None}), assistant)
        async with running(untrusted, wait_connected=False):
            await asyncio.sleep(1.0)
            assert not untrusted.connected.is_set() and "mqtt.ca_file" in untrusted.last_error


BRIDGE_PROCESS = textwrap.dedent("""
    import asyncio, sys
    from voice.assistant import Assistant
    from voice.config import load_config
    from voice.transports.mqtt.bridge import MqttBridge

    async def main():
        config = load_config("configs/small.toml", environ={}, overrides=[
            "mqtt.enabled=true", f"mqtt.port={sys.argv[1]}", "mqtt.client_id=specvoice-child"])
        assistant = await Assistant.load(config)
        await MqttBridge(config, assistant).run()

    asyncio.run(main())
""")


async def test_last_will_says_offline_when_the_process_is_killed(broker, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    errors = (tmp_path / "child.err").open("w")
    async with Home(broker, ("specvoice/#",)) as home:
        child = subprocess.Popen(
            [sys.executable, "-c", BRIDGE_PROCESS, str(broker.port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:
            online = home.wait_for("specvoice/availability", timeout=120)
            assert await online == "online", (tmp_path / "child.err").read_text()[-3000:]
            mark = home.mark()
            await home.publish("specvoice/say", "Still alive.")  # a working bridge, not just a connection
            assert (await home.wait_for("specvoice/spoken", since=mark))["text"] == "Still alive."
            mark = home.mark()
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            assert await home.wait_for("specvoice/availability", since=mark, timeout=30) == "offline"
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
            errors.close()
    # the will was retained: a client that connects afterwards sees the bridge offline
    async with Home(broker, ("specvoice/availability",), identifier="later") as later:
        assert await later.wait_for("specvoice/availability", timeout=10) == "offline"
