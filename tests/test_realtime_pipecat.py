"""pipecat's OpenAI Realtime service (pipecat-ai 1.14, a stock client no one here wrote) against serve() on the
small models, in a minimal pipeline with no transport: a context aggregator pair around the service, an
LLMRunFrame for the first reply, an InterruptionFrame while that reply's audio streams (pipecat sends
conversation.item.truncate), a mid-session system message (pipecat sends it as a `system` item), then a second
turn spoken as InputAudioRawFrames (server VAD).

Why it matters: pipecat treats every server `error` except two codes as fatal (it logs an ERROR and stops
reading), validates every known server event with its own models, holds response.create until session.updated,
and needs conversation.item.added to echo its own item ids. Before this server supported truncate and system
items, pipecat died at the first barge-in.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest
from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMMessagesAppendFrame,
    LLMRunFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.runner import PipelineRunner  # noqa: E402
from pipecat.pipeline.task import PipelineTask  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.realtime import events as pipecat_events  # noqa: E402
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService  # noqa: E402

from voice.assistant import Assistant
from voice.speechset import espeak_utterance, wer
from voice.transports.realtime.wire import WIRE_RATE

from broker import free_port
from serving import serving

TOKEN = "pipecat-test-token"
RULE = "Answer in one short sentence."


@pytest.fixture(scope="module")
def assistant(small_config):
    return Assistant.load_sync(small_config)


class Frames(FrameProcessor):
    """Keeps every frame that passes (one instance each side of the service: upstream frames such as
    TranscriptionFrame and ErrorFrame go towards the user aggregator)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, str, Frame]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.seen.append((time.monotonic(), type(frame).__name__, frame))
        await self.push_frame(frame, direction)

    def named(self, name: str, since: int = 0) -> list[Any]:
        return [f for _, n, f in self.seen[since:] if n == name]

    def audio_s(self, since: int = 0) -> float:
        return sum(len(f.audio) for f in self.named("TTSAudioRawFrame", since)) / (2 * WIRE_RATE)


async def wait_until(check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


async def test_pipecat_realtime_service_survives_a_barge_in(assistant, monkeypatch):
    config = assistant.config.model_copy(deep=True)
    config.server.port, config.server.token, config.wyoming.enabled = free_port(), TOKEN, False
    received: list[dict] = []
    parse = pipecat_events.parse_server_event

    def recording_parse(text):  # every server event pipecat reads, raw (pipecat's own parser runs)
        received.append(json.loads(text))
        return parse(text)

    def kinds(kind: str) -> list[dict]:
        return [e for e in received if e["type"] == kind]

    monkeypatch.setattr(pipecat_events, "parse_server_event", recording_parse)
    async with serving(config, assistant):
        llm = OpenAIRealtimeLLMService(api_key=TOKEN, base_url=f"ws://127.0.0.1:{config.server.port}/v1/realtime")
        context = LLMContext([{"role": "user", "content": "Tell me a long story about a dragon and a knight."}])
        pair = LLMContextAggregatorPair(context)
        up, down = Frames(), Frames()
        task = PipelineTask(Pipeline([pair.user(), up, llm, down, pair.assistant()]), enable_rtvi=False)
        run = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        try:
            await task.queue_frames([LLMRunFrame()])
            await wait_until(lambda: down.audio_s() >= 1.5, 120)
            assert down.audio_s() >= 1.5, "no reply audio from the first turn"
            first_audio = next(t for t, n, _ in down.seen if n == "TTSAudioRawFrame")
            await asyncio.sleep(max(0.0, first_audio + 1.2 - time.monotonic()))  # "played" for 1.2 s (wall clock)
            session = next(iter(assistant._sessions))
            await task.queue_frames([InterruptionFrame()])  # pipecat sends conversation.item.truncate
            await wait_until(lambda: kinds("conversation.item.truncated"), 30)
            await wait_until(lambda: kinds("response.done"), 120)
            # straight into the service (the user aggregator would keep it in its own context)
            await up.push_frame(LLMMessagesAppendFrame([{"role": "system", "content": RULE}], run_llm=False))
            await wait_until(lambda: any(m["content"] == RULE for m in session.history), 30)
            mark = len(down.seen)

            question = "What is your name?"
            speech = np.concatenate(
                [
                    np.zeros(WIRE_RATE // 5, np.int16),
                    espeak_utterance(question, WIRE_RATE),
                    np.zeros(int(1.5 * WIRE_RATE), np.int16),
                ]
            )
            for i in range(0, len(speech), WIRE_RATE // 10):  # 100 ms frames, twice real time
                await task.queue_frames(
                    [
                        InputAudioRawFrame(
                            audio=speech[i : i + WIRE_RATE // 10].tobytes(), sample_rate=WIRE_RATE, num_channels=1
                        )
                    ]
                )
                await asyncio.sleep(0.05)
            await wait_until(lambda: down.named("LLMFullResponseEndFrame", mark) and down.audio_s(mark) > 0, 120)
        finally:
            await task.queue_frames([EndFrame()])
            await asyncio.wait_for(run, 30)

    errors = [e["error"] for e in received if e["type"] == "error"]
    assert errors == [], errors  # any other error code is fatal to pipecat
    assert not up.named("ErrorFrame"), [str(f.error) for f in up.named("ErrorFrame")]
    # the barge-in: pipecat truncated the first reply's item at what it had played, and the history kept that much
    first = kinds("response.done")[0]["response"]
    item_id = first["output"][0]["id"]
    truncated = kinds("conversation.item.truncated")[0]
    assert truncated["item_id"] == item_id and truncated["audio_end_ms"] >= 1000
    full = "".join(e["delta"] for e in kinds("response.output_audio_transcript.delta") if e["item_id"] == item_id)
    kept = next(m["content"] for m in session.history if m["role"] == "assistant")
    assert kept and full.startswith(kept) and len(kept.split()) < len(full.split()), (kept, full)
    # response.done tells what the reply was when it ended: cut at what was heard when the truncate came first, whole
    # when the reply had ended before it (the Realtime API's order; conversation.item.truncated then cuts it)
    cut_first = received.index(truncated) < received.index(kinds("response.done")[0])
    assert first["output"][0]["content"][0]["transcript"] == (kept if cut_first else full)
    # pipecat's own item ids came back (it tells its items from the model's by them); the system item was taken
    roles = [m["role"] for m in session.history]
    assert roles[:4] == ["system", "user", "assistant", "system"], roles
    # the second, spoken turn was heard and answered aloud
    heard = [f.text for f in up.named("TranscriptionFrame")]
    assert heard and wer(question, heard[-1]) <= 0.34, heard
    assert down.audio_s(mark) >= 0.5
    assert kinds("response.done")[-1]["response"]["usage"]["output_tokens"] > 0
