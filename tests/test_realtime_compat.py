"""Realtime compatibility: what stock clients send is applied or reported in force, never refused with an
`error` (pipecat stops reading at the first one); the conversation is built and edited with items; responses
come with or without new input and carry real usage and our latency trace. Small real models, a real server,
every server event checked against the openai SDK's and pipecat's own schemas (tests/realtime_client.py)."""

from __future__ import annotations

import base64
import copy
import json

import numpy as np
import pytest

from audio import g711
from audio.resample import resample
from voice.assistant import Assistant
from voice.speechset import espeak_utterance, wer
from voice.transports.realtime.responses import LATENCY_KEY
from voice.transports.realtime.wire import WIRE_RATE

from realtime_client import b64, errors, make_config, realtime, types

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def assistant(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 24
    return Assistant.load_sync(config)


def message(role: str, text: str, item_id: str | None = None) -> dict:
    part = "output_text" if role == "assistant" else "input_text"
    item = {"type": "message", "role": role, "content": [{"type": part, "text": text}]}
    return {**item, "id": item_id} if item_id else item


async def test_every_session_setting_is_applied_or_reported_in_force(assistant):
    """What pipecat and other apps send at setup: no error; session.updated says what is in force."""
    instructions = "You are Robo, a terse robot. Answer in five words or fewer."
    async with realtime(make_config(assistant), assistant) as (client, session):
        await client.send(
            type="session.update",
            session={
                "type": "realtime",
                "model": "gpt-realtime",
                "instructions": instructions,
                "output_modalities": ["audio", "text"],
                "temperature": 0.7,
                "max_output_tokens": 20,
                "tools": [WEATHER, {"type": "mcp", "server_label": "x"}],
                "tool_choice": "required",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                        "noise_reduction": {"type": "near_field"},
                        "turn_detection": {
                            "type": "semantic_vad",
                            "eagerness": "low",
                            "create_response": True,
                            "interrupt_response": True,
                        },
                    },
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.2},
                },
            },
        )
        events = await client.until("session.updated")
        assert errors(events) == []
        s = events[-1]["session"]
        # applied
        assert s["instructions"] == instructions and session.history[0]["content"] == instructions
        assert s["temperature"] == 0.7 and session.decode.temperature == 0.7
        assert s["max_output_tokens"] == 20 and session.decode.max_new_tokens == 20
        assert [t["name"] for t in s["tools"]] == ["get_weather"]  # the MCP tool is not run here
        assert session.conversation.tools[0]["function"]["name"] == "get_weather"
        # reported in force instead
        cfg = assistant.config
        assert s["output_modalities"] == ["audio"]  # audio comes with its transcript
        assert s["tool_choice"] == "auto"  # a template cannot force a call
        audio_in, audio_out = s["audio"]["input"], s["audio"]["output"]
        assert audio_in["turn_detection"]["type"] == "server_vad"  # our VAD, always interruptible
        assert audio_in["transcription"]["model"] == cfg.models.stt and audio_in["noise_reduction"] is None
        assert audio_out["voice"] == cfg.models.tts and audio_out["speed"] == 1.0

        # tool_choice none hides the tools from the model; turn detection off is applied
        await client.send(
            type="session.update",
            session={"type": "realtime", "tool_choice": "none", "audio": {"input": {"turn_detection": None}}},
        )
        s = (await client.until("session.updated"))[-1]["session"]
        assert s["tool_choice"] == "none" and session.conversation.tools is None
        assert s["audio"]["input"]["turn_detection"] is None and not session.listener.endpointing


