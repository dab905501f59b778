"""The home device's wake word on a shelf (voice/hearing/wake.py): openWakeWord listens, Whisper confirms. Real
parts: the openWakeWord "hey jarvis" model, silero VAD, Whisper tiny.en, piper and espeak-ng voices in the
simulated rooms (voice/roomset.py). Each wake check is awaited before the next block (``voice.bench.wake.listen``),
so what is decided depends on the audio alone."""

from __future__ import annotations

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from voice.hearing.parts import wake_word
from voice.hearing.stt import SpeechToText
from voice.hearing.utterance import UtteranceEnded
from voice.hearing.wake import WakePhrase
from voice.models import resolve
from voice.roomset import parse, television_channel
from voice.speechset import Utterance
from voice.wakeset import channel_lines, device_listener, fires, listen, wake_clips

pytestmark = pytest.mark.full


@pytest.fixture(scope="module")
def stt(small_config):
    return SpeechToText(resolve(small_config.models.stt, "stt"), small_config.stt)


@pytest.fixture(scope="module")
def config(small_config):
    return small_config.model_copy(
        update={"models": small_config.models.model_copy(update={"wake_word": "hey_jarvis"})}
    )


@pytest.fixture
def wake(config, stt):
    detector = wake_word(config)
    assert detector is not None
    return WakePhrase(detector, stt, config.stt.partial_beam_size)


def _clip(voice: str, request: str) -> Utterance:
    return next(c for c in wake_clips(12) if c.id.startswith(voice + "/") and c.text.endswith(request))


def _kitchen_television() -> np.ndarray:
    return television_channel(channel_lines(), 156.0, room="kitchen")  # cached: both tests hear it


async def test_a_television_talking_across_the_room_opens_no_turn(config, stt, wake):
    audio = _kitchen_television()[: 60 * SPEECH_RATE]
    listener = device_listener(config, stt, wake)
    heard = await listen(listener, wake, audio)
    await listener.close()
    assert heard.checks > 10, "the television's speech was checked for the wake phrase"
    assert heard.turns == [] and heard.woken == 0


async def test_the_detector_s_fire_alone_wakes_nothing(config, stt, wake):
    """openWakeWord fires on this stretch of the television in the kitchen (a voice saying "switch the hallway
    porch light lighting on", then "what year did the first moon landing happen"); Whisper hears no wake
    phrase in it."""
    audio = _kitchen_television()[140 * SPEECH_RATE :]
    assert fires(wake.detector, audio), "the detector alone takes this stretch for the wake word"
    listener = device_listener(config, stt, wake)
    heard = await listen(listener, wake, audio)
    await listener.close()
    assert heard.checks > 0 and heard.turns == [] and heard.woken == 0


@pytest.mark.parametrize(
    "voice, condition",
    [
        ("piper-joe", "living-room-3m+fan@10"),  # the detector hears it too
        ("espeak-westmidlands-slow", "clean"),  # the detector alone misses this accent
    ],
)
async def test_the_request_after_the_wake_phrase_is_heard_without_it(config, stt, wake, voice, condition):
    clip = _clip(voice, "Turn on the kitchen lights.")
    audio = np.concatenate([parse(condition).hear(clip).audio, np.zeros(2 * SPEECH_RATE, np.int16)])
    listener = device_listener(config, stt, wake)
    ended = []
    for i in range(0, len(audio), SPEECH_RATE // 50):
        events = await listener.accept_chunk(audio[i : i + SPEECH_RATE // 50], i / SPEECH_RATE)
        ended += [e for e in events if isinstance(e, UtteranceEnded)]
        await listener.settle()
    await listener.close()
    texts = [(await e.utterance.final()).casefold() for e in ended]
    assert len(texts) == 1, texts
    assert "kitchen" in texts[0] and "jarvis" not in texts[0], texts
    assert ended[0].utterance.speech_start >= clip.spans[0][1] - 0.1  # the turn starts after the wake phrase
