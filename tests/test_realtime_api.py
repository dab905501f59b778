"""The websocket API with clients no one here wrote: the openai SDK's realtime client (and a raw websockets
client for what the SDK will not send), against `serve()` on the small real models.

Every standard server event is validated against the openai package's own pydantic models, so the event names
and shapes are the GA Realtime API's, not our reading of it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import urllib.request
from typing import get_args

import numpy as np
import pytest
import websockets
from openai.types.realtime import realtime_server_event
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from audio.resample import resample
from voice.assistant import Assistant
from voice.config import ConfigError
from voice.server import serve
from voice.speechset import espeak_utterance, wer
from voice.transports.realtime.wire import WIRE_RATE

from broker import free_port
from realtime_client import b64, make_config
from serving import sdk, serving

SERVER_EVENTS = {
    get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in get_args(get_args(realtime_server_event.RealtimeServerEvent)[0])
}


@pytest.fixture(scope="module")
def assistant(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 32
    return Assistant.load_sync(config)


@contextlib.asynccontextmanager
async def running(config, assistant):
    """serve() in this process; yields the websocket base URL."""
    async with serving(config, assistant):
        yield f"ws://127.0.0.1:{config.server.port}/v1"


def scrape(port: int) -> str:
    """GET /metrics (closing the connection, so the server's shutdown never waits for it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


async def ask_for_a_long_story(conn) -> None:
    """A text question whose spoken answer lasts long enough to be interrupted. The response asks for up to 1024
    tokens (the session's default here is 32, a few seconds of speech that a fast machine synthesizes whole before
    the test's barge-in arrives, so the reply would complete instead of being cut): minutes of speech, so the
    interruption always lands while the reply is still being generated and spoken."""
    await conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Tell me a long story about a dragon and a knight."}],
        }
    )
    await conn.response.create(response={"max_output_tokens": 1024})


async def events_until(conn, last: str, timeout: float = 150.0, *, validate: bool = True) -> list[dict]:
    """Raw server events up to and including the first of type ``last``; each one schema-checked."""
    out: list[dict] = []
    async with asyncio.timeout(timeout):
        while True:
            raw = json.loads(await conn.recv_bytes())
            if validate and raw["type"] in SERVER_EVENTS:
                SERVER_EVENTS[raw["type"]].model_validate(raw)
            out.append(raw)
            if raw["type"] == last:
                return out


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def audio_of(events: list[dict]) -> np.ndarray:
    chunks = [
        np.frombuffer(base64.b64decode(e["delta"]), "<i2") for e in events if e["type"] == "response.output_audio.delta"
    ]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


