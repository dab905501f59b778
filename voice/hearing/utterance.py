"""What a Listener hears: an utterance that ended, with its transcript, and the events ``accept_chunk`` returns."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from voice.events import PauseHeard, SpeechResumed, SpeechStarted, TranscriptPartial
from voice.ports import Transcription
from voice.tasks import start


@dataclass
class Utterance:
    """A stretch of the user's speech that ended; ``final()`` gives its transcript (cheap when the last
    partial pass already saw all of it). Times are on the audio clock (monotonic seconds)."""

    stream: Transcription
    speech_start: float
    speech_end: float  # end of the last voiced sample
    endpoint: float  # when the end of the turn was decided
    cut: bool = False  # ended by the length limit (server.max_turn_audio_s), not by the user
    running_pass: asyncio.Future | None = None  # a partial pass still at work on this utterance
    reason: str = "manual"  # what ended it: complete / max_silence (semantic), vad_silence, cut, manual
    probability: float | None = None  # Smart Turn's last P(complete) for this turn, when it was asked

    @property
    def duration(self) -> float:
        return self.stream.duration

    _final: asyncio.Future[str] | None = field(default=None, repr=False)

    async def final(self) -> str:
        """The final transcript, worked out once. Cancelling a caller does not cancel the work: a turn cut before
        its transcript was ready hands its utterance on to the next turn, which asks again (Turn.hand_over)."""
        if self._final is None:
            self._final = start(self._transcribe(), name="final transcript")
            self._final.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, if nobody asks
        return await asyncio.shield(self._final)

    async def _transcribe(self) -> str:
        """A partial pass still running is waited for, not thrown away (the final then decodes only what it did
        not see)."""
        if self.running_pass is not None:
            await asyncio.wait({self.running_pass})
            self.running_pass = None
        return (await self.stream.final()).strip()


@dataclass
class UtteranceEnded:
    """What ``accept_chunk`` returns when an utterance ends (the VAD's endpoint or the length limit)."""

    utterance: Utterance


ListenEvent = SpeechStarted | TranscriptPartial | PauseHeard | SpeechResumed | UtteranceEnded
