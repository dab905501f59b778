"""Spoken turns from WAV files: a question played into a session like a microphone, and its answer awaited.

Shared by ``specvoice demo``, the benchmarks and the tests, so all of them drive the same path a microphone
takes (real-time paced blocks -> the session's Listener -> a Turn).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.sources import WavSource
from audio.wavfile import write_wav
from voice.events import Event, TurnDone, TurnError
from voice.latency import LatencyTrace


def synthesize_question(assistant: Any, text: str, path: Path) -> Path:
    """Speak ``text`` with the assistant's own voice into a 16 kHz WAV (a stand-in for a recorded question)."""
    pcm = np.concatenate(list(assistant.tts.synthesize(text)))
    write_wav(path, resample(pcm, assistant.tts_sample_rate, SPEECH_RATE), SPEECH_RATE)
    return path


async def run_turn(
    session: Any,
    wav: Path,
    done: asyncio.Queue[Any],
    *,
    realtime: bool = True,
    block_ms: int = 20,
    tail_silence_ms: int = 1500,
    timeout_s: float = 300.0,
) -> TurnDone | None:
    """Play ``wav`` into the session like a microphone (then silence, so the VAD ends the turn) and wait for the
    turn to finish; ``done`` receives the session's TurnDone / TurnError events."""
    await play(session, wav, realtime=realtime, block_ms=block_ms, tail_silence_ms=tail_silence_ms)
    return await turn_ended(done, timeout_s)


async def play(
    session: Any, wav: Path, *, realtime: bool = True, block_ms: int = 20, tail_silence_ms: int = 1500
) -> float:
    """Play ``wav`` into the session like a microphone, then ``tail_silence_ms`` of silence; returns the audio
    clock's time of the file's first sample."""
    source = WavSource(wav, block_ms=block_ms, realtime=realtime, tail_silence_ms=tail_silence_ms)
    async for chunk in source:
        await session.push_audio(chunk.samples, chunk.t)
    assert source.start_t is not None  # set by the first block
    return source.start_t


def ends_into(finished: asyncio.Queue[Event | None]) -> Callable[[Event], None]:
    """An event handler that passes the end of each turn (done or failed) into ``finished``."""

    def handle(event: Event) -> None:
        if isinstance(event, (TurnDone, TurnError)):
            finished.put_nowait(event)

    return handle


async def turn_ended(done: asyncio.Queue[Any], timeout_s: float = 300.0) -> TurnDone | None:
    """The session's next TurnDone from ``done``; None when the turn failed (reported on stderr) or ended."""
    async with asyncio.timeout(timeout_s):
        while True:
            event = await done.get()
            if isinstance(event, TurnDone):
                return event
            if isinstance(event, TurnError):
                print(f"  turn failed in {event.stage}: {event.message}", file=sys.stderr)
                return None
            if event is None:
                return None


def trace_from(done: TurnDone, budget: dict[str, float]) -> LatencyTrace:
    """Rebuild a LatencyTrace (for the table) from the plain dict a TurnDone carries."""
    trace = LatencyTrace(done.turn_id, budget_ms=budget)
    trace.marks = {k: v / 1000.0 for k, v in done.trace["marks_ms"].items()}
    return trace
