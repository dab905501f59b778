"""Test utterances made at test time (espeak-ng and piper), and word error rate.

Real speech from two different synthesizers, so STT and VAD tests do not depend on one voice. Everything
returned is 16 kHz int16 mono unless said otherwise.
"""

from __future__ import annotations

import functools
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from audio.resample import resample
from audio.wavfile import read_wav

RATE = 16000


@functools.lru_cache(maxsize=64)
def espeak(text: str, rate: int = RATE, voice: str = "en-us", wpm: int = 150) -> np.ndarray:
    """Speak ``text`` with the espeak-ng command (22.05 kHz), resampled to ``rate``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "e.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(out), text], check=True,
                       capture_output=True)
        samples, src = read_wav(out)
    return resample(samples, src, rate)


@functools.lru_cache(maxsize=1)
def _piper_voice():
    from piper import PiperVoice

    from voice.models import resolve

    return PiperVoice.load(str(resolve("piper-joe-medium", "tts").path))


@functools.lru_cache(maxsize=64)
def piper(text: str, rate: int = RATE) -> np.ndarray:
    """Speak ``text`` with the bundled piper voice (22.05 kHz), resampled to ``rate``."""
    voice = _piper_voice()
    parts = [c.audio_int16_array for c in voice.synthesize(text)]
    return resample(np.concatenate(parts), voice.config.sample_rate, rate)


def silence(ms: int, rate: int = RATE) -> np.ndarray:
    return np.zeros(rate * ms // 1000, dtype=np.int16)


def voiced_bounds(samples: np.ndarray, rate: int = RATE, level: int = 300) -> tuple[float, float]:
    """(first, last) time in seconds where the clean synthetic signal is audible: the known boundaries."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > level)
    return loud[0] / rate, (loud[-1] + 1) / rate


def normalize(text: str) -> list[str]:
    """Lower-case words without punctuation; numbers spelled as Whisper tends to write them are left alone."""
    text = text.lower().replace("-", " ")
    return re.sub(r"[^a-z0-9' ]+", " ", text).split()


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) / reference words (Levenshtein on words)."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)] / max(1, len(ref))


# sentences for the STT tests and the benchmark: everyday assistant requests, no numbers (spelling varies)
SENTENCES = [
    "Turn on the lights in the kitchen.",
    "What is the weather like today?",
    "Please set a timer for ten minutes.",
    "Remind me to call my mother tomorrow morning.",
    "How far is the moon from the earth?",
    "Play some quiet music in the living room.",
]
