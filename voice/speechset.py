"""Speech for benchmarks and tests: utterances spoken by espeak-ng and the bundled piper voice, and word error rate.

A library module (not a benchmark) so that tests and benchmarks share one set and one WER, and tests never
import benchmark code. Everything is 16 kHz int16 mono unless a rate is given.

Besides the six plain sentences there are three labelled sets (``Utterance``), all deterministic (espeak is
rule-based; piper is run without its sampling noise; background noise comes from sox in repeatable mode,
cut at offsets from a fixed seed) and built once per process:
  - ``varied_set()``: many voices, accents, speeds and some background noise, for STT word error rate;
  - ``complete_turns()``: finished requests and questions, for the end-of-turn wait;
  - ``paused_turns()``: requests with a 0.4-0.8 s pause in the middle ("Set a timer for ... ten minutes."),
    made by joining the two halves, each spoken on its own, with silence; an end-of-turn rule that ends
    the turn in that pause has cut the user off. Each half is spoken as a whole sentence, so the first ends
    with the synthesizer's final intonation: harder for an audio-only detector than a person's
    hesitation, which usually keeps the pitch up.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.wavfile import read_wav
from voice.models import resolve

# everyday assistant requests without numbers (Whisper writes "10" for "ten", which WER would count wrong)
SENTENCES = [
    "Turn on the lights in the kitchen.",
    "What is the weather like today?",
    "Please set a timer for the pasta.",
    "Remind me to call my mother tomorrow morning.",
    "How far is the moon from the earth?",
    "Play some quiet music in the living room.",
]


@functools.lru_cache(maxsize=512)
def espeak_utterance(text: str, rate: int = SPEECH_RATE, wpm: int = 150, voice: str = "en-us") -> np.ndarray:
    """``text`` spoken by the espeak-ng command (22.05 kHz) in ``voice`` (e.g. "en-gb-scotland+f3": an accent
    from `espeak-ng --voices=en`, optionally + a variant), resampled to ``rate``, int16 mono."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed; fix: apt-get install espeak-ng")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "e.wav"
        subprocess.run(
            ["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(out), text], check=True, capture_output=True
        )
        samples, src = read_wav(out)
    return resample(samples, src, rate)


@functools.lru_cache(maxsize=1)
def _piper_voice(name: str = "piper-joe-medium"):
    from piper import PiperVoice

    return PiperVoice.load(str(resolve(name, "tts").path))


@functools.lru_cache(maxsize=512)
def piper_utterance(
    text: str, rate: int = SPEECH_RATE, *, length_scale: float | None = None, deterministic: bool = False
) -> np.ndarray:
    """``text`` spoken by the bundled piper voice, resampled to ``rate``, int16 mono. ``length_scale`` > 1 speaks
    slower. Piper samples noise inside its model, so two calls differ slightly; ``deterministic`` turns that
    noise off (the same samples every time, a slightly flatter voice)."""
    from piper import SynthesisConfig

    voice = _piper_voice()
    config = SynthesisConfig(length_scale=length_scale)
    if deterministic:
        config.noise_scale = config.noise_w_scale = 0.0
    pcm = np.concatenate([c.audio_int16_array for c in voice.synthesize(text, syn_config=config)])
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


# ---- labelled sets: varied voices, complete turns, turns with a pause inside ---------------------------------

NoiseKind = Literal["pink", "brown", "white"]
_VOICED_LEVEL = 300  # int16: above this the clean synthetic signal is speech (its own silence is exact zeros)


@dataclass(frozen=True)
class Voice:
    """One way of speaking: a synthesizer, its voice and speed, and optional background noise."""

    name: str
    engine: Literal["espeak", "piper"]
    voice: str = "en-us"  # espeak: accent[+variant]; unused for piper (one bundled voice)
    wpm: int = 160  # espeak speed, words per minute
    length_scale: float = 1.0  # piper speed: > 1 is slower
    noise: NoiseKind | None = None
    snr_db: float = 20.0  # speech-to-noise power ratio when noise is set

    def speak(self, text: str) -> np.ndarray:
        """``text`` in this voice, clean (no noise), trimmed to the voiced part, 16 kHz int16."""
        if self.engine == "espeak":
            audio = espeak_utterance(text, wpm=self.wpm, voice=self.voice)
        else:
            audio = piper_utterance(text, length_scale=self.length_scale, deterministic=True)
        start, end = voiced_span(audio)
        return audio[start:end]


@dataclass(frozen=True, eq=False)
class Utterance:
    """One labelled test utterance. ``spans``: (start, end) seconds of each spoken piece in ``audio`` (one
    piece, or two around a pause), measured on the clean signal, so they stay exact under noise."""

    id: str
    voice: Voice
    text: str  # the reference transcript
    audio: np.ndarray  # 16 kHz int16 mono, noise mixed in when the voice has noise
    spans: tuple[tuple[float, float], ...]

    @property
    def speech_end(self) -> float:
        return self.spans[-1][1]

    @property
    def pause(self) -> tuple[float, float] | None:
        """The silence inside the request (None for a one-piece utterance)."""
        return (self.spans[0][1], self.spans[1][0]) if len(self.spans) > 1 else None


def voiced_span(samples: np.ndarray, level: int = _VOICED_LEVEL) -> tuple[int, int]:
    """(first, one past the last) sample index where the clean synthetic signal is louder than ``level``."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > level)
    if not len(loud):
        raise ValueError("no speech in the synthesized audio")
    return int(loud[0]), int(loud[-1]) + 1


@functools.lru_cache(maxsize=3)
def _noise_bed(kind: NoiseKind, seconds: int = 60) -> np.ndarray:
    """``seconds`` of ``kind`` noise from sox in repeatable mode (-R: fixed seed), float32, unit RMS."""
    if shutil.which("sox") is None:
        raise RuntimeError("sox is not installed; fix: apt-get install sox (or `make system-deps`)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "n.wav"
        subprocess.run(
            [
                "sox",
                "-R",
                "-n",
                "-r",
                str(SPEECH_RATE),
                "-c",
                "1",
                "-b",
                "16",
                str(out),
                "synth",
                str(seconds),
                f"{kind}noise",
            ],
            check=True,
            capture_output=True,
        )
        samples, _ = read_wav(out)
    bed = samples.astype(np.float32)
    bed -= bed.mean()
    return bed / np.sqrt(np.mean(np.square(bed, dtype=np.float64)))


def noise(kind: NoiseKind, n: int, seed: int) -> np.ndarray:
    """``n`` samples of ``kind`` noise at unit RMS (float32): a slice of one fixed sox noise bed, at an offset
    chosen by ``seed``, so equal seeds give equal noise."""
    bed = _noise_bed(kind)
    if n > len(bed):
        raise ValueError(f"at most {len(bed)} noise samples at once (asked {n})")
    start = int(np.random.default_rng(seed).integers(0, len(bed) - n + 1))
    return bed[start : start + n]


def speech_power(samples: np.ndarray, spans: tuple[tuple[float, float], ...], rate: int = SPEECH_RATE) -> float:
    """Mean power of ``samples`` inside the spoken spans: the "signal" of a signal-to-noise ratio."""
    pieces = [samples[int(a * rate) : int(b * rate)].astype(np.float64) for a, b in spans]
    return float(np.mean(np.square(np.concatenate(pieces))))


def mix_at_snr(
    speech: np.ndarray, spans: tuple[tuple[float, float], ...], kind: NoiseKind, snr_db: float, seed: int
) -> np.ndarray:
    """``speech`` (int16) with ``kind`` noise over its whole length, scaled so that inside ``spans`` the speech
    power is exactly ``snr_db`` above the noise power. Returns int16 (clipped, which at these levels never
    happens for the synthetic voices)."""
    bed = noise(kind, len(speech), seed).astype(np.float64)
    scale = np.sqrt(speech_power(speech, spans) / 10 ** (snr_db / 10) / speech_power(bed, spans))
    mixed = speech.astype(np.float64) + scale * bed
    return np.clip(np.round(mixed), -32768, 32767).astype(np.int16)


def _seed(key: str) -> int:
    return zlib.crc32(key.encode())  # stable across processes (str hash() is salted)


def framed(uid: str, voice: Voice, text: str, speech: np.ndarray) -> Utterance:
    """``speech`` (16 kHz int16, already spoken) as a labelled turn: TURN_LEAD_S of silence before it and
    TURN_TAIL_S after (in which a listening condition's noise plays on)."""
    lead = np.zeros(round(TURN_LEAD_S * SPEECH_RATE), np.int16)
    tail = np.zeros(round(TURN_TAIL_S * SPEECH_RATE), np.int16)
    start = len(lead) / SPEECH_RATE
    spans = ((start, start + len(speech) / SPEECH_RATE),)
    return Utterance(uid, voice, text, np.concatenate([lead, np.asarray(speech, np.int16), tail]), spans)


def _assemble(
    uid: str, voice: Voice, pieces: list[str], pauses_s: list[float], lead_s: float, tail_s: float
) -> Utterance:
    """Speak each piece on its own and join them with the given silences; add lead and tail silence."""
    chunks, spans, t = [np.zeros(int(lead_s * SPEECH_RATE), np.int16)], [], lead_s
    for i, piece in enumerate(pieces):
        audio = voice.speak(piece)
        spans.append((t, t + len(audio) / SPEECH_RATE))
        chunks.append(audio)
        t += len(audio) / SPEECH_RATE
        gap = pauses_s[i] if i < len(pauses_s) else tail_s
        chunks.append(np.zeros(round(gap * SPEECH_RATE), np.int16))
        t += len(chunks[-1]) / SPEECH_RATE
    audio = np.concatenate(chunks)
    if voice.noise is not None:
        audio = mix_at_snr(audio, tuple(spans), voice.noise, voice.snr_db, _seed(uid))
    return Utterance(uid, voice, " ".join(pieces), audio, tuple(spans))


# Accents from `espeak-ng --voices=en` (the mbrola ones need mbrola, not installed), voice variants
# (+f2/+f3/+f4 female, +m2/+m3 male), speeds from 130 to 190 wpm; piper joe at three speeds; noise at 15-20 dB.
VARIED_VOICES: tuple[Voice, ...] = (
    Voice("espeak-us", "espeak", "en-us", 160),
    Voice("espeak-gb-fast", "espeak", "en-gb", 190),
    Voice("espeak-scotland-f3", "espeak", "en-gb-scotland+f3", 145),
    Voice("espeak-caribbean", "espeak", "en-029", 150),
    Voice("espeak-rp-m3", "espeak", "en-gb-x-rp+m3", 170),
    Voice("espeak-nyc-f2", "espeak", "en-us-nyc+f2", 175),
    Voice("espeak-westmidlands-slow", "espeak", "en-gb-x-gbcwmd", 130),
    Voice("espeak-lancaster-m2", "espeak", "en-gb-x-gbclan+m2", 160),
    Voice("piper-joe", "piper"),
    Voice("piper-joe-fast", "piper", length_scale=0.85),
    Voice("piper-joe-slow", "piper", length_scale=1.2),
    Voice("espeak-us-f4-pink15", "espeak", "en-us+f4", 160, noise="pink", snr_db=15.0),
    Voice("piper-joe-brown15", "piper", noise="brown", snr_db=15.0),
    Voice("espeak-gb-white20", "espeak", "en-gb", 165, noise="white", snr_db=20.0),
)

# Requests of about 2-3 s, without numbers (Whisper writes "10" for "ten", which WER would count wrong).
VARIED_SENTENCES: tuple[str, ...] = (
    *SENTENCES,
    "Switch off the lamp in the bedroom.",
    "Add milk and bread to my shopping list.",
    "What time does the bakery open on Sunday?",
    "Send a message to my brother that I am running late.",
    "Tell me a funny story about a cat.",
    "Open the garage door and turn on the porch light.",
)

# A pause of this length sits inside each paused turn (cycled through the set).
PAUSES_S: tuple[float, ...] = (0.4, 0.6, 0.8)
# (first half, second half): the first half alone is not a finished request
PAUSED_REQUESTS: tuple[tuple[str, str], ...] = (
    ("Set a timer for", "ten minutes."),
    ("Turn on the", "kitchen lights."),
    ("Remind me to", "call my mother tomorrow."),
    ("What is the weather like in", "Paris?"),
    ("Play some music by", "the Beatles."),
    ("Add milk and", "bread to my shopping list."),
    ("Can you tell me", "how far away the moon is?"),
    ("Switch off the", "lamp in the bedroom."),
    ("I would like to", "listen to the news."),
    ("How long does it take to", "boil an egg?"),
    ("Send a message to", "my brother."),
    ("Open the", "garage door."),
)
COMPLETE_REQUESTS: tuple[str, ...] = (
    "Set a timer for ten minutes.",
    "Turn on the kitchen lights.",
    "What is the weather like in Paris?",
    "What time is it?",
    "Tell me a joke.",
    "How far is the moon from the earth?",
    "Play some quiet music in the living room.",
    "Remind me to call my mother tomorrow morning.",
    "Switch off the lamp in the bedroom.",
    "Open the garage door.",
    "Send a message to my brother.",
    "Add milk and bread to my shopping list.",
)
# End-of-turn sets: the natural voice at three speeds, five accents, one noisy voice.
TURN_VOICES: tuple[Voice, ...] = (
    Voice("piper-joe", "piper"),
    Voice("piper-joe-fast", "piper", length_scale=0.85),
    Voice("piper-joe-slow", "piper", length_scale=1.2),
    Voice("espeak-us", "espeak", "en-us", 160),
    Voice("espeak-gb", "espeak", "en-gb", 160),
    Voice("espeak-scotland-f3", "espeak", "en-gb-scotland+f3", 145),
    Voice("espeak-caribbean", "espeak", "en-029", 150),
    Voice("espeak-nyc-f2", "espeak", "en-us-nyc+f2", 175),
    Voice("piper-joe-pink20", "piper", noise="pink", snr_db=20.0),
)


def voices(*names: str) -> tuple[Voice, ...]:
    """The voices of these names, from VARIED_VOICES and TURN_VOICES (one definition of each voice)."""
    known = {v.name: v for v in (*VARIED_VOICES, *TURN_VOICES)}
    return tuple(known[name] for name in names)


TURN_LEAD_S = 0.5  # silence before the speech
TURN_TAIL_S = 2.5  # silence after it: longer than any end-of-turn wait, so every rule can decide


@functools.cache
def varied_set() -> tuple[Utterance, ...]:
    """Every ``VARIED_SENTENCES`` sentence in every ``VARIED_VOICES`` voice (168 utterances), with 0.25 s of
    silence (or noise) on either side."""
    return tuple(
        _assemble(f"{v.name}/{i:02d}", v, [text], [], 0.25, 0.25)
        for v in VARIED_VOICES
        for i, text in enumerate(VARIED_SENTENCES)
    )


@functools.cache
def complete_turns() -> tuple[Utterance, ...]:
    """Each ``COMPLETE_REQUESTS`` request in each ``TURN_VOICES`` voice, with lead and tail silence."""
    return tuple(
        _assemble(f"{v.name}/complete{i:02d}", v, [text], [], TURN_LEAD_S, TURN_TAIL_S)
        for v in TURN_VOICES
        for i, text in enumerate(COMPLETE_REQUESTS)
    )


@functools.cache
def paused_turns() -> tuple[Utterance, ...]:
    """Each ``PAUSED_REQUESTS`` request in each ``TURN_VOICES`` voice, its two halves joined by a pause of
    0.4, 0.6 or 0.8 s (cycled over requests and voices), with lead and tail silence."""
    out = []
    for j, v in enumerate(TURN_VOICES):
        for i, (first, second) in enumerate(PAUSED_REQUESTS):
            pause = PAUSES_S[(i + j) % len(PAUSES_S)]
            out.append(_assemble(f"{v.name}/paused{i:02d}", v, [first, second], [pause], TURN_LEAD_S, TURN_TAIL_S))
    return tuple(out)
