"""Speech for benchmarks and tests: utterances spoken by espeak-ng and the bundled piper voice, and word error rate.

A library module (not a benchmark) so that tests and benchmarks share one set and one WER, and tests never
import benchmark code. Everything is 16 kHz int16 mono unless a rate is given.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.wavfile import read_wav
from voice.models import resolve

RATE = SPEECH_RATE
# everyday assistant requests without numbers (Whisper writes "10" for "ten", which WER would count wrong)
SENTENCES = [
    "Turn on the lights in the kitchen.",
    "What is the weather like today?",
    "Please set a timer for the pasta.",
    "Remind me to call my mother tomorrow morning.",
    "How far is the moon from the earth?",
    "Play some quiet music in the living room.",
]


@functools.lru_cache(maxsize=128)
def espeak_utterance(text: str, rate: int = RATE, wpm: int = 150) -> np.ndarray:
    """``text`` spoken by the espeak-ng command (22.05 kHz), resampled to ``rate``, int16 mono."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed; fix: apt-get install espeak-ng")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "e.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(wpm), "-w", str(out), text], check=True,
                       capture_output=True)
        samples, src = read_wav(out)
    return resample(samples, src, rate)


@functools.lru_cache(maxsize=1)
def _piper_voice(name: str = "piper-joe-medium"):
    from piper import PiperVoice

    return PiperVoice.load(str(resolve(name, "tts").path))


@functools.lru_cache(maxsize=128)
def piper_utterance(text: str, rate: int = RATE) -> np.ndarray:
    """``text`` spoken by the bundled piper voice, resampled to ``rate``, int16 mono."""
    voice = _piper_voice()
    pcm = np.concatenate([c.audio_int16_array for c in voice.synthesize(text)])
    return resample(pcm, voice.config.sample_rate, rate)


def normalize_words(text: str) -> list[str]:
    """Lower-case words without punctuation (hyphens split words, apostrophes stay)."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) / reference words (Levenshtein on words)."""
    ref, hyp = normalize_words(reference), normalize_words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)] / max(1, len(ref))
