"""Function calling through the websocket with the shipped target model (Qwen2.5-Coder-1.5B-Instruct, whose chat
template takes `tools` and which answers with `<tool_call>{json}</tool_call>`), driven by the openai SDK's realtime
client: the declared tool reaches the chat template, the model's call becomes a `function_call` item (never
spoken), and the client's `function_call_output` continues the turn.

Marked `big` (loads the 1.5B target; run it under `flock /tmp/bigmodel.lock`). SmolLM2-135M, the small test model,
has no tool-aware template.
"""

from __future__ import annotations

import json

import pytest

from voice.assistant import Assistant
from voice.config import load_config

from realtime_client import SDK_EVENTS, make_config
from serving import sdk, serving

pytestmark = pytest.mark.big

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def assistant():
    config = load_config(
        "configs/default.toml",
        environ={},
        overrides=[
            "llm.mode=target",  # the target alone: the same greedy text as with the draft, less to load
            "llm.max_new_tokens=64",
        ],
    )
    return Assistant.load_sync(config)


async def events_until(conn, last: str, timeout: float = 300.0) -> list[dict]:
    out: list[dict] = []
    while True:
        raw = json.loads(await conn.recv_bytes())
        if raw["type"] in SDK_EVENTS:
            SDK_EVENTS[raw["type"]].model_validate(raw)
        out.append(raw)
        if raw["type"] == last:
            return out


async def test_the_target_model_calls_a_declared_tool_and_answers_from_its_output(assistant):
    config = make_config(assistant)
    async with serving(config, assistant):
        async with sdk(f"ws://127.0.0.1:{config.server.port}/v1").realtime.connect(model="qwen") as conn:
            await events_until(conn, "session.created")
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "output_modalities": ["audio"]})
            await events_until(conn, "session.updated")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What's the weather like in Paris right now?"}],
                }
            )
            await conn.response.create()
            events = await events_until(conn, "response.done")
            done = events[-1]["response"]
            assert done["status"] == "completed", done
            calls = [
                e["item"]
                for e in events
                if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
            ]
            assert [c["name"] for c in calls] == ["get_weather"], events
            args = next(e for e in events if e["type"] == "response.function_call_arguments.done")
            assert args["call_id"] == calls[0]["call_id"]
            assert json.loads(args["arguments"]) == {"city": "Paris"}
            assert done["output"][-1]["type"] == "function_call"
            spoken = "".join(e.get("delta", "") for e in events if e["type"].endswith("transcript.delta"))
            assert "tool_call" not in spoken and "get_weather" not in spoken  # a call is never spoken
            assert done["usage"]["output_tokens"] > 0

            # the client runs the function and sends its output; the next response answers from it
            await conn.conversation.item.create(
                item={
                    "type": "function_call_output",
                    "call_id": args["call_id"],
                    "output": json.dumps({"temperature_c": 18, "sky": "sunny"}),
                }
            )
            await conn.response.create(response={"output_modalities": ["text"]})
            events = await events_until(conn, "response.done")
            done = events[-1]["response"]
            assert done["status"] == "completed", done
            answer = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            print("answer after the tool:", answer)
            assert "18" in answer or "sunny" in answer.lower(), answer
            assert not [
                e for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
            ]
