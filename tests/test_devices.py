"""Real audio devices through a private PulseAudio server with a null sink (no sound card needed): what the
speaker path plays comes back on the microphone path, on the same clock, and a flush silences it.

The server is started per module with its own runtime folder and socket, so it never touches another
PulseAudio on the machine; sounddevice is re-initialised to see it.
"""

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import sounddevice as sd

from audio.devices import DeviceError, find_device, list_devices
from audio.resample import resample
from audio.sinks import SpeakerSink
from audio.sources import MicSource
from voice.hearing.stt import SpeechToText
from voice.models import resolve
from voice.speaking.tts import TextToSpeech

from speech import spoken_as

LATENCY = 0.25  # device buffering: enough for a busy shared 2-core test machine (load 8) not to underflow
CLOCKS = 0.15  # how closely the capture and playback streams' timestamps agree through PulseAudio


@contextlib.contextmanager
def private_pulse(run: Path, sinks: tuple[str, ...]):
    """A PulseAudio server of its own (socket and state in ``run``) with one null sink per name, made the
    process's server for the time being; the first sink and its monitor are the defaults."""
    run.mkdir(exist_ok=True)
    socket = run / "native"
    env = {"PULSE_RUNTIME_PATH": str(run), "PULSE_STATE_PATH": str(run), "PULSE_SERVER": f"unix:{socket}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    subprocess.run(
        [
            "pulseaudio",
            "--daemonize=yes",
            "--exit-idle-time=-1",
            "-n",
            *(f"--load=module-null-sink sink_name={name}" for name in sinks),
            f"--load=module-native-protocol-unix socket={socket}",
            "--load=module-always-sink",
        ],
        check=True,
        capture_output=True,
    )
    for _ in range(50):
        if subprocess.run(["pactl", "info"], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    subprocess.run(["pactl", "set-default-sink", sinks[0]], check=True)
    subprocess.run(["pactl", "set-default-source", f"{sinks[0]}.monitor"], check=True)
    sd._terminate()
    sd._initialize()
    try:
        yield run
    finally:
        pid = int((run / "pid").read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def pulse(tmp_path_factory):
    with private_pulse(tmp_path_factory.mktemp("pulse"), ("spk",)) as run:
        yield run


@pytest.fixture(scope="module")
def voice(small_config):
    return TextToSpeech(resolve(small_config.models.tts, "tts"), small_config.tts)


async def capture(mic: MicSource, until: asyncio.Event, chunks: list) -> None:
    async for chunk in mic:
        chunks.append(chunk)
        if until.is_set():
            break


async def play(sink: SpeakerSink, voice: TextToSpeech, text: str) -> None:
    sink.begin_utterance()
    async for pcm in voice.stream(text):
        await sink.write(resample(pcm, voice.sample_rate, sink.sample_rate))


def loud_span(audio, rate, t0, level=1000):
    """Monotonic times of the first and last sample above ``level`` in ``audio`` that starts at ``t0``."""
    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) > level)
    return t0 + loud[0] / rate, t0 + (loud[-1] + 1) / rate


async def started(mic_chunks: list) -> None:
    """Wait until the capture stream runs steadily (PulseAudio's monitor source starts with a burst)."""
    while not mic_chunks:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)


def test_devices_are_listed_and_found_by_name_or_index(pulse):
    names = [d.name for d in list_devices()]
    assert "pulse" in names
    index = find_device("pulse", "output")
    assert find_device(index, "input") == index and find_device(str(index), "output") == index
    assert find_device("PULS", "input") == index  # a unique case-insensitive part of the name
    assert find_device(None, "input") is None


def test_a_missing_device_is_a_clear_error(pulse):
    with pytest.raises(DeviceError, match=r"no audio input device named 'usb mic'; fix: .*'pulse'"):
        MicSource("usb mic")
    with pytest.raises(DeviceError, match=r"output device index 99 does not exist.*available: .*'pulse'"):
        SpeakerSink(99)


