"""Remote speech over Wyoming (stt.backend / tts.backend = "wyoming"): a thin front-end that keeps only the VAD
transcribes on, and speaks with, another specvoice serving Wyoming, started in this process on the small config
(the peer: real Whisper, real piper, our real Wyoming server)."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.sinks import WavSink
from voice.assistant import Assistant
from voice.events import ReplyAudio, State, TurnError
from voice.remote.speech import RemoteSpeechToText, RemoteTextToSpeech
from voice.speechset import piper_utterance

from broker import free_port
from serving import serving
from test_pipeline import Mic, Recorder

# no comma: piper pauses at one, and Smart Turn rightly calls "What is the capital of France" complete there
QUESTION = "What is the capital of France and when is the best time of the year to go there?"


@pytest.fixture(scope="module")
def peer_assistant(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 24
    return Assistant.load_sync(config)


@contextlib.asynccontextmanager
async def peer(peer_assistant, port: int | None = None):
    """The peer's ``serve()`` with Wyoming on ``port``; yields its tcp:// uri."""
    config = peer_assistant.config.model_copy(deep=True)
    config.server.port, config.wyoming.port = free_port(), port or free_port()
    async with serving(config, peer_assistant):
        yield f"tcp://127.0.0.1:{config.wyoming.port}"


async def thin(peer_assistant, stt_uri: str, tts_uri: str) -> Assistant:
    """A front-end with VAD here and speech at the given Wyoming servers (sharing the peer's LLM, to save memory).
    The tts asks the server for its rate at load, so it is built off the event loop the peer runs on."""
    config = peer_assistant.config.model_copy(deep=True)
    config.stt.uri, config.tts.uri = stt_uri, tts_uri
    config.stt.backend = config.tts.backend = "wyoming"
    config.stt.timeout_s = config.tts.timeout_s = 30.0  # a busy 2-core machine
    tts = await asyncio.to_thread(RemoteTextToSpeech, config.tts)
    return Assistant(config, peer_assistant.engine, RemoteSpeechToText(config.stt), tts, peer_assistant.vad_path)


async def test_thin_front_end_hears_and_speaks_over_wyoming(peer_assistant):
    async with peer(peer_assistant) as uri:
        front = await thin(peer_assistant, uri, uri)
        assert front.tts.sample_rate == peer_assistant.tts.sample_rate and front.tts.language == "en_US"
        passes = peer_assistant.stt.passes
        rec, sink = Recorder(), WavSink(None, front.tts_sample_rate, realtime=False)
        session = front.session(rec, sink=sink)
        mic = Mic(session)
        await mic.play(piper_utterance(QUESTION, deterministic=True))
        await mic.silence(1.0)
        done = await rec.turn_done()
        assert done is not None and not done.interrupted
        assert "capital" in done.transcript.lower() and "france" in done.transcript.lower()
        assert peer_assistant.stt.passes > passes, "Whisper ran on the peer"
        assert front.stt.passes == 1 and front.tts.chunks_made > 0
        assert rec.of(ReplyAudio) and all(e.sample_rate == front.tts_sample_rate for e in rec.of(ReplyAudio))
        pcm = resample(sink.audio, front.tts_sample_rate, SPEECH_RATE).astype(np.float32) / 32768.0
        assert len(peer_assistant.stt.decode(pcm)) >= 2, "the peer's voice says words"
        assert "playback_start" in done.trace["marks_ms"] and "stt_final" in done.trace["marks_ms"]
        await session.close()
        sink.close()


async def test_remote_tts_closed_early_closes_its_connection(peer_assistant):
    async with peer(peer_assistant) as uri:
        front = await thin(peer_assistant, uri, uri)
        stream = front.tts.stream("One. Two. Three. Four. Five. Six. Seven. Eight. Nine. Ten.")
        first = await anext(stream)
        assert first.dtype == np.int16 and len(first) > 0
        assert peer_assistant._sessions, "the peer is speaking for us"
        await stream.aclose()  # a barge-in: the connection closes, and the peer's session with it
        async with asyncio.timeout(30):
            while peer_assistant._sessions:
                await asyncio.sleep(0.05)


async def test_remote_stt_down_is_an_stt_turn_error_and_the_session_goes_on(peer_assistant):
    async with peer(peer_assistant) as uri:
        dead = f"tcp://127.0.0.1:{free_port()}"
        front = await thin(peer_assistant, dead, uri)
        rec = Recorder()
        session = front.session(rec)
        mic = Mic(session)
        await mic.play(piper_utterance("Hello there.", deterministic=True))
        await mic.silence(1.0)
        await rec.wait_for(lambda e: isinstance(e, TurnError))
        error = rec.of(TurnError)[0]
        assert error.stage == "stt" and dead in error.message and "fix:" in error.message
        assert session.state == State.IDLE
        assert await session.ask("Say hi.", speak=False), "the session still answers"
        await session.close()


async def test_remote_stt_sends_the_whole_utterance_again_when_the_server_came_back(peer_assistant):
    port = free_port()
    front = await thin(peer_assistant, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}")
    stream = front.stt.stream()  # connects now, to nothing: the speech server is restarting
    stream.add(piper_utterance("The quick brown fox jumps over the lazy dog.", deterministic=True))
    async with peer(peer_assistant, port):
        text = await stream.final()
    assert "fox" in text.lower() and "dog" in text.lower()
