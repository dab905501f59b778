"""The whole home-action path with the embedded Qwen2.5-Coder-1.5B target: a spoken-style request goes in over
MQTT, the model writes an action marker, the parser and the allow-list decide, the bridge publishes."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from voice.assistant import Assistant
from voice.config import load_config
from voice.transports.mqtt.bridge import MqttBridge

from broker import Broker, Home

pytestmark = pytest.mark.big

LIGHT, LOCK = "home/kitchen/light/set", "home/front_door/lock/set"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("broker")) as running:
        yield running


@pytest.fixture(scope="module")
def config(broker):
    return load_config(
        "configs/default.toml",
        environ={},
        overrides=[
            "llm.mode=target",  # the target alone: same greedy text as with the draft, less to load
            "mqtt.enabled=true",
            f"mqtt.port={broker.port}",
            "mqtt.reconnect_min_s=0.2",
            f'mqtt.allowed_actions={{"{LIGHT}" = ["ON", "OFF"]}}',
        ],
    )


@pytest.fixture(scope="module")
def assistant(config):
    return Assistant.load_sync(config)


async def ask(home: Home, text: str) -> tuple[dict, int]:
    mark = home.mark()
    await home.publish("specvoice/ask", json.dumps({"text": text, "speak": False}))
    return await home.wait_for("specvoice/answer", since=mark, timeout=300), mark


async def test_qwen_switches_the_light_and_cannot_reach_the_lock(assistant, config, broker):
    bridge = MqttBridge(config, assistant)
    task = asyncio.create_task(bridge.run())
    try:
        async with asyncio.timeout(30):
            await bridge.connected.wait()
        async with Home(broker, ("home/#", "specvoice/#")) as home:
            answer, mark = await ask(home, "Turn on the kitchen lights.")
            print("light:", answer["reply"], home.texts("specvoice/error", mark))
            assert home.texts(LIGHT, mark) == ["ON"]
            assert "[" not in answer["reply"]  # the marker was not spoken

            answer, mark = await ask(home, "Unlock the front door.")
            errors = [json.loads(t) for t in home.texts("specvoice/error", mark)]
            print("lock:", answer["reply"], errors)
            assert home.received("home/#", mark) == []  # nothing reached any device
            # the model either wrote no marker, or wrote one that the allow-list refused
            assert all(e["kind"] == "action" and e["topic"] != LIGHT for e in errors)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await assistant.close()