async def test_speaker_to_microphone_round_trip_transcribes_back(pulse, voice, small_config):
    text = "Please open the garage door and turn off the heating."
    sink = SpeakerSink("pulse", voice.sample_rate, block_ms=20, latency=LATENCY)
    mic = MicSource("pulse", rate=16000, block_ms=20, latency=LATENCY)
    done, chunks = asyncio.Event(), []
    recorder = asyncio.create_task(capture(mic, done, chunks))
    try:
        await started(chunks)
        await play(sink, voice, text)
        await sink.drain()
        await asyncio.sleep(0.4)
        done.set()
        await asyncio.wait_for(recorder, 5)
    finally:
        sink.close()
        mic.close()
    audio = np.concatenate([c.samples for c in chunks])
    stt = SpeechToText(resolve(small_config.models.stt, "stt"), small_config.stt)
    heard = await stt.transcribe(audio)
    assert spoken_as(text, heard), heard
    # both sides stamp samples on time.monotonic(): the sentence is heard when the sink's reference ring says
    # it was played, and for as long
    t0 = sink.first_audible_t
    played = sink.played_reference(t0, t0 + sink.played_samples / sink.sample_rate)
    played_start, played_end = loud_span(played, sink.sample_rate, t0)
    heard_start, heard_end = loud_span(audio, 16000, chunks[0].t)
    assert heard_start - played_start == pytest.approx(0.0, abs=CLOCKS)
    assert heard_end - heard_start == pytest.approx(played_end - played_start, abs=0.1)
    assert mic.dropped == 0


async def test_flush_mid_sentence_stops_the_sound_within_one_block(pulse, voice):
    text = "This is a long sentence that keeps going for quite a while so that we can interrupt it midway."
    sink = SpeakerSink("pulse", voice.sample_rate, block_ms=20, latency=LATENCY)
    mic = MicSource("pulse", rate=16000, block_ms=20, latency=LATENCY)
    done, chunks = asyncio.Event(), []
    recorder = asyncio.create_task(capture(mic, done, chunks))
    try:
        await started(chunks)
        await play(sink, voice, text)  # queues up to the sink's buffer limit, then keeps feeding
        while sink.first_audible_t is None or time.monotonic() < sink.first_audible_t + 0.8:
            await asyncio.sleep(0.01)
        sink.flush()
        at_flush, flush_t = sink.played_samples, time.monotonic()
        await asyncio.sleep(0.6)
        done.set()
        await asyncio.wait_for(recorder, 5)
    finally:
        sink.close()
        mic.close()
    assert sink.played_samples - at_flush <= sink.block  # at most the block already in the callback
    _, last_loud = loud_span(np.concatenate([c.samples for c in chunks]), 16000, chunks[0].t)
    # the last block handed over sounds at most one block after the flush (plus the device's fixed lead) ...
    assert sink.last_play_end <= flush_t + sink.device_lead + sink.block_s + 0.01
    # ... and the microphone hears the sound stop when that block ends (to within the two streams' clock
    # agreement, the same 150 ms as in the round trip)
    assert last_loud <= sink.last_play_end + CLOCKS
    assert last_loud >= flush_t - 0.3  # it was still speaking when flushed


@pytest.fixture
def usb_device(tmp_path):
    """A home device's one sound card, on a PulseAudio server of its own: the test unplugs it (unloads its null
    sink: PulseAudio's stand-in sink takes the streams) and plugs it back (loads it again)."""
    saved = {k: os.environ.get(k) for k in ("PULSE_SINK", "PULSE_SOURCE")}
    os.environ.update({"PULSE_SINK": "usb", "PULSE_SOURCE": "usb.monitor"})  # chosen by name, as the home device
    try:
        with private_pulse(tmp_path / "pulse", ("usb",)):
            yield [module_of("usb")]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def module_of(sink: str) -> str:
    modules = subprocess.run(["pactl", "list", "short", "modules"], check=True, capture_output=True, text=True)
    return next(line.split()[0] for line in modules.stdout.splitlines() if f"sink_name={sink}" in line)


