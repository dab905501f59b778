"""`specvoice run`: desktop mode. Microphone in, speaker out, the state and partial transcripts shown live.

The microphone signal goes through the echo suppressor with the exact signal the speaker played over the same
interval (the speaker sink keeps a timestamped record of it), so the assistant does not interrupt itself.
Ctrl-C stops cleanly: the reply is cancelled, the streams are closed.
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np

from audio.resample import resample
from audio.sinks import SpeakerSink
from audio.sources import MicSource
from audio.frames import SPEECH_RATE as MIC_RATE
from voice.assistant import Assistant
from voice.events import (ActionRequested, Event, StateChanged, TranscriptFinal, TranscriptPartial, TurnDone,
                          TurnError)


class StatusLine:
    """One live line on a terminal: state and the partial transcript; finished turns scroll above it."""

    def __init__(self, stream=sys.stdout) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.state = "idle"

    def show(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text[:200])
            self.stream.flush()

    def print(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()

    def __call__(self, event: Event) -> None:
        if isinstance(event, StateChanged):
            self.state = event.state.value
            self.show(f"[{self.state}]")
        elif isinstance(event, TranscriptPartial):
            self.show(f"[{self.state}] {event.text}")
        elif isinstance(event, TranscriptFinal):
            self.print(f"you:       {event.text}")
        elif isinstance(event, TurnDone):
            stages = event.trace.get("stages_ms", {})
            flag = " (interrupted)" if event.interrupted else ""
            self.print(f"assistant: {event.reply}{flag}")
            self.print(f"           voice-to-voice {stages.get('voice_to_voice', '-')} ms; "
                       f"over budget: {', '.join(event.trace.get('over_budget', [])) or 'none'}")
        elif isinstance(event, TurnError):
            self.print(f"error in {event.stage}: {event.message}")
        elif isinstance(event, ActionRequested):
            self.print(f"action {event.topic} {event.payload}: {'sent' if event.allowed else 'refused ' + event.reason}")


async def desktop(config) -> int:
    print("loading models ...", flush=True)
    assistant = await Assistant.load(config)
    audio = config.audio
    sink = SpeakerSink(audio.output_device, assistant.tts_sample_rate, block_ms=audio.block_ms, latency=audio.latency)
    mic = MicSource(audio.input_device, block_ms=audio.block_ms, rate=MIC_RATE, latency=audio.latency)
    status = StatusLine()
    session = assistant.session(status, sink=sink, name="desktop")
    print("listening; speak, or Ctrl-C to quit", flush=True)
    try:
        async for chunk in mic:
            duration = len(chunk.samples) / MIC_RATE
            played = sink.played_reference(chunk.t, chunk.t + duration)
            reference = None
            if played is not None and np.any(played):
                reference = resample(played, sink.sample_rate, MIC_RATE)
                reference = np.pad(reference, (0, max(0, len(chunk.samples) - len(reference))))[:len(chunk.samples)]
            await session.push_audio(chunk.samples, chunk.t, reference=reference)
    finally:
        mic.close()
        await session.close()
        sink.close()
        status.print("bye")
    return 0


def main(config, args, extra) -> int:
    try:
        return asyncio.run(desktop(config))
    except KeyboardInterrupt:
        return 0
