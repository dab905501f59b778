"""Listening conditions of a home device: a room, the talker's distance, and a noise at a signal-to-noise ratio.

A condition turns a clean labelled utterance (voice.speechset) into what a microphone on a shelf hears: the
talker placed in a simulated room (audio/room.py), plus one noise source placed elsewhere in the same room:
- ``babble``: four other people talking (espeak-ng voices of other accents, sentences of their own);
- ``tv``: a television across the room, a presenter (piper, slower) over music;
- ``fan``: a fan's broadband hum (brown noise);
- ``clatter``: kitchen clatter, short knocks and clinks at random moments.
The noise runs over the whole recording, silences included, as in a real room, so the end of a turn is decided
inside it. Conditions are named ``ROOM[-DISTANCEm][+NOISE@SNR]``, e.g. ``living-room-3m``,
``living-room+babble@10``; ``clean`` is the dry signal.

The conditions are split once: ``HOLDOUT`` (what benchmarks report) and ``TUNING`` (the other room, other
levels: what thresholds may be set on).
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, cast

import numpy as np

from audio.frames import SPEECH_RATE
from audio.room import ROOMS, mix, to_int16
from voice.speechset import Utterance, Voice, espeak_utterance, noise, piper_utterance, speech_power

NoiseName = Literal["babble", "tv", "fan", "clatter"]
NOISES: tuple[NoiseName, ...] = ("babble", "tv", "fan", "clatter")

# Words the background says: none of them is a request the benchmarks score.
_BACKGROUND_LINES = (
    "I think we should leave a bit earlier on Saturday.",
    "She said the train was late again this morning.",
    "Did you see the match last night, it was quite something.",
    "We could paint the fence once the weather gets better.",
    "My cousin is moving to a new flat next month.",
    "The shop on the corner has closed for the winter.",
    "Honestly I have never liked that kind of film.",
    "They are building a new bridge over the river.",
)
_BABBLE_VOICES = (("en-gb", 150), ("en-us+f3", 165), ("en-029", 155), ("en-gb-scotland+f2", 145))
# (bearing in degrees, distance in metres) from the microphone of each kind of noise source: the talker stands at
# bearing 0, the noises elsewhere in the room (the device is near a wall, so every bearing points into the room)
_WHERE: dict[NoiseName, tuple[float, float]] = {
    "babble": (30.0, 2.5),
    "tv": (-25.0, 3.0),
    "fan": (-60.0, 1.5),
    "clatter": (20.0, 1.5),
}


@dataclass(frozen=True)
class Condition:
    """Where the talker speaks and what else sounds. ``room`` None: no room (the dry signal)."""

    room: str | None = None
    distance_m: float = 1.0
    noise: NoiseName | None = None
    snr_db: float = 20.0

    @property
    def name(self) -> str:
        if self.room is None and self.noise is None:
            return "clean"
        place = "dry" if self.room is None else self.room + ("" if self.distance_m == 1.0 else f"-{self.distance_m:g}m")
        return place + ("" if self.noise is None else f"+{self.noise}@{self.snr_db:g}")

    def hear(self, utterance: Utterance) -> Utterance:
        """``utterance`` as the microphone hears it in this condition (its spans and text unchanged)."""
        if self.room is None and self.noise is None:
            return utterance
        room = ROOMS[self.room] if self.room is not None else None
        dry = utterance.audio.astype(np.float32)
        speech = dry if room is None else room.hear(dry, room.place(self.distance_m))
        if self.noise is None:
            return replace(utterance, audio=to_int16(speech))
        seed = zlib.crc32(f"{utterance.id}/{self.name}".encode())
        bed = background(self.noise, len(speech), seed)
        if room is not None:
            bearing, distance = _WHERE[self.noise]
            bed = room.hear(bed, room.place(distance, bearing))
        level = speech_power(speech, utterance.spans)  # the speech where it is spoken, not its silences
        return replace(utterance, audio=to_int16(mix(speech, bed, self.snr_db, speech_power=level)))


def parse(name: str) -> Condition:
    """A condition from its name (``Condition.name``): ``clean``, ``kitchen-3m``, ``living-room+tv@10``,
    ``dry+fan@5``."""
    found = re.fullmatch(r"(clean|dry|[a-z-]+?)(?:-(\d+(?:\.\d+)?)m)?(?:\+([a-z]+)@(-?\d+(?:\.\d+)?))?", name)
    if found is None:
        raise ValueError(f"no such listening condition {name!r}; fix: e.g. clean, living-room-3m, kitchen+fan@10")
    place, distance, kind, snr = found.groups()
    if place not in ("clean", "dry") and place not in ROOMS:
        raise ValueError(f"no room {place!r}; fix: one of {sorted(ROOMS)} (or dry: no room)")
    if kind is not None and kind not in NOISES:
        raise ValueError(f"no noise {kind!r}; fix: one of {list(NOISES)}")
    if place == "clean" and kind is not None:
        raise ValueError("clean has no noise; fix: dry+NOISE@SNR for noise without a room")
    return Condition(
        room=None if place in ("clean", "dry") else place,
        distance_m=float(distance) if distance else 1.0,
        noise=cast("NoiseName | None", kind),  # checked against NOISES above
        snr_db=float(snr) if snr else 20.0,
    )


HOLDOUT: tuple[Condition, ...] = (
    Condition(),
    Condition("living-room", 3.0),
    Condition("living-room", 1.0, "babble", 10.0),
    Condition("living-room", 1.0, "tv", 10.0),
    Condition("living-room", 1.0, "fan", 5.0),
)
TUNING: tuple[Condition, ...] = (
    Condition("kitchen", 1.0),
    Condition("kitchen", 3.0),
    Condition("kitchen", 1.0, "babble", 20.0),
    Condition("kitchen", 1.0, "tv", 20.0),
    Condition("kitchen", 1.0, "fan", 10.0),
    Condition("kitchen", 1.0, "clatter", 10.0),
)


def chosen(spec: str, holdout: Sequence[Condition] = HOLDOUT, tuning: Sequence[Condition] = TUNING) -> list[Condition]:
    """The conditions a benchmark's ``--conditions`` names: ``holdout``, ``tuning``, or names separated by commas
    (``parse``; ValueError for a bad one)."""
    named = {"holdout": list(holdout), "tuning": list(tuning)}
    return named.get(spec) or [parse(name.strip()) for name in spec.split(",")]


CONDITIONS_HELP = "holdout, tuning, or names separated by commas (clean, living-room-3m, kitchen+fan@10, dry+tv@5...)"


def background(kind: NoiseName, n: int, seed: int) -> np.ndarray:
    """``n`` samples of ``kind`` noise (float32, unit RMS), the same for the same seed."""
    if kind == "fan":
        return noise("brown", n, seed)
    bed = {"babble": _babble, "tv": _television, "clatter": _clatter}[kind]()
    start = int(np.random.default_rng(seed).integers(0, len(bed)))
    return np.resize(np.roll(bed, -start), n).astype(np.float32)  # a loop of the bed, from a seeded offset


def _unit(samples: np.ndarray) -> np.ndarray:
    samples = samples.astype(np.float32)
    return samples / np.sqrt(np.mean(np.square(samples, dtype=np.float64)))


def _talk(lines: list[np.ndarray], gap_s: float) -> np.ndarray:
    gap = np.zeros(int(gap_s * SPEECH_RATE), np.int16)
    return np.concatenate([part for line in lines for part in (line, gap)]).astype(np.float32)


@functools.cache
def _babble() -> np.ndarray:
    """Four people talking at once, each through the lines at their own pace."""
    talkers = []
    for i, (voice, wpm) in enumerate(_BABBLE_VOICES):
        order = _BACKGROUND_LINES[i:] + _BACKGROUND_LINES[:i]
        talkers.append(_unit(_talk([espeak_utterance(line, wpm=wpm, voice=voice) for line in order], 0.3)))
    length = min(len(t) for t in talkers)
    return _unit(np.sum([t[:length] for t in talkers], axis=0))


@functools.cache
def _television() -> np.ndarray:
    """A presenter over music: the voice 6 dB above a bed of slow chords with a beat."""
    voice = _unit(_talk([piper_utterance(line, length_scale=1.1) for line in _BACKGROUND_LINES], 0.5))
    return _unit(voice + 0.5 * _music(len(voice)))


def _music(n: int) -> np.ndarray:
    """``n`` samples of slow chords with a soft beat (unit RMS)."""
    t = np.arange(n) / SPEECH_RATE
    chords = ((220.0, 277.2, 329.6), (196.0, 246.9, 293.7), (174.6, 220.0, 261.6), (196.0, 246.9, 311.1))
    which = (t // 2.0).astype(int) % len(chords)  # a new chord every two seconds
    music = np.zeros_like(t)
    for k, chord in enumerate(chords):
        tones = sum(np.sin(2 * np.pi * f * h * t) / h for f in chord for h in (1, 2, 3))
        music += np.where(which == k, tones, 0.0)
    beat = 0.6 + 0.4 * np.exp(-((t % 0.5) / 0.08))  # a soft pulse at 120 beats per minute
    return _unit(music * beat)


# The television channel's speakers: the piper voice at three speeds, espeak-ng voices of five accents.
_CHANNEL_VOICES = (
    Voice("tv-piper", "piper"),
    Voice("tv-espeak-gb", "espeak", "en-gb", 165),
    Voice("tv-piper-slow", "piper", length_scale=1.15),
    Voice("tv-espeak-us-f3", "espeak", "en-us+f3", 170),
    Voice("tv-espeak-rp", "espeak", "en-gb-x-rp", 155),
    Voice("tv-piper-fast", "piper", length_scale=0.9),
    Voice("tv-espeak-nyc-m2", "espeak", "en-us-nyc+m2", 175),
    Voice("tv-espeak-caribbean", "espeak", "en-029", 150),
)


@functools.cache
def television_channel(lines: tuple[str, ...], seconds: float, room: str = "living-room") -> np.ndarray:
    """``seconds`` of a television across ``room`` (where ``tv`` noise stands), nobody addressing the device:
    ``lines`` said in turn (again from the first when all are said) by the channel's speakers, 0.3 to 0.9 s
    apart, over music 10 dB below the voices; as loud at the microphone as its speakers would be a metre away.
    int16, as the microphone hears it."""
    rng = np.random.default_rng(11)
    parts: list[np.ndarray] = []
    i = 0
    while sum(len(p) for p in parts) < seconds * SPEECH_RATE:
        parts.append(_CHANNEL_VOICES[i % len(_CHANNEL_VOICES)].speak(lines[i % len(lines)]))
        parts.append(np.zeros(int(rng.uniform(0.3, 0.9) * SPEECH_RATE), np.int16))
        i += 1
    voices = np.concatenate(parts).astype(np.float32)
    level = float(np.sqrt(np.mean(np.square(voices, dtype=np.float64))))
    dry = voices + level * 10 ** (-10 / 20) * _music(len(voices))
    bearing, distance = _WHERE["tv"]
    where = ROOMS[room]
    wet = where.hear(dry, where.place(distance, bearing))
    wet *= level / float(np.sqrt(np.mean(np.square(wet, dtype=np.float64))))
    return to_int16(wet[: int(seconds * SPEECH_RATE)])


@functools.cache
def _clatter() -> np.ndarray:
    """A minute of kitchen clatter: knocks and clinks (decaying noise bursts, some ringing) at random moments."""
    rng = np.random.default_rng(7)
    bed = np.zeros(60 * SPEECH_RATE, np.float32)
    at = 0
    while (at := at + int(rng.uniform(0.3, 1.5) * SPEECH_RATE)) < len(bed) - SPEECH_RATE:
        n = int(rng.uniform(0.03, 0.25) * SPEECH_RATE)
        t = np.arange(n) / SPEECH_RATE
        burst = rng.standard_normal(n) * np.exp(-t / rng.uniform(0.01, 0.06))
        if rng.random() < 0.4:  # a clink: a metal or glass ring
            burst += np.sin(2 * np.pi * rng.uniform(1500, 4500) * t) * np.exp(-t / 0.08) * 3
        bed[at : at + n] += burst * rng.uniform(0.3, 1.0)
    return _unit(bed + 0.01 * rng.standard_normal(len(bed)).astype(np.float32))