async def test_items_build_and_edit_the_history_the_model_reads(assistant):
    """Restore a conversation (user, assistant and system items, client ids echoed), insert at the root,
    retrieve, delete; then answer it, with real usage and the latency trace in response.metadata."""
    async with realtime(make_config(assistant), assistant) as (client, session):
        items = [
            message("user", "My name is Ada.", "u1"),
            message("assistant", "Nice to meet you, Ada.", "a1"),
            message("system", "Always be brief.", "s1"),
            message("user", "What is my name?", "u2"),
        ]
        previous = None
        for item in items:
            await client.send(type="conversation.item.create", item=item)
            added = (await client.until("conversation.item.added"))[-1]
            assert added["item"]["id"] == item["id"] and added["previous_item_id"] == previous  # pipecat needs both
            previous = item["id"]
        await client.send(type="conversation.item.create", previous_item_id="root", item=message("user", "Hello."))
        assert (await client.until("conversation.item.added"))[-1]["previous_item_id"] is None
        assert [(m["role"], m["content"]) for m in session.history[1:]] == [
            ("user", "Hello."),
            ("user", "My name is Ada."),
            ("assistant", "Nice to meet you, Ada."),
            ("system", "Always be brief."),
            ("user", "What is my name?"),
        ]

        await client.send(type="conversation.item.retrieve", item_id="a1", event_id="r1")
        got = (await client.until("conversation.item.retrieved"))[-1]["item"]
        assert got["role"] == "assistant" and got["content"][0]["text"] == "Nice to meet you, Ada."
        missing = await client.error_for(json.dumps({"type": "conversation.item.retrieve", "item_id": "nope"}))
        assert missing["code"] == "item_retrieve_invalid_item_id"  # the one code pipecat expects here
        await client.send(type="conversation.item.delete", item_id="s1")
        assert (await client.until("conversation.item.deleted"))[-1]["item_id"] == "s1"
        assert "Always be brief." not in [m["content"] for m in session.history]

        events = await client.text_turn("Please answer.", output_modalities=["text"])
        done = events[-1]["response"]
        assert done["status"] == "completed" and errors(events) == []
        usage = done["usage"]
        prompt = session.conversation.prompt_ids(session.history[:-1])
        assert usage["input_tokens"] == len(prompt) and usage["output_tokens"] > 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        latency = next(e for e in events if e["type"] == "specvoice.latency")["trace"]
        assert json.loads(done["metadata"][LATENCY_KEY])["stages_ms"] == latency["stages_ms"]
        reply = done["output"][0]
        assert session.history[-1] == {"role": "assistant", "content": reply["content"][0]["text"]}
        # the next turn reuses the kept KV cache: most of its prompt is cached
        usage = (await client.text_turn("Thanks.", output_modalities=["text"]))[-1]["response"]["usage"]
        assert usage["input_token_details"]["cached_tokens"] > usage["input_tokens"] // 2


async def test_a_response_with_nothing_new_and_per_response_instructions(assistant):
    """A greeting (response.create with no user input) is answered, not refused; per-response instructions
    reach the prompt of that response only."""
    async with realtime(make_config(assistant), assistant) as (client, session):
        seen: list[list[dict]] = []
        prompt_ids = session.conversation.prompt_ids

        def recording(messages=None):  # observes the prompts the engine builds (the real method runs)
            seen.append(copy.deepcopy(messages))
            return prompt_ids(messages)

        session.conversation.prompt_ids = recording
        await client.send(
            type="response.create", response={"output_modalities": ["text"], "instructions": "Greet the user warmly."}
        )
        events = await client.until("response.done")
        done = events[-1]["response"]
        assert done["status"] == "completed" and errors(events) == [], events
        assert done["output"][0]["content"][0]["text"].strip()
        assert any(m and m[0]["content"] == "Greet the user warmly." and len(m) == 1 for m in seen)
        assert session.history[0]["content"] == assistant.config.dialog.system_prompt  # restored afterwards
        assert [m["role"] for m in session.history] == ["system", "assistant"]


