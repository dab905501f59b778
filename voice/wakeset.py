"""The wake word's test material and the device's ears run over a recording: "Hey Jarvis, <request>" in many
voices (``wake_clips``), what a television says (``channel_lines``), and ``listen``, which plays a recording
through the home device's Listener and wake word (voice/hearing/wake.py) in microphone blocks, each wake check
awaited before the next block, so what is decided depends on the audio alone (`specvoice bench wake`, tests)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from audio.frames import SPEECH_RATE, AudioChunk
from audio.wakeword import WakeWord
from voice.events import SpeechStarted
from voice.hearing.listener import Listener
from voice.hearing.stt import SpeechToText
from voice.hearing.wake import WakePhrase
from voice.home_casefile import DEFAULT_CASES, load_cases
from voice.speechset import COMPLETE_REQUESTS, VARIED_SENTENCES, Utterance, Voice, voices

WAKE_PHRASE = "Hey Jarvis,"  # what the default wake word model (hey_jarvis) listens for
WAKE_VOICES: tuple[Voice, ...] = voices(
    "piper-joe",
    "piper-joe-fast",
    "piper-joe-slow",
    "espeak-us",
    "espeak-gb-fast",
    "espeak-scotland-f3",
    "espeak-caribbean",
    "espeak-rp-m3",
    "espeak-nyc-f2",
    "espeak-westmidlands-slow",
    "espeak-lancaster-m2",
)
PAUSES_S = (0.15, 0.3, 0.5)  # after the wake phrase, cycled over the clips
BLOCK = SPEECH_RATE // 50  # the blocks a microphone delivers


def wake_clips(requests: int) -> list[Utterance]:
    """``WAKE_PHRASE`` then each of the first ``requests`` requests, in each wake voice: half a second of silence,
    the wake phrase, a pause, the request, a second of silence. The first span is the wake phrase."""
    clips = []
    for v, voice in enumerate(WAKE_VOICES):
        for i, request in enumerate(COMPLETE_REQUESTS[:requests]):
            wake, said = voice.speak(WAKE_PHRASE), voice.speak(request)
            pause = PAUSES_S[(v + i) % len(PAUSES_S)]
            lead, gap, tail = (np.zeros(int(s * SPEECH_RATE), np.int16) for s in (0.5, pause, 1.0))
            phrase_end = (len(lead) + len(wake)) / SPEECH_RATE
            spans = (
                (len(lead) / SPEECH_RATE, phrase_end),
                (phrase_end + pause, phrase_end + pause + len(said) / SPEECH_RATE),
            )
            audio = np.concatenate([lead, wake, gap, said, tail])
            clips.append(Utterance(f"{voice.name}/wake{i:02d}", voice, f"{WAKE_PHRASE} {request}", audio, spans))
    return clips


def fires(detector: WakeWord, audio: np.ndarray) -> list[float]:
    """The times (s) at which the detector alone fires on ``audio``, fed in microphone blocks."""
    detector.reset()
    return [
        i / SPEECH_RATE
        for i in range(0, len(audio), BLOCK)
        if detector.process(AudioChunk(audio[i : i + BLOCK], SPEECH_RATE, i / SPEECH_RATE))
    ]


@dataclass
class Heard:
    """What the device's Listener, with its wake word, made of a recording."""

    turns: list[float]  # audio times at which a turn opened
    woken: int  # wake phrases confirmed
    checks: int  # the recogniser's checks for the phrase
    check_s: float  # wall time those checks took


async def listen(listener: Listener, wake: WakePhrase, audio: np.ndarray) -> Heard:
    """``audio`` through ``listener`` in microphone blocks, each wake check awaited before the next block (as if
    it took no audio time: the decisions depend on the audio alone)."""
    await wake.reset()
    turns, woken, checks, check_s = [], 0, 0, 0.0
    wake.on_wake = lambda name: None
    for i in range(0, len(audio), BLOCK):
        events = await listener.accept_chunk(audio[i : i + BLOCK], i / SPEECH_RATE)
        turns += [e.t for e in events if isinstance(e, SpeechStarted)]
        if (check := wake.in_flight) is not None:
            began = time.perf_counter()
            await asyncio.wait({check})
            checks, check_s = checks + 1, check_s + time.perf_counter() - began
            woken += check.result() is not None
    return Heard(turns, woken, checks, check_s)


def channel_lines() -> tuple[str, ...]:
    """What the television says: everyday sentences and requests, and every sentence of the shipped home case
    file (commands and questions for a home, as a film or an advert may say them)."""
    cases = [case.say for case in load_cases(DEFAULT_CASES).cases]
    lines = [*VARIED_SENTENCES, *COMPLETE_REQUESTS, *cases]
    return tuple(lines[(i * 7) % len(lines)] for i in range(len(lines)))  # mixed, not the case file's order


def device_listener(config: Any, stt: SpeechToText, wake: WakePhrase) -> Listener:
    """The home device's Listener with ``wake``, on ``stt``; the VAD alone ends turns (no Smart Turn: a wake
    word decides when turns start)."""
    listener = Listener.from_config(config, stt, turn_model=None)
    listener.wake = wake
    return listener
