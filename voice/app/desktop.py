"""`specvoice run`: the home device. Microphone in, speaker out, the state and partial transcripts shown live;
with ``mqtt.enabled`` the MQTT bridge in the same process (``say`` and events spoken on this speaker, ``ask``
answered aloud and on the answer topic, Home Assistant seeing this conversation's state), and with ``--serve``
the websocket API and Wyoming too.

The microphone signal goes through the echo canceller with the exact signal the speaker played over the same
interval (the speaker sink keeps a timestamped record of it, whoever wrote it), so the assistant does not
interrupt itself. The local conversation and the bridge share the speaker through lanes (audio/shared_speaker.py):
the utterance that starts last has it, and the one it cut off is cancelled like a barge-in.
Under systemd (``Type=notify``) it reports READY once the models are loaded and the devices open, and pings the
watchdog. SIGTERM or Ctrl-C stops cleanly: the reply is cancelled, the streams closed, MQTT told "offline".
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import numpy as np

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.shared_speaker import SharedSpeaker
from audio.sinks import SpeakerSink
from audio.sources import MicSource
from voice.assistant import Assistant
from voice.events import (
    ActionRequested,
    Event,
    StateChanged,
    TranscriptFinal,
    TranscriptPartial,
    TurnDone,
    TurnError,
)
from voice.memory import settle_after_load
from voice.sdnotify import notify, watchdog, watchdog_interval
from voice.tasks import cancel_and_wait, start


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
            self.print(
                f"           voice-to-voice {stages.get('voice_to_voice', '-')} ms; "
                f"over budget: {', '.join(event.trace.get('over_budget', [])) or 'none'}"
            )
        elif isinstance(event, TurnError):
            self.print(f"error in {event.stage}: {event.message}")
        elif isinstance(event, ActionRequested):
            outcome = "sent" if event.allowed else "refused " + event.reason
            self.print(f"action {event.topic} {event.payload}: {outcome}")


async def _listen(mic: MicSource, sink: SpeakerSink, session) -> None:
    async for chunk in mic:
        duration = len(chunk.samples) / SPEECH_RATE
        played = sink.played_reference(chunk.t, chunk.t + duration)
        reference = None
        if played is not None and np.any(played):
            reference = resample(played, sink.sample_rate, SPEECH_RATE)
            reference = np.pad(reference, (0, max(0, len(chunk.samples) - len(reference))))[: len(chunk.samples)]
        await session.push_audio(chunk.samples, chunk.t, reference=reference)


def _services(
    config, assistant: Assistant, speaker: SharedSpeaker, session, serve_too: bool, stop: asyncio.Event
) -> list[asyncio.Task]:
    """The MQTT bridge (on its own lane of the speaker) and, with ``serve_too``, the servers."""
    bridge = None
    if config.mqtt.enabled:
        from voice.transports.mqtt.bridge import MqttBridge

        bridge = MqttBridge(config, assistant, sink=speaker.lane())
        bridge.sink.on_preempted = bridge.preempted
        bridge.add_local(session)
        if (wake := session.listener.wake) is not None:
            wake.on_wake = lambda name: bridge.publish_event("wake_word", session=session.id, wake_word=name)
    if serve_too:  # serve() reports READY and pings the watchdog itself
        from voice.server import serve

        return [start(serve(config, assistant=assistant, stop=stop, mqtt=bridge), name="serve")]
    tasks = []
    if bridge is not None:
        tasks.append(start(bridge.run(), name="mqtt bridge"))
    if watchdog_interval() is not None:
        tasks.append(start(watchdog(), name="sd watchdog"))
    notify("READY=1")
    notify("STATUS=listening" + (f"; mqtt {config.mqtt.host}:{config.mqtt.port}" if bridge else ""))
    return tasks


async def home(config, serve_too: bool = False) -> int:
    print("loading models ...", flush=True)
    notify("STATUS=loading models")
    if serve_too:
        from voice.server import check_exposure

        check_exposure(config)
    assistant = await Assistant.load(config)
    settle_after_load()  # the models stay until exit: see voice/memory.py
    audio = config.audio
    sink = SpeakerSink(audio.output_device, assistant.tts_sample_rate, block_ms=audio.block_ms, latency=audio.latency)
    mic = MicSource(audio.input_device, block_ms=audio.block_ms, rate=SPEECH_RATE, latency=audio.latency)
    speaker = SharedSpeaker(sink)
    status = StatusLine()
    lane = speaker.lane()
    session = assistant.session(status, sink=lane, name="local")
    session.listener.wake = assistant.wake_word()  # a device on a shelf must not answer the television
    lane.on_preempted = lambda: assistant.spawn(session.cancel())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = _services(config, assistant, speaker, session, serve_too, stop)
    listening = start(_listen(mic, sink, session), name="microphone")
    print("listening; speak, or Ctrl-C to quit", flush=True)
    stopping = start(stop.wait(), name="stop")
    try:
        done, _ = await asyncio.wait({listening, stopping, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stopping}:
            task.result()  # a service that ended by itself: its error ends the device (exit 2 if bad input)
    finally:
        notify("STOPPING=1")
        stop.set()  # serve() stops by itself on it, finishing its connections within the grace
        with contextlib.suppress(Exception):
            async with asyncio.timeout(config.server.shutdown_grace_s + 5):
                await cancel_and_wait(listening, stopping, *(t for t in tasks if t.get_name() != "serve"))
                await asyncio.gather(*tasks, return_exceptions=True)
        mic.close()
        await session.close()
        sink.close()
        await assistant.close()
        status.print("bye")
    return 0


def main(config, args, extra) -> int:
    try:
        return asyncio.run(home(config, serve_too=getattr(args, "serve", False)))
    except KeyboardInterrupt:
        return 0
