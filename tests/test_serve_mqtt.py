"""One `serve()` answers MQTT (a real mosquitto broker) and websocket clients at the same time, on one model
load, and the Prometheus metrics count the MQTT turns too."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from voice.assistant import Assistant
from voice.server import serve

from broker import Broker, Home, free_port
from serving import sdk


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def assistant(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 24
    return Assistant.load_sync(config)


async def test_mqtt_and_websocket_served_together(assistant, tmp_path):
    with Broker(tmp_path / "broker") as broker:
        config = assistant.config.model_copy(deep=True)
        config.server.port = free_port()
        config.wyoming.enabled = False
        config.mqtt.enabled = True
        config.mqtt.port = broker.port
        home = await Home(broker, ("specvoice/#",)).connect()
        ready = asyncio.Event()
        server = asyncio.create_task(serve(config, ready=ready, assistant=assistant))
        try:
            await asyncio.wait_for(ready.wait(), 30)
            assert await home.wait_for("specvoice/availability", lambda text: text == "online") == "online"
            url = f"ws://127.0.0.1:{config.server.port}/v1"
            async with sdk(url).realtime.connect(model="smollm2") as conn:
                assert json.loads(await conn.recv_bytes())["type"] == "session.created"
                await conn.conversation.item.create(
                    item={
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Hello, who are you?"}],
                    }
                )
                await home.publish(
                    "specvoice/ask", json.dumps({"text": "What is two plus two?", "id": "q1", "speak": False})
                )
                await conn.response.create(response={"output_modalities": ["text"]})
                async with asyncio.timeout(150):
                    while (event := json.loads(await conn.recv_bytes()))["type"] != "response.done":
                        pass
                assert event["response"]["status"] == "completed"
                answer = await home.wait_for("specvoice/answer", timeout=150)
                assert answer["id"] == "q1" and answer["reply"].strip()
            metrics = await asyncio.to_thread(scrape, config.server.port)
            turns = sum(
                float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("specvoice_turns_total{")
            )
            assert turns >= 2  # the websocket turn and the MQTT turn
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
            await home.close()