def plug() -> str:
    return subprocess.run(
        ["pactl", "load-module", "module-null-sink", "sink_name=usb"], check=True, capture_output=True, text=True
    ).stdout.strip()


async def until(condition, timeout: float, state) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {state()}"
        await asyncio.sleep(0.1)


async def heard_sentence(sink: SpeakerSink, mic_chunks: list, voice: TextToSpeech, text: str, stt) -> str:
    """Play ``text`` on the speaker and transcribe what the microphone caught meanwhile."""
    first = len(mic_chunks)
    await play(sink, voice, text)
    await sink.drain()
    await asyncio.sleep(0.5)
    return await stt.transcribe(np.concatenate([c.samples for c in mic_chunks[first:]]))


class RoundTrip:
    """A speaker and a microphone on the ``pulse`` device, the microphone recorded all along: a sentence played
    on one is transcribed from the other (``heard``)."""

    TEXT = "Please open the garage door and turn off the heating."

    def __init__(self, voice: TextToSpeech, small_config) -> None:
        self.voice = voice
        self.stt = SpeechToText(resolve(small_config.models.stt, "stt"), small_config.stt)
        self.sink = SpeakerSink("pulse", voice.sample_rate, block_ms=20, latency=LATENCY)
        self.mic = MicSource("pulse", rate=16000, block_ms=20, latency=LATENCY)
        self.chunks: list = []
        self._done = asyncio.Event()
        self._recorder = asyncio.create_task(capture(self.mic, self._done, self.chunks))

    async def heard(self) -> str:
        await started(self.chunks)
        return await heard_sentence(self.sink, self.chunks, self.voice, self.TEXT, self.stt)

    def state(self) -> dict:
        return {w.what: (w.recoveries, w.lost, w.blocks) for w in (self.sink.watch, self.mic.watch)}

    async def close(self) -> None:
        self._done.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._recorder, 5)
        self.sink.close()
        self.mic.close()


async def test_a_device_unplugged_and_plugged_back_is_heard_again(usb_device, voice, small_config):
    """The home device's one card goes away (its null sink and monitor unloaded: PulseAudio's stand-in sink
    takes the streams) and comes back: the same sentence goes round once more, and the streams never stopped
    the process (PulseAudio's ALSA plugin, or the watch, opened them on the card again)."""
    trip = RoundTrip(voice, small_config)
    try:
        assert spoken_as(trip.TEXT, await trip.heard())
        await asyncio.sleep(4)  # past the watch's grace for a stream just opened
        subprocess.run(["pactl", "unload-module", usb_device[0]], check=True, capture_output=True)
        await asyncio.sleep(3)
        usb_device[0] = plug()
        await until(lambda: not trip.sink.lost and not trip.mic.watch.lost, 30, trip.state)
        await asyncio.sleep(2)  # the reopened monitor's first burst
        heard = await trip.heard()
        assert spoken_as(trip.TEXT, heard), (heard, trip.state())
    finally:
        await trip.close()


async def test_streams_portaudio_stopped_are_opened_again(pulse, voice, small_config):
    """When a device behind ALSA goes away, PortAudio ends the stream: no more callbacks. Both streams are
    stopped that way under the source and the sink; their watches notice, open them again, and a sentence goes
    round."""
    trip = RoundTrip(voice, small_config)
    try:
        await started(trip.chunks)
        await asyncio.sleep(5)  # past the watch's grace for a stream just opened
        trip.sink._slot.stream.stop()
        trip.mic._slot.stream.stop()
        await until(lambda: trip.sink.watch.recoveries == 1 and trip.mic.watch.recoveries == 1, 30, trip.state)
        assert not trip.sink.lost and not trip.mic.watch.lost
        await asyncio.sleep(3)  # the reopened monitor's first burst
        heard = await trip.heard()
        assert spoken_as(trip.TEXT, heard), (heard, trip.state())
    finally:
        await trip.close()
