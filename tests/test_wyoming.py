"""The Wyoming server with the `wyoming` package's own client, on the small real models: describe, streaming
transcription of a generated WAV, synthesis (plain and streaming) that transcribes back, the handle service
(with Home Assistant's conversation ids remembered across connections), failed turns reported as failures,
and bad input on the raw protocol (broken headers, stalled events, a client that stops reading)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
import urllib.request
import wave

import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop, wav_to_chunks
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.handle import Handled
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from audio.resample import resample
from voice.assistant import Assistant
from voice.config import ConfigError
from voice.config_servers import HomeDeviceConfig
from voice.dialog.understanding import Act
from voice.speechset import wer
from voice.transports.wyoming.handler import Gate

from broker import free_port
from serving import serving
from speech import spoken_as

# long enough (about 9 s) for several partial passes while it streams, even on a busy CPU
SENTENCE = (
    "The quick brown fox jumps over the lazy dog near the quiet river bank. "
    "Then it runs home through the green forest before the rain starts."
)


@pytest.fixture(scope="module")
def assistant(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 24
    return Assistant.load_sync(config)


def make_config(assistant, **limits):
    config = assistant.config.model_copy(deep=True)
    config.server.port = free_port()
    config.wyoming.port = free_port()
    for key, value in limits.items():
        section, name = key.split("__")
        setattr(getattr(config, section), name, value)
    return config


@contextlib.asynccontextmanager
async def running(config, assistant):
    """serve() in this process; yields the Wyoming port."""
    async with serving(config, assistant):
        yield config.wyoming.port


async def read_until(client, last: str, timeout: float = 120.0) -> list[Event]:
    out = []
    async with asyncio.timeout(timeout):
        while True:
            event = await client.read_event()
            assert event is not None, f"connection closed before {last!r}; got {[e.type for e in out]}"
            out.append(event)
            if event.type == last:
                return out


def pcm_of(events: list[Event]) -> tuple[np.ndarray, int]:
    starts = [AudioStart.from_event(e) for e in events if AudioStart.is_type(e.type)]
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert len(starts) == 1 and chunks
    return np.frombuffer(b"".join(c.audio for c in chunks), "<i2"), starts[0].rate


@pytest.fixture(scope="module")
def spoken_wav(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("wyoming") / "sentence.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), SENTENCE], check=True)
    return str(path)


async def test_describe_sets_the_streaming_flags(assistant):
    async with running(make_config(assistant), assistant) as port:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event((await read_until(client, "info"))[-1])
    assert info.asr[0].supports_transcript_streaming
    assert info.asr[0].models[0].name == assistant.config.models.stt
    assert info.tts[0].supports_synthesize_streaming
    assert info.tts[0].voices[0].name == assistant.config.models.tts
    assert info.handle[0].supports_handled_streaming


async def test_transcribe_a_wav_with_streaming_chunks(assistant, spoken_wav):
    async with running(make_config(assistant), assistant) as port:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            arrived: list[tuple[float, Event]] = []

            async def reader():
                while (event := await client.read_event()) is not None:
                    arrived.append((time.monotonic(), event))
                    if event.type == "transcript-stop":
                        return

            reading = asyncio.create_task(reader())
            await client.write_event(Transcribe(language="en").event())
            with wave.open(spoken_wav, "rb") as wav:
                rate = wav.getframerate()
                chunk_samples = rate // 10
                await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
                for chunk in wav_to_chunks(wav, samples_per_chunk=chunk_samples):
                    await client.write_event(chunk.event())
                    await asyncio.sleep(0.1)  # real time: the words should stream before the audio ends
            stop_sent = time.monotonic()
            await client.write_event(AudioStop().event())
            await asyncio.wait_for(reading, 60)

    kinds = [e.type for _, e in arrived]
    assert kinds[0] == "transcript-start" and kinds[-2:] == ["transcript", "transcript-stop"], kinds
    chunks = [e.data["text"] for _, e in arrived if e.type == "transcript-chunk"]
    early = [e for t, e in arrived if e.type == "transcript-chunk" and t < stop_sent]
    assert early, f"no transcript-chunk arrived while the audio was still streaming: {kinds}"
    text = Transcript.from_event(next(e for _, e in arrived if e.type == "transcript")).text
    assert "".join(chunks).strip() == text
    assert wer(SENTENCE, text) <= 0.3, text


async def test_synthesize_audio_transcribes_back(assistant):
    text = "The kitchen light is now on."
    async with running(make_config(assistant), assistant) as port:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize(text).event())
            events = await read_until(client, "audio-stop")
    pcm, rate = pcm_of(events)
    assert rate == assistant.tts_sample_rate
    heard = await assistant.stt.transcribe(resample(pcm, rate, 16000))
    assert spoken_as(text, heard), heard


async def test_streaming_synthesis_speaks_each_sentence_once(assistant):
    parts = ["Good morning. The weather", " is sunny today. Have", " a nice day."]
    async with running(make_config(assistant), assistant) as port:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(SynthesizeStart().event())
            for part in parts:
                await client.write_event(SynthesizeChunk(part).event())
            await client.write_event(Synthesize("".join(parts)).event())  # the compatibility copy: ignored
            await client.write_event(SynthesizeStop().event())
            events = await read_until(client, "synthesize-stopped")
    kinds = [e.type for e in events]
    assert kinds.count("audio-start") == 1 and kinds.count("audio-stop") == 1
    assert kinds.index("audio-stop") < kinds.index("synthesize-stopped")
    pcm, rate = pcm_of(events)
    heard = await assistant.stt.transcribe(resample(pcm, rate, 16000))
    assert spoken_as("".join(parts), heard), heard  # spoken once, not twice


async def test_handle_streams_the_reply(assistant):
    async with running(make_config(assistant), assistant) as port:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Transcript("What is the capital of France?").event())
            events = await read_until(client, "handled-stop")
    kinds = [e.type for e in events]
    assert kinds[0] == "handled-start" and kinds[-2:] == ["handled", "handled-stop"]
    chunks = [e.data["text"] for e in events if e.type == "handled-chunk"]
    reply = Handled.from_event(events[-2]).text
    assert chunks and reply.strip()
    assert "".join(chunks).strip().startswith(reply.strip()[:10])


async def test_bad_input_gets_error_events_and_others_keep_working(assistant):
    config = make_config(assistant, server__max_message_bytes=64 * 1024, server__max_turn_audio_s=1.0)
    async with running(config, assistant) as port:
        async with AsyncTcpClient("127.0.0.1", port) as bystander, AsyncTcpClient("127.0.0.1", port) as client:

            async def error_for(*events: Event) -> Error:
                for event in events:
                    await client.write_event(event)
                return Error.from_event((await read_until(client, "error", timeout=30))[-1])

            assert (await error_for(Event("launch-rockets"))).code == "unsupported"
            assert (await error_for(AudioChunk(16000, 2, 1, b"\0" * 320).event())).code == "no_audio_start"
            assert (await error_for(AudioStart(16000, 3, 1).event())).code == "bad_audio_format"
            assert (await error_for(AudioStart(1234567, 2, 1).event())).code == "bad_audio_format"
            assert (await error_for(Event("synthesize", {"text": 5}))).code == "bad_event"
            assert (await error_for(Event("synthesize", {}))).code == "bad_event"
            err = await error_for(AudioStart(16000, 2, 1).event(), AudioChunk(16000, 2, 1, b"\0" * 333).event())
            assert err.code == "bad_audio_format" and "frames" in err.text
            two_seconds = np.zeros(32000, np.int16).tobytes()
            err = await error_for(
                AudioChunk(16000, 2, 1, two_seconds[:20000]).event(),
                AudioChunk(16000, 2, 1, two_seconds[20000:]).event(),
            )
            assert err.code == "audio_too_long" and "max_turn_audio_s" in err.text
            # an oversized event: an error naming the limit, then this connection ends
            err = await error_for(AudioChunk(16000, 2, 1, b"\0" * (128 * 1024)).event())
            assert err.code == "message_too_big" and "max_message_bytes" in err.text
            # the other client never noticed
            await bystander.write_event(Describe().event())
            assert (await read_until(bystander, "info"))[-1].type == "info"


async def test_allow_list_and_exposure_rules(assistant):
    exposed = assistant.config.model_copy(deep=True)
    exposed.wyoming.host = "0.0.0.0"
    with pytest.raises(ConfigError, match="allowed_clients"):
        Gate.check_config(exposed)
    config = make_config(assistant, wyoming__allowed_clients=["10.1.2.0/24"], server__idle_timeout_s=1.0)
    async with running(config, assistant) as port:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            err = Error.from_event((await read_until(client, "error", timeout=10))[-1])
            assert err.code == "not_allowed" and "allowed_clients" in err.text
            assert await client.read_event() is None


async def test_idle_connections_are_closed(assistant):
    config = make_config(assistant, server__idle_timeout_s=1.0)
    async with running(config, assistant) as port:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            err = Error.from_event((await read_until(client, "error", timeout=10))[-1])
            assert err.code == "idle_timeout" and "idle_timeout_s" in err.text
            assert await client.read_event() is None


async def test_client_gone_mid_request_leaks_no_session(assistant):
    async with running(make_config(assistant), assistant) as port:
        baseline = len(assistant._sessions)
        client = AsyncTcpClient("127.0.0.1", port)
        await client.connect()
        await client.write_event(Transcript("Tell me a story about the sea.").event())
        assert (await read_until(client, "handled-chunk"))[-1].type == "handled-chunk"
        await client.disconnect()  # gone in the middle of the reply
        async with AsyncTcpClient("127.0.0.1", port) as other:
            await other.write_event(Synthesize("Still here.").event())
            assert (await read_until(other, "audio-stop"))[-1].type == "audio-stop"
        async with asyncio.timeout(30):
            while len(assistant._sessions) > baseline:
                await asyncio.sleep(0.05)


async def handle(port: int, text: str, conversation_id: str | None = None) -> list[Event]:
    """One handle request on its own connection, as Home Assistant sends it."""
    context = {"conversation_id": conversation_id} if conversation_id else None
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcript(text, context=context).event())
        return await read_until(client, "handled-stop")


def histories_with(assistant, words: str) -> list[list[dict]]:
    """The histories of the open sessions that contain ``words`` in a user message."""
    return [
        s.history for s in assistant._sessions if any(m["role"] == "user" and words in m["content"] for m in s.history)
    ]


async def test_a_conversation_id_keeps_its_history_across_connections(assistant):
    async with running(make_config(assistant), assistant) as port:
        await handle(port, "My name is Ada.", "conversation-1")
        same = await handle(port, "What is my name? Answer with just my name.", "conversation-1")
        other = await handle(port, "What is my name? Answer with just my name.", "conversation-2")
        [history] = histories_with(assistant, "My name is Ada.")
        assert [m["role"] for m in history[-4:]] == ["user", "assistant", "user", "assistant"]
        assert "What is my name?" in history[-2]["content"]  # the second turn saw the first
        assert len(histories_with(assistant, "What is my name?")) == 2  # the other id: a history of its own
        remembered, forgot = Handled.from_event(same[-2]), Handled.from_event(other[-2])
        assert remembered.context == {"conversation_id": "conversation-1"}
        assert "Ada" in remembered.text and "Ada" not in forgot.text, (remembered.text, forgot.text)
    assert not histories_with(assistant, "My name is Ada.")  # closed with the server


async def test_conversations_are_bounded_in_count_and_age(assistant):
    config = make_config(assistant, wyoming__max_conversations=2, wyoming__conversation_idle_s=1.0)
    async with running(config, assistant) as port:
        for n in (1, 2, 3):
            await handle(port, f"Remember the number {n}.", f"c{n}")
        remembered = [n for n in (1, 2, 3) if histories_with(assistant, f"the number {n}.")]
        assert remembered == [2, 3]  # the least recently used one made room
        await asyncio.sleep(1.5)  # longer than conversation_idle_s
        await handle(port, "Remember the number 4.", "c4")
        assert [n for n in (1, 2, 3, 4) if histories_with(assistant, f"the number {n}.")] == [4]


@pytest.fixture
def turns_time_out(assistant):
    """Every new session's turns time out at once (dialog.turn_timeout_s, read when a session is made): a real
    failure of the real pipeline."""
    saved = assistant.config.dialog.turn_timeout_s
    assistant.config.dialog.turn_timeout_s = 0.001
    yield
    assistant.config.dialog.turn_timeout_s = saved


async def test_a_failed_turn_is_reported_as_a_failure(assistant, turns_time_out):
    async with running(make_config(assistant), assistant) as port:
        events = await handle(port, "What is the capital of France?")
        kinds = [e.type for e in events]
        assert "handled" not in kinds and kinds[-2:] == ["not-handled", "handled-stop"], kinds
        error = Error.from_event(next(e for e in events if e.type == "error"))
        assert error.code == "turn_failed" and "timeout" in error.text
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize("The kitchen light is now on.").event())
            events = await read_until(client, "audio-stop")
        error = Error.from_event(next(e for e in events if e.type == "error"))
        assert error.code == "tts_failed" and "timeout" in error.text


async def raw_exchange(port: int, data: bytes, timeout: float = 30.0) -> list[Event]:
    """Send raw bytes, then read events (with the wyoming package's reader) until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = []
    async with asyncio.timeout(timeout):
        while (event := await async_read_event(reader)) is not None:
            out.append(event)
    writer.close()
    return out


@pytest.mark.parametrize(
    "line, problem",
    [
        (b"[1]\n", "must be a JSON object"),
        (b'{"type": 5}\n', '"type" string'),
        (b'{"type": "describe", "data_length": "x"}\n', '"data_length" must be a whole number'),
        (b'{"type": "describe", "payload_length": -1}\n', '"payload_length" must be a whole number'),
        (b"[" * 100000 + b"\n", "too long"),
        (b"[" * 5000 + b"\n", "not valid UTF-8 JSON"),
        (b'{"type": "describe", "data_length": 3}\n[1]', "must be a JSON object"),
        (b'{"type": "describe", "data": "text"}\n', '"data" in the header'),
        (b"\xff\xfe\n", "not valid UTF-8 JSON"),
    ],
)
async def test_a_broken_header_gets_an_error_and_the_connection_closes(assistant, line, problem):
    async with running(make_config(assistant), assistant) as port:
        events = await raw_exchange(port, line)
        assert [e.type for e in events] == ["error"]
        error = Error.from_event(events[0])
        assert error.code in ("bad_header", "message_too_big") and problem in error.text, error
        async with AsyncTcpClient("127.0.0.1", port) as client:  # the server goes on
            await client.write_event(Describe().event())
            assert (await read_until(client, "info"))[-1].type == "info"


async def test_an_event_that_stops_arriving_is_cut_off(assistant):
    config = make_config(assistant, wyoming__read_timeout_s=0.5)
    async with running(config, assistant) as port:
        chunk = b'{"type": "audio-chunk", "data": {"rate": 16000, "width": 2, "channels": 1}, "payload_length": 640}\n'
        data = b'{"type": "synthesize", "data_length": 40}\n{"text": '
        for partial in (chunk + b"\0" * 100, data, b'{"type": "desc'):  # inside the payload, the data, the header
            events = await raw_exchange(port, partial)
            error = Error.from_event(events[-1])
            assert error.code == "read_timeout" and "wyoming.read_timeout_s" in error.text


async def test_a_client_that_stops_reading_is_dropped(assistant):
    config = make_config(assistant, wyoming__write_timeout_s=1.0)
    async with running(config, assistant) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few audio chunks
        sock.connect(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        await async_write_event(Synthesize("The quick brown fox jumps over the lazy dog. " * 40).event(), writer)
        async with asyncio.timeout(60):  # read nothing for longer than write_timeout_s: the slot comes back
            while 'wyoming"} 0.0' not in await asyncio.to_thread(sessions_gauge, config.server.port):
                await asyncio.sleep(0.2)
        kinds = []
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):  # the server aborted it
            async with asyncio.timeout(30):
                while (event := await async_read_event(reader)) is not None:
                    kinds.append(event.type)
        writer.close()
        assert "audio-stop" not in kinds  # cut off, not finished
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            assert (await read_until(client, "info"))[-1].type == "info"


def sessions_gauge(port: int) -> str:
    """The specvoice_sessions lines of /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return "\n".join(
            line for line in response.read().decode().splitlines() if line.startswith("specvoice_sessions{")
        )


async def test_text_from_home_assistants_recogniser_is_read_as_speech(assistant):
    """A `transcript` comes from Home Assistant's own speech recogniser: a device name it heard wrong ("garbage
    door") is guessed as the device it sounds like and asked back, as the microphone's words are; typed words
    (an ask) are never guessed."""
    config = make_config(assistant)
    config.mqtt.devices = [
        HomeDeviceConfig(name="garage door", topic="home/garage/door/set", payloads=["OPEN", "CLOSE"], area="garage")
    ]
    home = Assistant(config, assistant.engine, assistant.stt, assistant.tts, assistant.vad_path)
    async with running(config, home) as port:
        events = await handle(port, "Close my garbage door.")
    handled = Handled.from_event(events[-2])
    assert handled.text.strip() == "Do you want the garage door closed?", handled.text
    assert home.home is not None and home.home.guess("Close my garbage door.") is not None
    assert not isinstance(home.home.understand("Close my garbage door.", [], spoken=False), Act)  # typed
