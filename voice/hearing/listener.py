"""The ears of one session: VAD -> streaming STT -> end of turn, with the wake word and the echo gate.

One push API for every place audio comes from (the microphone, a websocket, a Wyoming client, ``bench
speech``): ``accept_chunk(pcm)`` returns what that audio decided (speech started, a partial transcript, a pause
the transcript fully covers, the user going on after a pause, an utterance that ended), and ``finish()`` ends
the utterance in progress and returns its final transcript. The Listener has no thread and no task of its own
except the background work in flight (a Whisper pass in the STT worker, a Smart Turn call in the turn worker):
what it produces comes out of the next ``accept_chunk`` (or ``finish``).

Three ways a turn ends (speech shorter than ``vad.min_speech_ms``, a cough, never starts one):
- ``turn.engine = "smart"`` (the default): the semantic end of turn (voice/hearing/endpointing.py). After
  ``turn.min_silence_ms`` of silence Smart Turn judges from the audio whether the user has finished; "complete"
  ends the turn as soon as the pause's transcript agrees (it does not trail off), else it ends after
  ``turn.max_silence_ms`` of silence;
- ``turn.engine = "vad"``, or the Smart Turn model missing: after ``vad.end_silence_ms`` of silence;
- ``endpointing=False`` (Wyoming asr, a websocket without turn detection): the caller's ``finish()``.

When the user pauses, a Whisper pass starts at once (``PAUSE_PASS_S``), with the final's beam: if the pause
becomes the end of the turn, that pass IS the final transcript (``Utterance.final()`` then decodes nothing),
and its words before the pause are what the semantic end checks. ``PauseHeard`` (the eager end of turn) goes
out as soon as that pass is in and its words read whole (they do not trail off: "Set a timer for..."), before
the end of the turn is decided: the session starts the reply on it and holds its output until the turn ends
there, or drops it when the user goes on. With the semantic end that is the same block in which Smart Turn's
"complete" ends the turn (it waits for this transcript), or a pause of up to ``turn.max_silence_ms`` earlier
when Smart Turn heard the user as not finished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

import numpy as np

from audio.echo import DOUBLE_TALK_THRESHOLD
from audio.end_of_turn import TRANSCRIPT_PROMPT, TurnAction, transcript_unfinished
from audio.frames import SPEECH_RATE, AudioChunk
from audio.vad import Vad, VadEvent
from audio.webrtc import WebRtcAudio
from voice.events import PauseHeard, SpeechResumed, SpeechStarted, TranscriptPartial
from voice.hearing.endpointing import SemanticEnd
from voice.hearing.parts import LOAD_TURN_MODEL, listener_parts
from voice.hearing.utterance import ListenEvent, Utterance, UtteranceEnded
from voice.hearing.wake import WakePhrase
from voice.ports import SpeechRecognizer, Transcription
from voice.tasks import start

ARRIVALS_KEPT = 4096  # unstamped chunks remembered for arrival(): minutes of 20-100 ms network appends
log = logging.getLogger("specvoice.listener")

WAKE_WINDOW_S = 5.0  # after the wake word, speech starting within this many seconds opens a turn
# During a reply, speech the echo gate put down to our own voice opens a turn once the gate hears the user in it
# (their voice began over our echo, or the gate was still learning the room), with up to this much audio before.
LATE_START_S = 0.6
PAUSE_PASS_S = 0.12  # silence inside speech after which a partial pass starts at once (a possible end of turn)
# Whisper's prompt for short speech during a reply, mostly "mhm", "yeah" or a laugh (under the pause prompt a hum
# came out as "Add eggs and..."). No stop words: with "Stop. Wait." a laugh was "Stop, stop, stop.". Not longer
# speech (pre-roll and pause included): in this style "No, I meant the other one" came out as "Mm-hmm.".
HELD_PROMPT = "Mm-hmm. Yeah. Okay. Uh-huh. I see. Ha ha."
HELD_PROMPT_MAX_S = 1.5


class Listener:
    """One audio stream's VAD, streaming transcription and turn ending. Call everything from one event loop."""

    def __init__(
        self,
        stt: SpeechRecognizer,
        vad: Vad | None,
        *,
        partial_interval_s: float = 0.6,
        max_utterance_s: float = 60.0,
        wake: WakePhrase | None = None,
        follow_up_s: float = 0.0,
        echo=None,
        turn: SemanticEnd | None = None,
        denoise: tuple[WebRtcAudio, WebRtcAudio] | None = None,
    ) -> None:
        self.stt = stt
        self.vad = vad  # None: no endpointing, the caller ends utterances with finish()
        # the semantic end of turn (None: the VAD's end_silence_ms ends turns); its VAD must not end them first
        self.turn = turn if vad is not None else None
        self.partial_interval_s = partial_interval_s
        self.max_utterance_s = max_utterance_s
        self.wake = wake  # the device's own microphone only: a turn opens after its phrase (or a reply)
        self.follow_up_s = follow_up_s  # after a reply, speech this soon opens a turn without the wake word
        self.echo = echo  # audio.echo.EchoSuppressor or None
        self.denoise = denoise  # WebRTC noise suppression for what the VAD hears and what Whisper hears, or None
        self._replying = False
        self._reply_ended = False  # a reply has just ended: the follow-up window opens on the next block
        self._stream: Transcription | None = None
        self._start_t = 0.0
        self._clock: float | None = None  # audio time of the next pushed sample
        # unstamped chunks: (audio time of the chunk's end, wall time it arrived), for arrival()
        self._arrivals: deque[tuple[float, float]] = deque(maxlen=ARRIVALS_KEPT)
        self._awake_until = 0.0
        self._pass: asyncio.Task[str | None] | None = None
        self._pass_of: tuple[Transcription | None, float | None] = (None, None)  # its stream and pause
        self._pass_started = self._pause_passed = 0.0  # audio times: the last pass's start, the pause it was for
        self._end_t = 0.0  # audio time of the end of the last chunk
        self._pass_s = 0.0  # wall time the last pass took (passes back off on a slow CPU)
        self._paused_heard = False  # a PauseHeard went out for the current pause
        self._echo_since: float | None = None  # start of the speech the echo gate put down to our voice
        self._last_partial = ""

    @classmethod
    def from_config(
        cls,
        config: Any,
        stt: SpeechRecognizer,
        *,
        endpointing: bool = True,
        vad_path: str | None = None,
        turn_model: Any = LOAD_TURN_MODEL,
    ) -> Listener:
        """The Listener the config describes, on a loaded STT model: its own VAD (when ``endpointing``), wake word,
        echo canceller and noise suppressor (``voice.hearing.parts``). Model paths are resolved there unless the
        caller already did (the Assistant). ``turn_model``: the loaded Smart Turn (``TurnModel``), None for the VAD
        rule; by default it is loaded when ``turn.engine = "smart"``."""
        parts = listener_parts(config, endpointing, vad_path, turn_model)
        return cls(
            stt,
            parts.vad,
            partial_interval_s=config.stt.partial_interval_ms / 1000.0,
            max_utterance_s=config.server.max_turn_audio_s,
            follow_up_s=config.audio.follow_up_s,
            echo=parts.echo,
            turn=parts.turn,
            denoise=parts.denoise,
        )

    @property
    def endpointing(self) -> bool:
        return self.vad is not None

    @property
    def end_of_turn(self) -> str:
        """The rule that ends turns: "smart", "vad", or "manual" (no endpointing)."""
        return "manual" if self.vad is None else "vad" if self.turn is None else "smart"

    @property
    def longest_wait_s(self) -> float:
        """The longest silence after which a turn ends (what a file needs after its last word)."""
        if self.vad is None:
            return 0.0
        return self.turn.settings.max_silence_ms / 1000 if self.turn is not None else self.vad.end_silence_s

    @property
    def replying(self) -> bool:
        """Set by the session: a reply is under way, so speech now is a barge-in (no wake word needed, echo gate
        on). When it ends, the user may answer or ask again without the wake word for ``follow_up_s``."""
        return self._replying

    @replying.setter
    def replying(self, now: bool) -> None:
        self._reply_ended = self._reply_ended or (self._replying and not now)
        self._replying = now

    @property
    def hearing(self) -> bool:
        """An utterance is in progress."""
        return self._stream is not None

    @property
    def committed(self) -> str:
        """The words of the utterance in progress that will not change any more."""
        return self._stream.committed if self._stream is not None else ""

    @property
    def clock(self) -> float | None:
        return self._clock

    # ---- audio in ----------------------------------------------------------------------------------------------

    async def accept_chunk(
        self, samples: np.ndarray, t: float | None = None, reference: np.ndarray | None = None
    ) -> list[ListenEvent]:
        """Feed 16 kHz mono int16 audio. ``t``: monotonic time of its first sample (default: contiguous with the
        previous chunk, or ending now). ``reference``: what the speaker played over the same interval, for the
        echo canceller. Returns the events this audio (and any partial pass that finished) decided."""
        samples = np.asarray(samples)
        if samples.dtype != np.int16 or samples.ndim != 1:
            raise ValueError(
                f"the listener takes int16 mono samples at {SPEECH_RATE} Hz (got {samples.dtype}, "
                f"shape {samples.shape}); fix: convert with audio.resample first"
            )
        t = self._stamp(len(samples), t)
        heard = samples  # what Whisper hears; the VAD and the gate hear the echo canceller's cleaned output
        if self.echo is not None:  # always in the path, so its constant buffering delay never jumps
            samples, heard = self.echo.process(samples, reference), self.echo.linear
            t -= self.echo.delay_samples / SPEECH_RATE
        if self.denoise is not None:  # after the echo canceller, whose echo path must stay linear
            samples, heard = self.denoise[0].process(samples), self.denoise[1].process(heard)
            t -= self.denoise[0].delay_samples / SPEECH_RATE
        chunk = AudioChunk(samples, SPEECH_RATE, t)
        events: list[ListenEvent] = self._collect_pass()
        if self.vad is None:
            if self._stream is None:
                self._open(t, np.zeros(0, np.int16))
            self._add(heard)
        else:
            events += self._endpointing(chunk, heard)
        self._end_t = chunk.end_t
        if self._stream is not None and self._stream.duration > self.max_utterance_s:
            events.append(self._close(chunk.end_t, chunk.end_t, cut=True))
        if self._stream is not None:
            self._maybe_pass(chunk.end_t)
        return events

    def _stamp(self, n: int, t: float | None) -> float:
        """The chunk's start time. Unstamped audio (a network client) is contiguous with the previous chunk, and
        never earlier than a chunk ending now could be: a client that sends faster than real time runs the audio
        clock ahead (it never jumps back, which would stretch the VAD's silence timers), one that paused jumps it
        forward to now."""
        if t is None:
            now = time.monotonic()
            earliest = now - n / SPEECH_RATE
            t = earliest if self._clock is None else max(self._clock, earliest)
            self._arrivals.append((t + n / SPEECH_RATE, now))
        self._clock = t + n / SPEECH_RATE
        return t

    def arrival(self, t: float) -> float:
        """When the audio at time ``t`` (audio clock) reached us, on the wall clock: the time a latency trace
        wants. For a device the two clocks are one; a network client that sends faster than real time runs the
        audio clock ahead of the wall, and measured from there the reply would seem to start before the user
        stopped speaking (voice-to-voice 0). Times older than the chunks kept are returned as they are."""
        for end, arrived in self._arrivals:
            if end >= t:
                return min(t, arrived)
        return t

    def _endpointing(self, chunk: AudioChunk, heard: np.ndarray) -> list[ListenEvent]:
        assert self.vad is not None
        if self._reply_ended:
            self._reply_ended = False
            self._awake_until = max(self._awake_until, chunk.t + self.follow_up_s)
        double_talk = self.replying and self.echo is not None and self.echo.double_talk()
        threshold = min(DOUBLE_TALK_THRESHOLD, self.vad.threshold) if double_talk else None
        vad_events = self.vad.process(chunk, threshold, keep=heard)
        if self.wake is not None and (woke := self._woken(chunk, heard, vad_events)) is not None:
            self._awake_until = max(self._awake_until, woke + WAKE_WINDOW_S)
            if self.vad.speaking and self._stream is None and not vad_events:
                # "hey jarvis, what time is it" in one breath: the request starts right after the wake phrase
                vad_events = [VadEvent("speech_start", woke, self.wake.since(woke), decided_t=chunk.end_t)]
        events: list[ListenEvent] = []
        started = False
        for event in vad_events:
            if event.kind == "speech_start":
                if self._addressed(event):
                    self._open(event.t, event.audio if event.audio is not None else np.zeros(0, np.int16))
                    events.append(SpeechStarted(event.t))
                    started = True
                elif self.replying:
                    self._echo_since = event.t  # put down to our own voice, for now
            elif self._stream is not None:  # the VAD rule (with the semantic end: its backstop)
                decided = event.decided_t if event.decided_t is not None else chunk.end_t
                events.append(self._close(event.t, decided, reason="vad_silence"))
        if not (self.replying and self.vad.speaking):
            self._echo_since = None
        elif self._echo_since is not None and self.vad.pause_since is None and self._addressed(None):
            # the user began over our echo, after the VAD's start: the echo gate hears them only now
            t, self._echo_since = max(self._echo_since, chunk.end_t - LATE_START_S), None
            self._open(t, self.vad.since(t))
            events.append(SpeechStarted(t))
            started = True
        if self._stream is not None and not started:
            self._add(heard)
            if self._paused_heard and self.vad.pause_since is None:
                self._paused_heard = False  # the user goes on: the pause transcript was not the whole turn
                events.append(SpeechResumed())
        if self.turn is not None and self._stream is not None:
            events += self._semantic_end(chunk.end_t)
        return events

    def _woken(self, chunk: AudioChunk, heard: np.ndarray, vad_events: list[VadEvent]) -> float | None:
        """The end of a wake phrase the wake word just confirmed, if any (voice/hearing/wake.py)."""
        assert self.wake is not None and self.vad is not None
        asleep = not self.replying and self._stream is None and chunk.t > self._awake_until
        started = next((e.t for e in vad_events if e.kind == "speech_start"), None)
        return self.wake.process(chunk, heard, started, self.vad.speaking, asleep)

    def _semantic_end(self, t: float) -> list[ListenEvent]:
        """One block of the semantic end of turn: tell the policy what the VAD heard, hand it the answers that
        came in, end the turn when it says so."""
        assert self.vad is not None and self.turn is not None and self._stream is not None
        turn, pause = self.turn, self.vad.pause_since
        step = turn.observe(t, self.vad.speaking and pause is None, pause)
        if step.action is not TurnAction.END:
            step = turn.poll(t) or step
        if step.action is TurnAction.END:
            self.vad.reset()  # the VAD starts over: speech from now on is a new utterance
            ended = self._close(pause if pause is not None else t, t, reason=step.reason)
            ended.utterance.probability = turn.policy.last_probability
            return [ended]
        return []

    def _addressed(self, event: VadEvent | None) -> bool:
        """Speech opens a turn unless a wake word is required and was not heard, or it is our own voice."""
        if self.replying:
            # during a reply: a barge-in needs no wake word, but the echo gate must agree it is the user
            return self.echo is None or self.echo.user_speech_likely()
        return self.wake is None or event is not None and event.t <= self._awake_until

    # ---- utterances -----------------------------------------------------------------------------------------

    def _open(self, t: float, preroll: np.ndarray) -> None:
        self._stream = self.stt.stream()
        self._start_t = t
        self._pass_started = t
        self._paused_heard = False
        self._last_partial = ""
        if len(preroll):
            self._stream.add(preroll)
        if self.turn is not None:
            self.turn.start_turn(preroll)

    def _add(self, samples: np.ndarray) -> None:
        assert self._stream is not None
        self._stream.add(samples)
        if self.turn is not None:
            self.turn.add(samples)

    def _close(self, speech_end: float, endpoint: float, cut: bool = False, reason: str = "manual") -> UtteranceEnded:
        assert self._stream is not None
        running, self._pass = self._pass, None  # it belongs to this utterance now: final() waits for it
        self._pass_of = (None, None)
        utterance = Utterance(
            self._stream, self._start_t, speech_end, endpoint, cut, running, reason="cut" if cut else reason
        )
        self._stream = None
        if cut and self.vad is not None:
            self.vad.reset()  # the VAD starts over: speech that goes on is a new utterance
        if self.turn is not None:
            self.turn.policy.reset()
        return UtteranceEnded(utterance)

    def end(self) -> UtteranceEnded | None:
        """End the utterance in progress now (a client committed, the audio stopped); None when there is none."""
        if self._stream is None:
            return None
        end = self._clock if self._clock is not None else time.monotonic()
        return self._close(end, end)

    async def finish(self) -> str:
        """``end()`` and the final transcript of what it ended; "" when there was nothing."""
        ended = self.end()
        return await ended.utterance.final() if ended is not None else ""

    def clear(self) -> None:
        """Drop the utterance in progress (input_audio_buffer.clear)."""
        self._stream = None
        if self.vad is not None:
            self.vad.reset()
        if self.turn is not None:
            self.turn.policy.reset()

    async def pause_decided(self, longest_s: float = 2.0) -> None:
        """Until the user is not in a pause that may end the turn (at most ``longest_s``): background work (the
        LLM's warm-up prefill) waits here, so the pause's Whisper pass and Smart Turn, which decide when the
        reply can start, have the CPU."""
        deadline = time.monotonic() + longest_s
        while self._stream is not None and self.vad is not None and self.vad.pause_since is not None:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.02)

    async def settle(self) -> None:
        """Wait for the background work (Whisper pass, Smart Turn call); what it decided comes out of the next
        ``accept_chunk``. For lockstep runs (tests): the decisions then depend on the audio only."""
        turn, wake = (self.turn.in_flight if self.turn else None), (self.wake.in_flight if self.wake else None)
        pending = {f for f in (self._pass, turn, wake) if f is not None}
        if pending:
            await asyncio.wait(pending)

    async def close(self) -> None:
        """Drop what is in progress; work still running in a worker is waited for (it cannot be cut)."""
        self._stream = None
        if self._pass is not None:
            await asyncio.wait({self._pass})
            self._pass = None
        if self.turn is not None:
            await self.turn.close()
        if self.wake is not None:
            await self.wake.settle()

    # ---- partial passes -------------------------------------------------------------------------------------

    def _maybe_pass(self, now: float) -> None:
        """Start a partial pass when none runs and either the interval passed or a pause just began. The pass
        at a pause decodes with the final's beam (and, for the semantic end, the prompt that makes Whisper
        write a fragment as one: "Turn on the..."), since it becomes the final if the turn ends there."""
        stream = self._stream
        if self._pass is not None or stream is None:
            return
        interval = max(self.partial_interval_s, 2 * self._pass_s)  # at most half the time decoding
        pause = self.vad.pause_since if self.vad is not None else None
        # the first pass to start in a pause is its pass, even one the interval started; one started before the
        # pause was known (the VAD dates it back to the speech's end) is not, so another follows (decoding nothing new)
        new_pause = pause if pause is not None and pause != self._pause_passed else None  # no pass of its own yet
        if now - self._pass_started >= interval or new_pause is not None and now - new_pause >= PAUSE_PASS_S:
            self._pass_started, self._pause_passed = now, self._pause_passed if new_pause is None else new_pause
            self._pass_of = (stream, new_pause)
            if self.replying:
                style = HELD_PROMPT if stream.duration <= HELD_PROMPT_MAX_S else None
            else:
                style = TRANSCRIPT_PROMPT if new_pause is not None and self.turn else None
            if new_pause is not None:
                work = stream.partial(style=style, final_beam=True, min_new_s=0.0)
            else:
                work = stream.partial(style=style)
            self._pass = start(self._run_pass(work), name="partial pass")

    async def _run_pass(self, work: Coroutine[Any, Any, str | None]) -> str | None:
        started = time.monotonic()
        try:
            return await work
        finally:
            self._pass_s = time.monotonic() - started

    def _collect_pass(self) -> list[ListenEvent]:
        """Events from a partial pass that finished since the last chunk."""
        task = self._pass
        if task is None or not task.done():
            return []
        self._pass = None
        (of_stream, of_pause), self._pass_of = self._pass_of, (None, None)
        ok = not task.cancelled() and task.exception() is None
        if not task.cancelled() and not ok:  # the final pass will try again; say why this one failed
            log.warning("partial transcription failed", extra={"error": repr(task.exception())})
        text = task.result() if ok else None
        events: list[ListenEvent] = []
        stream = self._stream
        if stream is None or stream is not of_stream:
            return events  # the utterance it was for was dropped (clear)
        if text and text != self._last_partial:
            self._last_partial = text
            events.append(TranscriptPartial(text, stream.committed))
        pause = self.vad.pause_since if self.vad is not None else None
        whole = pause is not None and not self._paused_heard and stream.nothing_new() and bool(stream.text)
        if self.turn is not None:
            if not (ok and of_pause is not None and of_pause == pause):
                return events
            # the pass that started in this pause saw every word before it: the semantic end's transcript
            before = stream.text_before(stream.elapsed - (self._end_t - pause))
            self.turn.transcript(before)
            whole = whole and not transcript_unfinished(before)  # a reply to "Set a timer for..." is wasted
        if whole:
            self._paused_heard = True
            events.append(PauseHeard(stream.text))  # before the end of the turn, which may follow in this block
        return events