async def send_speech(conn, samples24: np.ndarray, *, silence_s: float = 1.2, speed: float = 4.0) -> None:
    """Speech then silence, in 100 ms appends, ``speed`` times faster than real time."""
    audio = np.concatenate(
        [np.zeros(WIRE_RATE // 5, np.int16), samples24, np.zeros(int(silence_s * WIRE_RATE), np.int16)]
    )
    step = WIRE_RATE // 10
    for i in range(0, len(audio), step):
        await conn.input_audio_buffer.append(audio=b64(audio[i : i + step]))
        await asyncio.sleep(0.1 / speed)


async def text_turn(conn, text: str, **response) -> list[dict]:
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create(**({"response": response} if response else {}))
    return await events_until(conn, "response.done")


# ---- happy paths, with the openai SDK ------------------------------------------------------------------------


async def test_text_turn_gets_text_audio_and_latency_trace(assistant):
    config = make_config(assistant)
    async with running(config, assistant) as url:
        async with sdk(url).realtime.connect(model="smollm2") as conn:
            created = await events_until(conn, "session.created")
            session = created[0]["session"]
            assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
            assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"

            events = await text_turn(conn, "Say hello to Bob.")
            kinds = types(events)
            done = events[-1]["response"]
            assert done["status"] == "completed", done
            # the order a Realtime client relies on
            assert (
                kinds.index("response.created")
                < kinds.index("response.output_audio_transcript.delta")
                < kinds.index("response.output_audio_transcript.done")
                < kinds.index("specvoice.latency")
                < kinds.index("response.done")
            )
            transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
            assert transcript.strip()
            assert done["output"][0]["content"][0]["transcript"].strip() == transcript.strip()
            # the audio is 24 kHz speech of that text: transcribe it back with the server's own STT
            audio = audio_of(events)
            assert len(audio) > WIRE_RATE // 2
            heard = await assistant.stt.transcribe(resample(audio, WIRE_RATE, 16000))
            assert wer(transcript, heard) < 0.6, (transcript, heard)
            latency = next(e for e in events if e["type"] == "specvoice.latency")
            assert latency["response_id"] == done["id"]
            stages = latency["trace"]["stages_ms"]
            assert stages["llm_first_token"] > 0 and stages["text_to_voice"] > 0

            # a second turn in the same session remembers the conversation
            second = await text_turn(conn, "Thank you.", output_modalities=["text"])
            assert second[-1]["response"]["status"] == "completed"
            assert "response.output_text.delta" in types(second)
            assert "response.output_audio.delta" not in types(second)


async def test_spoken_turn_with_server_vad(assistant):
    question = "What is the capital of France?"
    config = make_config(assistant)
    async with running(config, assistant) as url:
        async with sdk(url).realtime.connect(model="smollm2") as conn:
            await events_until(conn, "session.created")
            await send_speech(conn, espeak_utterance(question, rate=WIRE_RATE))
            events = await events_until(conn, "response.done")
            kinds = types(events)
            for kind in (
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "conversation.item.input_audio_transcription.completed",
                "response.created",
                "response.output_audio.delta",
                "specvoice.latency",
            ):
                assert kind in kinds, (kind, kinds)
            assert (
                kinds.index("input_audio_buffer.speech_started")
                < kinds.index("input_audio_buffer.speech_stopped")
                < kinds.index("response.created")
            )
            started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
            stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
            assert started["item_id"] == stopped["item_id"]
            assert 0 <= started["audio_start_ms"] < stopped["audio_end_ms"]
            final = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
            assert final["item_id"] == stopped["item_id"]
            assert wer(question, final["transcript"]) <= 0.34, final["transcript"]
            deltas = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
            assert all(e["item_id"] == final["item_id"] and e["delta"] for e in deltas)
            assert events[-1]["response"]["status"] == "completed"
            trace = next(e for e in events if e["type"] == "specvoice.latency")["trace"]
            assert {"speech_end", "endpoint", "stt_final", "llm_first_token"} <= set(trace["marks_ms"])
            # the audio is sent 4x faster than real time, so its clock runs seconds ahead of the wall: the trace's
            # speech marks are when that audio arrived (Listener.arrival), or the reply would seem to start
            # before the user stopped speaking (voice_to_voice 0)
            marks = trace["marks_ms"]
            assert marks["speech_start"] < marks["speech_end"] <= marks["endpoint"] <= marks["stt_final"], marks
            assert trace["stages_ms"]["voice_to_voice"] > 0


async def test_manual_turn_taking_commit_then_response_create(assistant):
    question = "Name a color."
    config = make_config(assistant)
    async with running(config, assistant) as url:
        async with sdk(url).realtime.connect(model="smollm2") as conn:
            await events_until(conn, "session.created")
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["text"],
                    "audio": {"input": {"turn_detection": None}},
                }
            )
            updated = (await events_until(conn, "session.updated"))[-1]["session"]
            assert updated["audio"]["input"]["turn_detection"] is None
            assert updated["output_modalities"] == ["text"]
            speech = espeak_utterance(question, rate=WIRE_RATE)
            for i in range(0, len(speech), WIRE_RATE // 5):
                await conn.input_audio_buffer.append(audio=b64(speech[i : i + WIRE_RATE // 5]))
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            events = await events_until(conn, "response.done")
            kinds = types(events)
            assert "input_audio_buffer.speech_started" not in kinds  # no server VAD in manual mode
            committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
            final = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
            assert final["item_id"] == committed["item_id"]
            assert wer(question, final["transcript"]) <= 0.34, final["transcript"]
            assert events[-1]["response"]["status"] == "completed"
            assert "response.output_text.delta" in kinds and "response.output_audio.delta" not in kinds

            # clearing the buffer: the next commit has nothing to commit
            await conn.input_audio_buffer.append(audio=b64(speech[:WIRE_RATE]))
            await conn.input_audio_buffer.clear()
            assert (await events_until(conn, "input_audio_buffer.cleared"))[-1]["type"] == "input_audio_buffer.cleared"
            await conn.input_audio_buffer.commit()
            error = (await events_until(conn, "error"))[-1]["error"]
            assert error["code"] == "input_audio_buffer_commit_empty"


async def test_response_cancel_stops_the_turn_and_the_session_goes_on(assistant):
    config = make_config(assistant)
    async with running(config, assistant) as url:
        async with sdk(url).realtime.connect(model="smollm2") as conn:
            await events_until(conn, "session.created")
            await ask_for_a_long_story(conn)
            await events_until(conn, "response.output_audio_transcript.delta")
            await conn.response.cancel()
            events = await events_until(conn, "response.done")
            done = events[-1]["response"]
            assert done["status"] == "cancelled"
            assert done["status_details"]["reason"] == "client_cancelled"
            # nothing to cancel any more: a clear error, and the session still answers
            await conn.response.cancel()
            assert (await events_until(conn, "error"))[-1]["error"]["code"] == "response_cancel_not_active"
            again = await text_turn(conn, "Hello.", output_modalities=["text"])
            assert again[-1]["response"]["status"] == "completed"


# ---- bad input ---------------------------------------------------------------------------------------------------


async def test_bad_input_gets_clear_errors_and_the_session_survives(assistant):
    config = make_config(assistant)
    async with running(config, assistant) as url:
        async with connect(f"{url}/realtime") as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"

            async def error_for(message) -> dict:
                await ws.send(message)
                while True:
                    event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if event["type"] == "error":
                        SERVER_EVENTS["error"].model_validate(event)
                        return event["error"]

            assert (await error_for("{not json"))["code"] == "invalid_json"
            assert (await error_for("[1, 2]"))["code"] == "invalid_json"
            err = await error_for(json.dumps({"type": "response.explode", "event_id": "e1"}))
            assert err["code"] == "unknown_event_type" and err["event_id"] == "e1"
            assert "response.create" in err["message"]  # the message lists what is accepted
            err = await error_for(json.dumps({"type": "input_audio_buffer.append", "audio": 12345}))
            assert err["code"] == "invalid_value" and err["param"] == "audio"
            err = await error_for(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]},
                    }
                )
            )
            assert err["code"] == "invalid_value" and err["param"] == "item.content.0.text"
            err = await error_for(json.dumps({"type": "input_audio_buffer.append", "audio": "!!not base64!!"}))
            assert err["code"] == "invalid_audio" and "base64" in err["message"]
            err = await error_for(
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x02\x03").decode()})
            )
            assert err["code"] == "invalid_audio" and "odd" in err["message"]
            err = await error_for(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/opus"}}}},
                    }
                )
            )
            assert err["code"] == "invalid_value" and "audio/pcmu" in err["message"]  # names the supported ones
            err = await error_for(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "realtime",
                            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 11025}}},
                        },
                    }
                )
            )
            assert err["code"] == "unsupported_audio_format" and "24000" in err["message"]
            err = await error_for(json.dumps({"type": "response.create", "response": {"conversation": "none"}}))
            assert err["code"] == "unsupported_parameter" and err["param"] == "response.conversation"
            assert (await error_for(b"\x00\x01binary"))["code"] == "binary_not_supported"
            assert (await error_for(json.dumps({"type": "response.cancel"})))["code"] == "response_cancel_not_active"
            assert (await error_for(json.dumps({"type": "input_audio_buffer.commit"})))[
                "code"
            ] == "input_audio_buffer_commit_empty"

            # after all that, the same connection still answers a text turn
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
                    }
                )
            )
            await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
            while (event := json.loads(await asyncio.wait_for(ws.recv(), 150)))["type"] != "response.done":
                pass
            assert event["response"]["status"] == "completed"


