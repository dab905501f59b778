"""One speaker, several talkers: the home device's own conversation and the MQTT bridge's announcements.

Each talker (a session) gets a ``Lane``, a sink of its own with the full sink interface (``write``, ``flush``,
``hold``, ``release``, ``drain``, ``begin_utterance``, ``heard_samples``), over the one real sink. Why lanes
rather than sharing the sink: a sink's heard port counts the current utterance, and two sessions writing into
one queue would interleave their sentences and each count the other's audio as heard.

The rule is the simplest one a listener understands: the utterance that starts last has the speaker. A lane
that writes while another lane's utterance is still playing flushes it and takes over; the other lane is told
(``on_preempted``, so its owner cancels the turn, like a barge-in) and drops its writes until its next
utterance, and its heard port keeps what had sounded before the takeover. The echo canceller's reference is
still the real sink's, so whatever any lane plays is cancelled from the microphone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np


class SharedSpeaker:
    def __init__(self, sink: Any) -> None:
        self.sink = sink  # audio.sinks.SpeakerSink (or any _BufferedSink)
        self.owner: Lane | None = None
        self.preemptions = 0

    @property
    def sample_rate(self) -> int:
        return int(self.sink.sample_rate)

    def lane(self, on_preempted: Callable[[], object] | None = None) -> Lane:
        return Lane(self, on_preempted)

    def played_reference(self, t0: float, t1: float) -> np.ndarray:
        return self.sink.played_reference(t0, t1)

    def _take(self, lane: Lane) -> None:
        previous, self.owner = self.owner, lane
        if previous is not None and previous.busy:
            previous.preempt(self.sink.heard_samples())
            self.sink.flush()
            self.preemptions += 1
        self.sink.begin_utterance()


class Lane:
    """A session's view of the shared speaker (an ``audio.sinks.AudioSink``)."""

    def __init__(self, speaker: SharedSpeaker, on_preempted: Callable[[], object] | None) -> None:
        self.speaker = speaker
        self.on_preempted = on_preempted
        self.busy = False  # an utterance of ours is queued or playing
        self.preempted = False
        self._heard = 0  # what had sounded of our utterance when another lane took the speaker
        self._first_t: float | None = None

    @property
    def sample_rate(self) -> int:
        return self.speaker.sample_rate

    @property
    def _owns(self) -> bool:
        return self.speaker.owner is self

    @property
    def first_audible_t(self) -> float | None:
        return self.speaker.sink.first_audible_t if self._owns else self._first_t

    @property
    def played_samples(self) -> int:
        return int(self.speaker.sink.played_samples) if self._owns else self._heard

    def begin_utterance(self) -> None:
        self.preempted, self._heard, self._first_t = False, 0, None
        if self._owns and not self.busy:
            self.speaker.sink.begin_utterance()

    async def write(self, samples: np.ndarray) -> None:
        if self.preempted:
            return  # another talker has the speaker until our next utterance
        if not self._owns or not self.busy:
            if not self._owns:
                self.speaker._take(self)
            self.busy = True
        await self.speaker.sink.write(samples)

    def flush(self) -> None:
        if self._owns:
            self.speaker.sink.flush()
        self.busy = False

    def hold(self) -> None:
        if self._owns:
            self.speaker.sink.hold()

    def release(self) -> None:
        if self._owns:
            self.speaker.sink.release()

    async def drain(self) -> None:
        sink = self.speaker.sink
        while self._owns and sink.queued_samples > 0:
            await asyncio.sleep(sink.block_s / 2)
        if self._owns:
            await asyncio.sleep(max(0.0, sink.last_play_end - time.monotonic()))
        self.busy = False

    def heard_samples(self) -> int:
        return int(self.speaker.sink.heard_samples()) if self._owns else self._heard

    def preempt(self, heard: int) -> None:
        self.busy, self.preempted = False, True
        self._heard, self._first_t = heard, self.speaker.sink.first_audible_t
        if self.on_preempted is not None:
            self.on_preempted()
