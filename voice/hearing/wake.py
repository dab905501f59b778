"""The device's wake word: openWakeWord listens, Whisper decides.

openWakeWord (audio/wakeword.py) is cheap and fires the moment its phrase ends, but on voices and rooms unlike
its training data it both misses the phrase and fires on other speech (`specvoice bench wake`). So its fire
alone wakes nothing. While the device is asleep, the speech it hears is transcribed by the recogniser the
listener already has, a few seconds at a time, and only a transcript that says the wake phrase wakes it, at the
phrase's last word: the request after it is heard without it. A stretch of speech is checked ``CHECK_EVERY_S``
after it starts, then every ``CHECK_EVERY_S`` while it goes on, and when it ends; the detector's fire checks at
once (a person who says the phrase and the request in one breath is heard from the phrase's end). A device whose
recogniser runs on another machine (stt.backend = "wyoming") has no word times to check with: its detector alone
wakes it.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from audio.frames import SPEECH_RATE, AudioChunk
from audio.wakeword import WakeWord
from voice.hearing.whisper_faults import Word
from voice.tasks import cancel_and_wait, start

if TYPE_CHECKING:
    from voice.hearing.stt import SpeechToText

CHECK_EVERY_S = 1.5  # the phrase said slowly fits in it, and a check costs one short Whisper pass
CHECK_WINDOW_S = 2.5  # each check hears this much: the phrase whole, even when a check comes just after it
KEEP_S = 4.0  # audio kept for the checks and for the turn that opens at the phrase's end
LIKE = 0.75  # how alike (difflib's ratio) a span of the heard words must be spelled to the phrase

log = logging.getLogger("specvoice.wake")


class WakePhrase:
    """Wakes the device when the recogniser hears ``phrase`` (by default the detector's name: "hey jarvis")."""

    def __init__(
        self, detector: WakeWord, stt: SpeechToText | None, beam_size: int = 1, phrase: str | None = None
    ) -> None:
        self.detector = detector
        self.name = detector.name
        self.phrase = phrase or detector.name.replace("_", " ")
        self._letters = _letters(self.phrase)
        self._stt, self._beam_size = stt, beam_size
        self._audio = np.zeros(0, np.int16)  # what Whisper hears, the last KEEP_S seconds
        self._audio_end = 0.0  # audio time of its end
        self._stretch: float | None = None  # start of the speech heard now, while asleep
        self._checked_to = 0.0  # audio time up to which the stretch has been checked
        self._check: asyncio.Task[float | None] | None = None
        self.on_wake: Callable[[str], None] = lambda name: None  # told each time the device wakes (Home Assistant)

    def process(
        self, chunk: AudioChunk, heard: np.ndarray, speech_start: float | None, speaking: bool, asleep: bool = True
    ) -> float | None:
        """One block: the VAD's ``chunk`` and ``heard`` (what Whisper hears of it), a start of speech the VAD
        found in it, whether speech goes on, whether the device is asleep (awake, nothing is checked). Returns the
        audio time at which a wake phrase just confirmed ended."""
        self._keep(heard, chunk.end_t)
        woken = self._collect()
        fired = self.detector.process(chunk)
        if woken is not None:
            self.on_wake(self.name)
            self._stretch = None
            return woken
        if self._stt is None:
            if fired and asleep:
                self.on_wake(self.name)
                return chunk.end_t
            return None
            self._stretch = None
            return woken
        if speech_start is not None and self._stretch is None:
            self._stretch = self._checked_to = speech_start
        if self._stretch is not None and self._check is None:
            due = fired or not speaking or chunk.end_t - self._checked_to >= CHECK_EVERY_S
            if due and chunk.end_t > self._checked_to:
                self._checked_to = chunk.end_t
                self._check = start(self._confirm(chunk.end_t), name="wake check")
        if not speaking:
            self._stretch = None
        return woken

    def since(self, t: float) -> np.ndarray:
        """What Whisper hears from audio time ``t`` to now (as far back as ``KEEP_S``)."""
        keep = int(round((self._audio_end - t) * SPEECH_RATE))
        return self._audio[-keep:].copy() if keep > 0 else np.zeros(0, np.int16)

    async def reset(self) -> None:
        """Forget what was heard (the device woke by other means, or the audio jumped)."""
        self.detector.reset()
        self._stretch, self._checked_to = None, self._audio_end
        check, self._check = self._check, None
        await cancel_and_wait(check)

    @property
    def in_flight(self) -> asyncio.Task[float | None] | None:
        return self._check

    async def settle(self) -> float | None:
        """Wait for a check in flight; the time its phrase ended, if it confirmed one (lockstep runs, benches)."""
        if self._check is not None:
            await asyncio.wait({self._check})
        return self._collect()

    def said_in(self, words: list[Word]) -> Word | None:
        """The last word of a span of ``words`` spelled like the phrase (at most one word more or fewer than it),
        or None."""
        best: tuple[float, Word] | None = None
        n = len(self.phrase.split())
        for size in range(max(1, n - 1), n + 2):
            for i in range(len(words) - size + 1):
                like = difflib.SequenceMatcher(
                    None, _letters(" ".join(w.text for w in words[i : i + size])), self._letters
                )
                if like.ratio() >= LIKE and (best is None or like.ratio() > best[0]):
                    best = (like.ratio(), words[i + size - 1])
        return best[1] if best is not None else None

    # ---- inside ----------------------------------------------------------------------------------------------

    def _keep(self, heard: np.ndarray, end_t: float) -> None:
        self._audio = np.concatenate([self._audio, heard])[-int(KEEP_S * SPEECH_RATE) :]
        self._audio_end = end_t

    async def _confirm(self, end_t: float) -> float | None:
        """The end time of the phrase in the last ``CHECK_WINDOW_S`` up to ``end_t``, if Whisper hears it."""
        assert self._stt is not None
        audio = self.since(end_t - CHECK_WINDOW_S)
        begins = end_t - len(audio) / SPEECH_RATE
        samples = audio.astype(np.float32) / 32768.0
        words = await self._stt.run_decode(samples, self.phrase.capitalize() + ".", self._beam_size)
        last = self.said_in(words)
        return begins + last.end if last is not None else None

    def _collect(self) -> float | None:
        check = self._check
        if check is None or not check.done():
            return None
        self._check = None
        if not check.cancelled() and (error := check.exception()) is not None:
            log.warning("wake check failed", extra={"error": repr(error)})
            return None
        return None if check.cancelled() else check.result()


def _letters(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.casefold())