async def test_oversized_frame_closes_only_that_connection(assistant):
    config = make_config(assistant, max_message_bytes=64 * 1024)
    async with running(config, assistant) as url:
        async with connect(f"{url}/realtime") as bystander, connect(f"{url}/realtime") as big:
            for ws in (bystander, big):
                assert json.loads(await ws.recv())["type"] == "session.created"
            await big.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (100 * 1024)}))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(big.recv(), 10)
            assert closed.value.rcvd.code == 1009  # message too big
            await bystander.send(json.dumps({"type": "input_audio_buffer.clear"}))
            assert json.loads(await asyncio.wait_for(bystander.recv(), 10))["type"] == "input_audio_buffer.cleared"


async def test_token_is_required_when_configured(assistant):
    config = make_config(assistant, token="s3cret-token")
    async with running(config, assistant) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            async with connect(f"{url}/realtime", additional_headers=headers) as ws:
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd.code == 1008 and "token" in closed.value.rcvd.reason
        async with connect(f"{url}/realtime?token=s3cret-token") as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
        async with sdk(url, token="s3cret-token").realtime.connect(model="smollm2") as conn:
            assert (await events_until(conn, "session.created"))[0]["type"] == "session.created"
        # metrics need the token too
        port = config.server.port
        with pytest.raises(urllib.error.HTTPError) as refused:
            await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert refused.value.code == 401
        refused.value.close()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer s3cret-token"}
        )
        with await asyncio.to_thread(urllib.request.urlopen, request, timeout=10) as response:
            assert response.headers.get_all("Content-Type") == ["text/plain; version=1.0.0; charset=utf-8"]
            assert b"specvoice_sessions_opened_total" in response.read()


