"""Test utterances made at test time with espeak-ng and piper, known speech boundaries, and WER.

The generators and WER live in voice.speechset (the benchmarks use the same set); this module adds what
only tests need. Everything is 16 kHz int16 mono.
"""

from __future__ import annotations

import numpy as np

from audio.frames import SPEECH_RATE
from voice.speechset import SENTENCES, espeak_utterance, normalize_words, piper_utterance, wer

__all__ = [
    "SENTENCES",
    "espeak",
    "piper",
    "normalize_words",
    "wer",
    "heard_as",
    "spoken_as",
    "silence",
    "voiced_bounds",
    "trimmed",
]


def heard_as(expected: str, heard: str) -> bool:
    """``heard`` is ``expected`` give or take one word: a test asserts that the words came through, not tiny.en's
    exact spelling of them (the audio is the same every run: see tests/conftest.py)."""
    return wer(expected, heard) <= 1 / max(1, len(normalize_words(expected)))


def spoken_as(text: str, heard: str) -> bool:
    """``heard`` (speech made from ``text``, transcribed back) says ``text``, give or take two words: tiny.en
    mishears a short reply now and then ("The kitchen light is no one." for "... now on."). Audio that is cut,
    doubled, silent or at the wrong rate is far off that."""
    return wer(text, heard) <= 2 / max(1, len(normalize_words(text)))


def silence(ms: int, rate: int = SPEECH_RATE) -> np.ndarray:
    return np.zeros(rate * ms // 1000, dtype=np.int16)


def voiced_bounds(samples: np.ndarray, rate: int = SPEECH_RATE, level: int = 300) -> tuple[float, float]:
    """(first, last) second where the clean synthetic signal is audible: the known speech boundaries."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > level)
    return loud[0] / rate, (loud[-1] + 1) / rate


def trimmed(samples: np.ndarray, rate: int = SPEECH_RATE) -> np.ndarray:
    """The synthetic utterance without the silence the synthesizer put around it."""
    start, end = voiced_bounds(samples, rate)
    return samples[int(start * rate) : int(end * rate)]


def espeak(text: str) -> np.ndarray:
    return trimmed(espeak_utterance(text))


def piper(text: str) -> np.ndarray:
    """Piper's speech without its sampling noise: the same samples every run (tests/conftest.py says why)."""
    return trimmed(piper_utterance(text, deterministic=True))