async def test_function_call_items_and_outputs_enter_the_history(assistant):
    """A client restoring a tool exchange: the call and its output become the chat-template messages that
    tool-aware templates render (the model's own calls are tested with the target model, test_realtime_tools)."""
    async with realtime(make_config(assistant), assistant) as (client, session):
        await client.send(type="session.update", session={"type": "realtime", "tools": [WEATHER]})
        await client.until("session.updated")
        await client.send(type="conversation.item.create", item=message("user", "Weather in Paris?"))
        await client.send(
            type="conversation.item.create",
            item={
                "type": "function_call",
                "name": "get_weather",
                "call_id": "call_1",
                "arguments": '{"city": "Paris"}',
            },
        )
        await client.send(
            type="conversation.item.create",
            item={"type": "function_call_output", "call_id": "call_1", "output": '{"temperature_c": 18}'},
        )
        events = await client.until(
            "conversation.item.added", where=lambda e: e["item"]["type"] == "function_call_output"
        )
        assert errors(events) == []
        assert session.history[-2]["tool_calls"][0]["function"] == {
            "name": "get_weather",
            "arguments": {"city": "Paris"},
        }
        assert session.history[-1] == {"role": "tool", "content": '{"temperature_c": 18}', "tool_call_id": "call_1"}
        done = (
            await client.until("conversation.item.done", where=lambda e: e["item"]["type"] == "function_call_output")
        )[-1]["item"]
        assert done["call_id"] == "call_1" and done["output"] == '{"temperature_c": 18}'
        events = await client.text_turn("Thanks.", output_modalities=["text"])  # the model reads all of it
        assert events[-1]["response"]["status"] == "completed"


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
async def test_g711_in_and_out(assistant, fmt):
    """Telephony: G.711 at 8 kHz both ways. The question is understood, the reply is 8 kHz G.711 that
    transcribes back to its own transcript."""
    encode, decode = (
        (g711.ulaw_encode, g711.ulaw_decode) if fmt == "audio/pcmu" else (g711.alaw_encode, g711.alaw_decode)
    )
    question = "What is the capital of France?"
    async with realtime(make_config(assistant), assistant) as (client, _):
        await client.send(
            type="session.update",
            session={
                "type": "realtime",
                "audio": {"input": {"format": {"type": fmt}}, "output": {"format": {"type": fmt}}},
            },
        )
        s = (await client.until("session.updated"))[-1]["session"]
        assert s["audio"]["input"]["format"] == {"type": fmt} == s["audio"]["output"]["format"]
        speech = np.concatenate(
            [np.zeros(1600, np.int16), espeak_utterance(question, g711.RATE), np.zeros(int(1.2 * g711.RATE), np.int16)]
        )
        for i in range(0, len(speech), 160):  # 20 ms packets, as a telephone gateway sends them
            await client.send(
                type="input_audio_buffer.append", audio=base64.b64encode(encode(speech[i : i + 160])).decode()
            )
        events = await client.until("response.done")
        assert errors(events) == []
        heard = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert wer(question, heard["transcript"]) <= 0.34, heard["transcript"]
        data = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
        transcript = events[-1]["response"]["output"][0]["content"][0]["transcript"]
        assert len(data) > g711.RATE // 2  # one byte a sample at 8 kHz
        back = await assistant.stt.transcribe(resample(decode(data), g711.RATE, 16000))
        assert wer(transcript, back) < 0.6, (transcript, back)


async def test_pcm_at_other_rates(assistant):
    """audio/pcm at 16 kHz in and 48 kHz out (our extension: the GA API has 24 kHz only, so the stock schemas
    refuse the session object that reports them)."""
    question = "Name a color."
    async with realtime(make_config(assistant), assistant) as (client, _):
        client.unchecked = frozenset({"session.updated", "response.created", "response.done"})
        await client.send(
            type="session.update",
            session={
                "type": "realtime",
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": 16000}},
                    "output": {"format": {"type": "audio/pcm", "rate": 48000}},
                },
            },
        )
        await client.until("session.updated")
        speech = np.concatenate(
            [np.zeros(3200, np.int16), espeak_utterance(question, 16000), np.zeros(20000, np.int16)]
        )
        for i in range(0, len(speech), 1600):
            await client.send(type="input_audio_buffer.append", audio=b64(speech[i : i + 1600]))
        events = await client.until("response.done")
        heard = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert wer(question, heard["transcript"]) <= 0.34, heard["transcript"]
        out = np.concatenate(
            [
                np.frombuffer(base64.b64decode(e["delta"]), "<i2")
                for e in events
                if e["type"] == "response.output_audio.delta"
            ]
        )
        transcript = events[-1]["response"]["output"][0]["content"][0]["transcript"]
        back = await assistant.stt.transcribe(resample(out.astype(np.int16), 48000, 16000))
        assert wer(transcript, back) < 0.6, (transcript, back)
        assert "input_audio_buffer.speech_started" in types(events)


async def test_unsupported_requests_get_one_error_naming_them_and_the_session_goes_on(assistant):
    async with realtime(make_config(assistant), assistant) as (client, _):
        err = await client.error_for(json.dumps({"type": "output_audio_buffer.clear", "event_id": "x1"}))
        assert err["code"] == "unknown_event_type" and err["event_id"] == "x1"
        assert "conversation.item.retrieve" in err["message"]  # the supported list
        err = await client.error_for(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "audio": {"output": {"format": {"type": "audio/pcm", "rate": 12345}}},
                    },
                }
            )
        )
        assert err["code"] == "unsupported_audio_format" and "48000" in err["message"]
        err = await client.error_for(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "data:,"}],
                    },
                }
            )
        )
        assert err["code"] == "unsupported_content" and err["param"] == "item.content.0.type"
        await client.send(type="session.update", session={"type": "realtime", "instructions": "Be brief."})
        events = await client.until("session.updated")
        assert errors(events) == []  # exactly one error each, above
        assert events[-1]["session"]["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": WIRE_RATE}