async def test_session_limit_idle_timeout_unknown_path_and_metrics(assistant):
    config = make_config(assistant, max_sessions=2, idle_timeout_s=1.0, metrics_port=free_port())
    async with running(config, assistant) as url:
        port = config.server.port
        # the optional plain metrics listener (127.0.0.1 only) serves the same registry
        assert "specvoice_sessions_opened_total" in await asyncio.to_thread(scrape, config.server.metrics_port)
        async with connect(f"{url}/realtime") as a, connect(f"{url}/realtime") as b:
            for ws in (a, b):
                assert json.loads(await ws.recv())["type"] == "session.created"
            async with connect(f"{url}/realtime") as third:
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(third.recv(), 10)
                assert closed.value.rcvd.code == 1013 and "max_sessions" in closed.value.rcvd.reason
            text = await asyncio.to_thread(scrape, port)
            assert 'specvoice_sessions{transport="websocket"} 2.0' in text
            assert 'specvoice_connections_rejected_total{reason="sessions",transport="websocket"} 1.0' in text
            # silent clients are closed after server.idle_timeout_s
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(a.recv(), 10)
            assert closed.value.rcvd.code == 1000 and "idle" in closed.value.rcvd.reason
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with connect(f"ws://127.0.0.1:{port}/elsewhere"):
                pass
        assert refused.value.response.status_code == 404


async def test_disconnect_mid_turn_leaks_nothing_and_others_keep_working(assistant):
    config = make_config(assistant)
    async with running(config, assistant) as url:
        before_sessions = len(assistant._sessions)
        before_tasks = len(asyncio.all_tasks())
        async with sdk(url).realtime.connect(model="smollm2") as other:
            await events_until(other, "session.created")
            leaver = await sdk(url).realtime.connect(model="smollm2").enter()
            await events_until(leaver, "session.created")
            await leaver.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Tell me about the ocean."}],
                }
            )
            await leaver.response.create()
            await events_until(leaver, "response.output_audio_transcript.delta")
            await leaver.close()  # gone in the middle of its reply
            events = await text_turn(other, "Hello there.", output_modalities=["text"])
            assert events[-1]["response"]["status"] == "completed"
        for _ in range(100):
            if len(assistant._sessions) == before_sessions:
                break
            await asyncio.sleep(0.05)
        assert len(assistant._sessions) == before_sessions
        assert len(asyncio.all_tasks()) <= before_tasks
        text = await asyncio.to_thread(scrape, config.server.port)
        assert 'specvoice_sessions{transport="websocket"} 0.0' in text
        assert 'specvoice_turns_total{outcome="interrupted"}' in text
        assert "specvoice_stage_seconds_bucket" in text


