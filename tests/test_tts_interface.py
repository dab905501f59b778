"""The TTS engine sits behind voice.ports.SpeechSynthesizer, so an engine under a permissive licence can replace
piper (GPL-3.0): both shipped engines fit the interface, and an engine with no piper code at all speaks a real
session's `say` and `ask` (the small LLM's reply) through the unchanged turn, sink and history code."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from audio.sinks import WavSink
from voice.assistant import Assistant
from voice.models import resolve
from voice.ports import SpeechSynthesizer
from voice.remote.speech import RemoteTextToSpeech
from voice.speaking.tts import TextToSpeech

WORD_S = 0.1


class ToneVoice:
    """A stand-in engine (a fake for the voice itself, not for the interface under test): one 100 ms tone per
    word, at a sample rate piper never uses, so the audio that comes out can only have come from here."""

    sample_rate = SPEECH_RATE
    language = "en_GB"

    def __init__(self) -> None:
        self.fragments: list[str] = []

    def synthesize(self, text: str, stop: threading.Event | None = None) -> list[np.ndarray]:
        t = np.arange(int(SPEECH_RATE * WORD_S)) / SPEECH_RATE
        tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
        return [tone.copy() for _ in text.split()]

    async def stream(self, fragment: str) -> AsyncIterator[np.ndarray]:
        self.fragments.append(fragment)
        for pcm in self.synthesize(fragment):
            yield pcm


def test_both_shipped_engines_and_a_stand_in_fit_the_interface(small_config):
    piper = TextToSpeech(resolve(small_config.models.tts, "tts"), small_config.tts)
    assert isinstance(piper, SpeechSynthesizer) and piper.language == "en_US"
    assert isinstance(ToneVoice(), SpeechSynthesizer)
    for member in ("stream", "synthesize"):
        assert callable(getattr(RemoteTextToSpeech, member))
    assert not isinstance(object(), SpeechSynthesizer)


@pytest.fixture
async def tone_assistant(small_config):
    loaded = await Assistant.load(small_config)
    voice = ToneVoice()
    assistant = Assistant(
        small_config, loaded.engine, loaded.stt, voice, loaded.vad_path, loaded.wake_dir, loaded.workers
    )
    yield assistant, voice
    await assistant.close()


async def test_a_stand_in_engine_speaks_say_and_ask(tone_assistant):
    assistant, voice = tone_assistant
    assert assistant.tts_sample_rate == SPEECH_RATE
    sink = WavSink(None, assistant.tts_sample_rate, realtime=False)
    session = assistant.session(sink=sink, name="tone")
    try:
        said = await session.say("The porch light is on.")
        assert said is not None and said.reply == "The porch light is on."
        assert len(sink.audio) == 5 * int(SPEECH_RATE * WORD_S)
        sink.played.clear()
        before = len(voice.fragments)
        answered = await session.ask("Say hello.")
        assert answered.reply.strip() and not answered.interrupted
        words = sum(len(fragment.split()) for fragment in voice.fragments[before:])
        assert words >= len(answered.reply.split()) > 0 and len(sink.audio) == words * int(SPEECH_RATE * WORD_S)
    finally:
        await session.close()
