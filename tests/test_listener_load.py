"""The final transcript on a loaded CPU: the real Listener, real Whisper tiny.en, real piper speech played in real
time while a thread pool keeps both cores busy (numpy matrix products, which release the GIL), so the partial
passes land at other moments than on a quiet machine. Whatever the timing, the final transcript starts with
every word the partials committed (it never comes back shorter than the committed partial, the flaky one-word
final seen in ``bench pipeline``) and holds the whole utterance."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from voice.events import TranscriptPartial
from voice.hearing.listener import Listener
from voice.hearing.stt import SpeechToText
from voice.hearing.utterance import UtteranceEnded
from voice.models import resolve
from voice.speechset import Voice, normalize_words, wer

JOE = Voice("piper-joe", "piper")
BLOCK = SPEECH_RATE // 50
UTTERANCES = (
    "Remind me to call my mother tomorrow morning.",
    "Turn on the lights in the kitchen, and then play some quiet music in the living room until I fall asleep.",
    "How far is the moon from the earth?",
    "What is the weather like today, and should I take an umbrella with me when I go out this afternoon?",
)


@pytest.fixture
def busy_cpu():
    """Two threads of back-to-back matrix products for the duration of the test."""
    stop = threading.Event()

    def burn() -> None:
        a = np.random.default_rng(0).random((300, 300))
        while not stop.is_set():
            a @ a

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-busy") as pool:
        for _ in range(2):
            pool.submit(burn)
        yield
        stop.set()


async def hear(listener: Listener, audio: np.ndarray) -> list[tuple[str, str]]:
    """Play ``audio`` in real time; per ended utterance, (the committed text of its last partial, its final)."""
    out, committed = [], ""
    t0 = time.monotonic()
    for i in range(0, len(audio), BLOCK):
        t = t0 + i / SPEECH_RATE
        await asyncio.sleep(max(0.0, t + BLOCK / SPEECH_RATE - time.monotonic()))
        for event in await listener.accept_chunk(audio[i : i + BLOCK], t):
            if isinstance(event, TranscriptPartial):
                committed = event.committed
            elif isinstance(event, UtteranceEnded):
                final = await event.utterance.final()
                out.append((max(committed, event.utterance.stream.committed, key=len), final))
                committed = ""
    return out


async def test_the_final_never_drops_committed_words_on_a_busy_cpu(small_config, busy_cpu):
    stt = SpeechToText(resolve(small_config.models.stt, "stt"), small_config.stt)
    listener = Listener.from_config(small_config, stt)
    silence = np.zeros(SPEECH_RATE * 3 // 2, np.int16)
    for text in UTTERANCES:
        heard = await hear(listener, np.concatenate([silence[:8000], JOE.speak(text), silence]))
        assert len(heard) == 1, f"one utterance, one final: {heard}"
        committed, final = heard[0]
        assert normalize_words(final)[: len(normalize_words(committed))] == normalize_words(committed), (
            f"the final {final!r} lost committed words {committed!r}"
        )
        assert wer(text, final) <= 0.25, f"the final {final!r} is not the utterance {text!r}"
    await listener.close()