async def test_speech_during_a_reply_is_a_barge_in(assistant):
    config = make_config(assistant)
    async with running(config, assistant) as url:
        async with sdk(url).realtime.connect(model="smollm2") as conn:
            await events_until(conn, "session.created")
            await ask_for_a_long_story(conn)
            first = await events_until(conn, "response.output_audio.delta")
            response_id = next(e for e in first if e["type"] == "response.created")["response"]["id"]
            await send_speech(conn, espeak_utterance("Stop. What is your name?", rate=WIRE_RATE))
            events: list[dict] = []
            while not events or events[-1]["response"]["id"] == response_id:  # until the new reply is done
                events += await events_until(conn, "response.done")
            kinds = types(events)
            interrupted = next(
                e for e in events if e["type"] == "response.done" and e["response"]["id"] == response_id
            )["response"]
            assert interrupted["status"] == "cancelled"
            assert interrupted["status_details"]["reason"] == "turn_detected"
            assert "input_audio_buffer.speech_started" in kinds
            # the interruption itself is answered in a new response
            assert events[-1]["response"]["status"] == "completed"


async def test_truncate_after_a_barge_in_keeps_only_the_heard_words(assistant):
    """What stock clients (pipecat) do at a barge-in: stop playing, then conversation.item.truncate with how much
    they played. The history, and so the next turn's prompt, holds exactly the words heard by then."""
    config = make_config(assistant)
    async with running(config, assistant) as url:
        async with sdk(url).realtime.connect(model="smollm2") as conn:
            created = await events_until(conn, "session.created")
            session = next(s for s in assistant._sessions if s.id == created[-1]["session"]["id"])
            await ask_for_a_long_story(conn)
            first = await events_until(conn, "response.output_audio.delta")
            item_id = first[-1]["item_id"]
            await asyncio.sleep(3.0)  # by its own clock the server would now think ~3 s of the reply were heard
            question = espeak_utterance("Stop. What is your name?", rate=WIRE_RATE)
            for i in range(0, len(question), WIRE_RATE // 10):  # the interruption, without its trailing silence yet
                await conn.input_audio_buffer.append(audio=b64(question[i : i + WIRE_RATE // 10]))
            seen = await events_until(conn, "input_audio_buffer.speech_started")
            generated = "".join(
                e["delta"] for e in first + seen if e["type"] == "response.output_audio_transcript.delta"
            )
            await conn.send(
                {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 1000}
            )
            tr_events = await events_until(conn, "conversation.item.truncated")
            truncated = tr_events[-1]
            assert truncated["item_id"] == item_id and truncated["audio_end_ms"] == 1000
            interrupted = session.last_turn
            await conn.input_audio_buffer.append(audio=b64(np.zeros(int(1.5 * WIRE_RATE), np.int16)))
            first_id = next(e for e in first if e["type"] == "response.created")["response"]["id"]
            later: list[dict] = []
            while not later or later[-1]["response"]["id"] == first_id:  # the answer to the interruption
                later += await events_until(conn, "response.done")
            cut = next(
                e for e in seen + tr_events + later if e["type"] == "response.done" and e["response"]["id"] == first_id
            )["response"]
            by_clock = cut["output"][0]["content"][0]["transcript"]  # what the server's own clock said was heard
            heard = interrupted.outcome.heard_text(int(1.0 * assistant.tts_sample_rate))
            assert cut["status"] == "cancelled" and heard and generated.startswith(heard), (heard, generated)
            assert len(heard.split()) < len(by_clock.split()), "the client's truncate, not the clock, decides"
            roles = [m["role"] for m in session.history]
            assert roles == ["system", "user", "assistant", "user", "assistant"], session.history
            assert session.history[2]["content"] == heard, "the next turn's prompt holds only the heard words"
            assert "name" in session.history[3]["content"].lower()
            prompt = session.conversation.prompt_ids(session.history[:4])
            text = assistant.engine.tokenizer.decode(prompt)
            assert heard in text and generated.strip() not in text


async def test_a_port_in_use_is_a_clear_config_error(assistant):
    config = make_config(assistant)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", config.server.port))
        taken.listen()
        with pytest.raises(ConfigError, match="server.port"):
            await serve(config, assistant=assistant)
