"""The optional wake word on real piper speech: each model fires on its own phrase, once, and not otherwise."""

import numpy as np
import pytest

from audio.frames import AudioChunk
from audio.wakeword import WakeWord
from voice.models import resolve

from speech import piper, silence


def detections(detector, audio):
    hits = []
    for i in range(0, len(audio), 320):
        chunk = AudioChunk(audio[i : i + 320], 16000, i / 16000)
        if detector.process(chunk):
            hits.append(chunk.t)
    return hits


@pytest.mark.parametrize(
    "name, phrase", [("hey_jarvis", "Hey Jarvis, turn on the light."), ("okay_nabu", "Okay Nabu, what time is it?")]
)
def test_wake_word_fires_once_on_its_phrase_only(name, phrase):
    detector = WakeWord(name, resolve(name, "wake").path)
    audio = np.concatenate([silence(500), piper(phrase), silence(500)])
    hits = detections(detector, audio)
    assert len(hits) == 1 and 0.5 < hits[0] < 0.5 + len(piper(phrase)) / 16000 + 0.3
    detector.reset()
    assert (
        detections(detector, np.concatenate([silence(500), piper("Turn on the lights in the kitchen."), silence(500)]))
        == []
    )


def test_unknown_wake_word_names_the_choices():
    with pytest.raises(FileNotFoundError, match=r"set models.wake_word to one of .*hey_jarvis.*okay_nabu"):
        WakeWord("hey_computer", resolve("hey_jarvis", "wake").path)
