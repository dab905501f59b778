"""Load: 8 concurrent websocket sessions x 5 spoken turns each on the small config, through the openai SDK.

Asserts what must hold under load (every turn answered, sessions and tasks back to their baseline, memory
bounded); prints turn latency p50/p95 (client-side voice-to-voice: last speech sample sent -> first reply
audio received; and the server's own trace) without asserting on time. Audio is streamed in real time.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import statistics
import time

import numpy as np
import psutil
import pytest
from openai import AsyncOpenAI

from voice.assistant import Assistant
from voice.speechset import espeak_utterance
from voice.transports.realtime.wire import WIRE_RATE

from broker import free_port
from serving import serving

SESSIONS, TURNS = 8, 5
QUESTIONS = [
    "What is the capital of France?",
    "How are you today?",
    "Tell me a short joke.",
    "What color is the sky?",
    "Name a big animal.",
]

pytestmark = pytest.mark.big


@contextlib.asynccontextmanager
async def running(config, assistant):
    async with serving(config, assistant):
        yield


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def converse(url: str, speech: list[np.ndarray], rss: list[int], results: list[dict]) -> None:
    client = AsyncOpenAI(api_key="x", websocket_base_url=url, base_url=url.replace("ws", "http"))
    async with client.realtime.connect(model="smollm2") as conn:
        assert json.loads(await conn.recv_bytes())["type"] == "session.created"
        for turn, samples in enumerate(speech):
            audio = np.concatenate([samples, np.zeros(int(1.2 * WIRE_RATE), np.int16)])
            step = WIRE_RATE // 10
            speech_end = None
            for i in range(0, len(audio), step):
                await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + step].tobytes()).decode())
                if speech_end is None and i + step >= len(samples):
                    speech_end = time.monotonic()
                await asyncio.sleep(0.1)
            first_audio = None
            result: dict = {"turn": turn}
            async with asyncio.timeout(600):
                while True:
                    event = json.loads(await conn.recv_bytes())
                    kind = event["type"]
                    if kind == "response.output_audio.delta" and first_audio is None:
                        first_audio = time.monotonic()
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        result["transcript"] = event["transcript"]
                    elif kind == "specvoice.latency":
                        result["server_v2v_ms"] = event["trace"]["stages_ms"].get("voice_to_voice")
                        result["reply_total_ms"] = event["trace"]["stages_ms"].get("reply_total")
                    elif kind == "response.done":
                        result["status"] = event["response"]["status"]
                        result["details"] = event["response"]["status_details"]
                        result["reply"] = event["response"]["output"][0]["content"][0]["transcript"]
                        break
            result["client_v2v_ms"] = (first_audio - speech_end) * 1000 if first_audio else None
            results.append(result)
            rss.append(psutil.Process().memory_info().rss)


async def test_eight_sessions_five_spoken_turns_each(small_config, capsys):
    config = small_config.model_copy(deep=True)
    # 8 replies interleave step by step on 2 shared cores: a reply can take minutes, longer than the
    # product's 120 s turn timeout (see the report); this test is about the server, so give turns time
    config.dialog.turn_timeout_s = 900
    config.server.port = free_port()
    config.wyoming.enabled = False
    assistant = await Assistant.load(config)
    speech = [espeak_utterance(q, rate=WIRE_RATE) for q in QUESTIONS]
    url = f"ws://127.0.0.1:{config.server.port}/v1"
    baseline_sessions, baseline_tasks = len(assistant._sessions), len(asyncio.all_tasks())
    rss_start = psutil.Process().memory_info().rss
    rss: list[int] = []
    results: list[dict] = []
    started = time.monotonic()
    async with running(config, assistant):
        async with asyncio.timeout(1500):
            await asyncio.gather(
                *(converse(url, speech[s % TURNS :] + speech[: s % TURNS], rss, results) for s in range(SESSIONS))
            )
    wall = time.monotonic() - started
    failed = [r for r in results if r.get("status") != "completed"]
    with capsys.disabled():
        for r in failed:
            print("\nnot completed:", r.get("status"), r.get("details"), r.get("transcript"))
    assert len(results) == SESSIONS * TURNS
    for r in results:
        assert r["status"] == "completed" and r["transcript"].strip() and r["reply"].strip(), r
    client = [r["client_v2v_ms"] for r in results]
    assert all(v is not None for v in client)
    assert len(assistant._sessions) == baseline_sessions
    assert len(asyncio.all_tasks()) <= baseline_tasks
    first_round, last_round = max(rss[:SESSIONS]), max(rss[-SESSIONS:])
    growth_mb = (last_round - first_round) / 2**20
    assert growth_mb < 200, f"memory grew {growth_mb:.0f} MB from the first round of turns to the last"
    server = [r["server_v2v_ms"] for r in results if r.get("server_v2v_ms") is not None]
    with capsys.disabled():
        print(f"\nload: {SESSIONS} sessions x {TURNS} spoken turns, {wall:.0f} s wall, all {len(results)} answered")
        print(
            f"  client voice-to-voice ms: p50 {percentile(client, 0.5):.0f}  p95 {percentile(client, 0.95):.0f}"
            f"  mean {statistics.mean(client):.0f}  max {max(client):.0f}"
        )
        if server:
            print(
                f"  server trace voice_to_voice ms: p50 {percentile(server, 0.5):.0f}  "
                f"p95 {percentile(server, 0.95):.0f}"
            )
        replies = [r["reply_total_ms"] for r in results if r.get("reply_total_ms") is not None]
        if replies:
            print(
                f"  server trace reply_total ms: p50 {percentile(replies, 0.5):.0f}  "
                f"p95 {percentile(replies, 0.95):.0f}  max {max(replies):.0f}"
            )
        print(
            f"  RSS MB: before {rss_start / 2**20:.0f}, after round 1 {first_round / 2**20:.0f}, "
            f"after round {TURNS} {last_round / 2**20:.0f}"
        )
    await assistant.close()
