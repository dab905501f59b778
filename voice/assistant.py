"""The assistant: models loaded once, and sessions that run turns (speech or text in, speech out).

A ``Session`` is one conversation with its own history, VAD, STT stream and turn state machine:

    idle --speech_start--> listening --speech_end--> thinking --first audio--> speaking --done--> idle
                                ^                        |                         |
                                +------ barge-in --------+-------------------------+

Speech from the user while the assistant thinks or speaks is a barge-in: the reply task is cancelled (the
decoder stops between steps), queued audio is flushed, and the assistant's last message is trimmed to the words
the user actually heard. Short noises never reach that point: the VAD only reports speech that lasted
``vad.min_speech_ms``. Every stage runs under a timeout, and any failure ends the turn with a ``TurnError``
event and leaves the session idle, ready for the next turn.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

import numpy as np

from audio.frames import AudioChunk
from audio.vad import Vad, VadEvent
from voice.chunker import Chunker
from voice.config import Config
from voice.events import (ActionRequested, Event, EventHandler, SpeechStarted, SpeechStopped, State, StateChanged,
                          TranscriptFinal, TranscriptPartial, TurnDone, TurnError)
from voice.latency import LatencyStats, LatencyTrace
from voice.reply import ReplyOutcome, StageError, speak_reply

log = logging.getLogger("specvoice.assistant")
MIC_RATE = 16000
WAKE_WINDOW_S = 5.0  # after the wake word, speech starting within this many seconds opens a turn
PAUSE_DECODE_S = 0.12  # silence after speech that starts an early decode (see Session._watch_for_pause)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def decode_settings(config: Config, **overrides):
    """The decoder settings for a turn, from ``config.llm`` (``overrides`` for benchmarks: mode="target")."""
    from llm.engine import DecodeSettings

    return DecodeSettings.from_config({**config.llm.model_dump(), **overrides})


class Assistant:
    """Every model, loaded once; many sessions share it (generation is serialised inside the engine)."""

    def __init__(self, config: Config, engine, stt, tts, vad_path: str, wake_dir: str | None = None) -> None:
        self.config = config
        self.wake_dir = wake_dir
        self.engine = engine
        self.stt = stt
        self.tts = tts
        self.vad_path = vad_path
        self.tts_sample_rate: int = tts.sample_rate
        self.stats = LatencyStats()
        self._turn_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._listeners: list[Callable[[str, Event], None]] = []
        self._sessions: set[Session] = set()

    @classmethod
    async def load(cls, config: Config) -> Assistant:
        return await asyncio.to_thread(cls.load_sync, config)

    @classmethod
    def load_sync(cls, config: Config) -> Assistant:
        from llm.engine import Engine
        from voice.models import resolve
        from voice.stt import SpeechToText
        from voice.tts import TextToSpeech

        m, llm = config.models, config.llm
        started = time.monotonic()
        target = resolve(m.target, "llm", m.cache_dir).location
        draft = resolve(m.draft, "llm", m.cache_dir).location if (m.draft and llm.mode == "draft") else None
        engine = Engine.load(target, draft, device=llm.device, dtype=llm.dtype, mode=llm.mode,
                             draft_quantize=llm.draft_quantize, draft_vocab=llm.draft_vocab, threads=llm.threads,
                             context_limit=llm.context_limit)
        stt = SpeechToText(resolve(m.stt, "stt", m.cache_dir), config.stt)
        tts = TextToSpeech(resolve(m.tts, "tts", m.cache_dir), config.tts)
        vad_path = str(resolve(m.vad, "vad", m.cache_dir).path) if config.vad.engine == "silero" else ""
        wake_dir = str(resolve(m.wake_word, "wake", m.cache_dir).path) if m.wake_word else None
        log.info("assistant loaded", extra={"seconds": round(time.monotonic() - started, 2), "target": m.target,
                                            "draft": draft, "stt": m.stt, "tts": m.tts})
        return cls(config, engine, stt, tts, vad_path, wake_dir)

    def session(self, on_event: EventHandler | None = None, *, sink=None, name: str = "") -> Session:
        session = Session(self, on_event or (lambda event: None), sink=sink, name=name)
        self._sessions.add(session)
        return session

    def add_listener(self, fn: Callable[[str, Event], None]) -> None:
        self._listeners.append(fn)

    @property
    def generation_turn(self) -> asyncio.Lock:
        """One generation at a time, whole turns first come first served (asyncio.Lock wakes waiters in FIFO
        order): on a CPU, interleaving the steps of eight replies makes all eight late instead of one.
        One lock per event loop, so an Assistant can outlive a loop (tests, embedding)."""
        loop = asyncio.get_running_loop()
        if self._turn_lock is None or self._turn_lock[0] is not loop:
            self._turn_lock = (loop, asyncio.Lock())
        return self._turn_lock[1]

    def remove_listener(self, fn: Callable[[str, Event], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def _broadcast(self, session_id: str, event: Event) -> None:
        for fn in self._listeners:
            try:
                fn(session_id, event)
            except Exception:  # a broken listener must not break the turn
                log.exception("event listener failed")

    async def close(self) -> None:
        for session in list(self._sessions):
            await session.close()


class Session:
    """One conversation. All methods are called from the event loop."""

    def __init__(self, assistant: Assistant, on_event: EventHandler, *, sink=None, name: str = "") -> None:
        cfg = assistant.config
        self.assistant = assistant
        self.config = cfg
        self.id = name or uuid.uuid4().hex[:8]
        self.sink = sink
        self.state = State.IDLE
        self.vad_enabled = True
        self.decode = decode_settings(cfg)
        self._on_event = on_event
        self._system_prompt = cfg.dialog.system_prompt
        self._allowed = dict(cfg.mqtt.allowed_actions)
        if self._allowed:
            from voice.actions import action_instructions

            self._system_prompt += "\n\n" + action_instructions(self._allowed)
        self.conversation = assistant.engine.conversation(self._system_prompt, cfg.dialog.history_tokens)
        # prefill the system prompt while the user is still speaking: the first reply then pays only for its words
        self._warm_task = asyncio.create_task(self.conversation.warm()) if _loop_running() else None
        v = cfg.vad
        self.vad = Vad(assistant.vad_path, engine=v.engine, threshold=v.threshold, min_speech_ms=v.min_speech_ms,
                       end_silence_ms=v.end_silence_ms, preroll_ms=v.preroll_ms, sample_rate=MIC_RATE)
        self._turn_ids = itertools.count(1)
        self._utterance = None  # StreamingTranscription of the speech in progress
        self._listen_trace: LatencyTrace | None = None
        self._partial_task: asyncio.Task | None = None
        self._partial_pass: asyncio.Future | None = None
        # set when the user pauses: a decode starts at once, so that if the pause becomes the end of the turn
        # the final transcript is (nearly) ready when the VAD decides it, instead of starting then
        self._pause_heard = asyncio.Event()
        self._quiet_s = 0.0
        self._early: _EarlyReply | None = None  # a reply started on the pause transcript (dialog.early_reply)
        self.early_replies = {"started": 0, "adopted": 0}  # the rest were dropped; for benchmarks and tests
        self._turn_task: asyncio.Task | None = None
        self._manual_audio: list[np.ndarray] = []
        self._audio_clock: float | None = None  # monotonic time of the next pushed sample
        self._closed = False
        # optional wake word: speech only opens a turn within a few seconds after it was heard
        self._wake = None
        self._awake_until = 0.0
        if assistant.wake_dir:
            from audio.wakeword import WakeWord

            self._wake = WakeWord(cfg.models.wake_word, assistant.wake_dir)
        self._echo = None
        if cfg.audio.echo != "off":
            from audio.echo import EchoSuppressor

            self._echo = EchoSuppressor(MIC_RATE, mode=cfg.audio.echo, filter_ms=cfg.audio.echo_filter_ms)

    # ---- events and state ---------------------------------------------------------------------------------

    @property
    def history(self) -> list[dict]:
        return self.conversation.messages

    def emit(self, event: Event) -> None:
        try:
            self._on_event(event)
        except Exception:
            log.exception("session event handler failed", extra={"session": self.id})
        self.assistant._broadcast(self.id, event)

    def _set_state(self, state: State) -> None:
        if state != self.state:
            self.state = state
            self.emit(StateChanged(state))

    def _new_trace(self) -> LatencyTrace:
        return LatencyTrace(next(self._turn_ids), budget_ms=self.config.budget.model_dump())

    @property
    def replying(self) -> bool:
        return self._turn_task is not None and not self._turn_task.done()

    # ---- audio in --------------------------------------------------------------------------------------------

    async def push_audio(self, samples: np.ndarray, t: float | None = None,
                         reference: np.ndarray | None = None) -> None:
        """Feed microphone audio (int16 mono 16 kHz). ``t`` is the monotonic time of its first sample; without
        it, consecutive pushes are assumed contiguous and the first one to end now. ``reference`` is what the
        speaker played during the same interval (16 kHz): the echo suppressor removes it, so our own voice never
        counts as the user's."""
        if self._closed:
            raise RuntimeError(f"session {self.id} is closed")
        samples = np.asarray(samples)
        if samples.dtype != np.int16 or samples.ndim != 1:
            raise ValueError("push_audio takes int16 mono samples at 16 kHz; convert (audio.resample) first")
        if t is None:
            now = time.monotonic()
            t = self._audio_clock if self._audio_clock and abs(self._audio_clock + len(samples) / MIC_RATE - now) < 1.0 \
                else now - len(samples) / MIC_RATE
        self._audio_clock = t + len(samples) / MIC_RATE
        if self._echo is not None:  # always in the path, so its constant buffering delay never jumps
            samples = self._echo.process(samples, reference)
            t -= self._echo.delay_samples / MIC_RATE
        if not self.vad_enabled:
            self._manual_audio.append(samples.copy())
            return
        chunk = AudioChunk(samples, MIC_RATE, t)
        woke = self._wake is not None and self._wake.process(chunk)
        if woke:
            self._awake_until = chunk.end_t + WAKE_WINDOW_S
            log.info("wake word heard", extra={"session": self.id})
        events = self.vad.process(chunk)
        if woke and self.vad.speaking and self._utterance is None and not events:
            # "hey jarvis, what time is it" in one breath: the request starts right after the wake phrase
            events = [VadEvent("speech_start", chunk.end_t, np.zeros(0, np.int16), decided_t=chunk.end_t)]
        started = False
        for event in events:
            if event.kind == "speech_start" and self._wake is not None and event.t > self._awake_until \
                    and not self.replying:
                continue  # not addressed to us
            if event.kind == "speech_start":
                await self._on_speech_start(event)
                started = True
            else:
                await self._on_speech_end(event)
        if self._utterance is not None and not started:
            self._utterance.add(samples)
            self._watch_for_pause(len(samples) / MIC_RATE)

    def _watch_for_pause(self, seconds: float) -> None:
        if self.vad.last_score >= self.config.vad.threshold - 0.15:
            self._quiet_s = 0.0
            if self._early is not None:  # the user goes on: the early reply answered a question not yet asked
                self._early.cancel()
            return
        before, self._quiet_s = self._quiet_s, self._quiet_s + seconds
        if before < PAUSE_DECODE_S <= self._quiet_s:
            self._pause_heard.set()

    async def _on_speech_start(self, event: VadEvent) -> None:
        if self.replying:
            if self._echo is not None and not self._echo.user_speech_likely():
                log.info("speech during reply explained by playback: not a barge-in", extra={"session": self.id})
                return
            await self._barge_in()
        self._listen_trace = self._new_trace()
        self._listen_trace.mark("speech_start", event.t)
        self._utterance = self.assistant.stt.stream()
        self._quiet_s = 0.0
        self._pause_heard.clear()
        if event.audio is not None and len(event.audio):
            self._utterance.add(event.audio)
        self._set_state(State.LISTENING)
        self.emit(SpeechStarted(event.t))
        self._partial_task = asyncio.create_task(self._partials(self._utterance))

    async def _partials(self, utterance) -> None:
        """Partial transcripts while the user speaks; one decode at a time, never blocking audio intake."""
        interval = self.config.stt.partial_interval_ms / 1000.0
        last, wait = None, interval
        while True:
            try:
                async with asyncio.timeout(wait):
                    await self._pause_heard.wait()
            except TimeoutError:
                pass
            self._pause_heard.clear()
            # shielded: a pass already running in the worker thread is finished and kept at speech end (the
            # final transcript then decodes only what that pass did not see), never thrown away
            started = time.monotonic()
            self._partial_pass = asyncio.ensure_future(utterance.partial())
            text = await asyncio.shield(self._partial_pass)
            # on a slow CPU back off, so partials never starve the final decode: at most half the time decoding
            wait = max(interval, 2 * (time.monotonic() - started))
            if text and text != last:
                last = text
                self.emit(TranscriptPartial(text))
            if self._quiet_s >= PAUSE_DECODE_S and utterance.nothing_new():
                await self._start_early(utterance.text)

    async def _start_early(self, text: str) -> None:
        """The user paused and the transcript covers all their speech: start the reply now, while the VAD still
        waits to be sure the turn is over. Its tokens are held, not spoken, until the endpoint confirms the
        same words (then the reply is already under way: the endpointing wait is hidden); if the user goes on,
        or the final transcript differs, it is cancelled and forgotten."""
        if not self.config.dialog.early_reply or not text.strip() or self.replying:
            return
        if self._early is not None:
            if self._early.text == text and not self._early.cancelled:
                return
            await self._drop_early()
        self._early = _EarlyReply(text, self)
        self.early_replies["started"] += 1

    async def _drop_early(self) -> None:
        early = self._early
        if early is not None:
            await early.discard()
            if self._early is early:
                self._early = None

    async def _stop_partials(self) -> None:
        if self._partial_task is not None:
            self._partial_task.cancel()
            await asyncio.gather(self._partial_task, return_exceptions=True)
            self._partial_task = None
        if self._partial_pass is not None:
            await asyncio.gather(self._partial_pass, return_exceptions=True)
            self._partial_pass = None

    async def _on_speech_end(self, event: VadEvent) -> None:
        if self._utterance is None or self._listen_trace is None:
            return
        await self._stop_partials()
        trace, utterance = self._listen_trace, self._utterance
        self._utterance = self._listen_trace = None
        trace.mark("speech_end", event.t)
        trace.mark("endpoint", event.decided_t if event.decided_t is not None else time.monotonic())
        self.emit(SpeechStopped(event.t))
        self._turn_task = asyncio.create_task(self._voice_turn(utterance, trace))

    async def commit_audio(self) -> None:
        """End the user turn now (manual turn taking, or a client that knows better than the VAD)."""
        if self.vad_enabled:
            if self._utterance is not None:
                await self._on_speech_end(VadEvent("speech_end", self._audio_clock or time.monotonic(), None,
                                                   decided_t=time.monotonic()))
            return
        audio, self._manual_audio = self._manual_audio, []
        if not audio:
            return
        trace = self._new_trace()
        end = self._audio_clock or time.monotonic()
        trace.mark("speech_end", end)
        trace.mark("endpoint", time.monotonic())
        utterance = self.assistant.stt.stream()
        utterance.add(np.concatenate(audio))
        if self.replying:
            await self._barge_in()
        self._turn_task = asyncio.create_task(self._voice_turn(utterance, trace))

    def clear_audio(self) -> None:
        self._manual_audio.clear()

    async def transcribe(self, samples: np.ndarray) -> str:
        """Speech to text only (no turn): for the Wyoming asr service."""
        stream = self.assistant.stt.stream()
        stream.add(np.asarray(samples, dtype=np.int16))
        return await stream.final()

    # ---- turns -----------------------------------------------------------------------------------------------

    async def _voice_turn(self, utterance, trace: LatencyTrace) -> TurnDone | None:
        self._set_state(State.THINKING)
        early, self._early = self._early, None  # a reply already started on the pause transcript, if any
        try:
            async with asyncio.timeout(self.config.dialog.stt_timeout_s):
                text = (await utterance.final()).strip()
        except asyncio.CancelledError:  # barge-in before the transcript was ready: nothing was said back
            if early is not None:
                await early.discard()
            trace.mark("turn_end", time.monotonic())
            self.emit(TurnDone(trace.turn_id, utterance.text, "", True, trace.to_dict()))
            raise
        except Exception as exc:
            if early is not None:
                await early.discard()
            return self._fail(trace, "stt", exc)
        trace.mark("stt_final", time.monotonic())
        self.emit(TranscriptFinal(text))
        if early is not None and (early.text.strip() != text or early.cancelled):
            await early.discard()  # the guess was wrong: it is forgotten, and the real question answered
            early = None
        if not text:
            self._set_state(State.IDLE)
            return None
        return await self._reply(text, trace, speak=True, early=early)

    async def ask(self, text: str, *, speak: bool = True) -> TurnDone:
        """A text turn: the reply is generated (and spoken) with the same events as a voice turn."""
        text = text.strip()
        if not text:
            raise ValueError("ask() needs a non-empty question")
        if self.replying:
            await self._barge_in()
        trace = self._new_trace()
        trace.mark("turn_start", time.monotonic())
        self._turn_task = asyncio.create_task(self._reply(text, trace, speak=speak))
        return await asyncio.shield(self._turn_task)

    async def wait_turn(self) -> TurnDone | None:
        """Wait for the turn in progress (if any) to finish; returns its TurnDone."""
        task = self._turn_task
        return await asyncio.shield(task) if task is not None else None

    async def say(self, text: str) -> None:
        """Speak ``text`` now, without the LLM (announcements, Wyoming tts)."""
        if self.replying:
            await self._barge_in()

        async def once() -> AsyncIterator[str]:
            yield text

        trace = self._new_trace()
        outcome = ReplyOutcome()
        if self.sink is not None:
            self.sink.begin_utterance()
        try:
            await speak_reply(once(), tts=self.assistant.tts, chunker=self._chunker(), emit=self.emit,
                              trace=trace, outcome=outcome, sink=self.sink,
                              on_speaking=lambda: self._set_state(State.SPEAKING))
        finally:
            self._set_state(State.IDLE)

    def _chunker(self) -> Chunker:
        tts = self.config.tts
        return Chunker(tts.first_fragment_chars, tts.max_fragment_words, first_fragment_words=tts.first_fragment_words)

    async def _reply(self, text: str, trace: LatencyTrace, *, speak: bool, early: _EarlyReply | None = None
                     ) -> TurnDone:
        self._set_state(State.THINKING)
        parser = None
        if self._allowed:
            from voice.actions import ActionParser

            parser = ActionParser(self._allowed)
        outcome = ReplyOutcome()
        if self.sink is not None and speak:
            self.sink.begin_utterance()
        interrupted = False
        error: StageError | None = None
        previous_last = early.previous_last if early is not None else (self.history[-1] if self.history else None)
        turn = _Turn(self.assistant.generation_turn)
        try:
            if early is not None:
                trace.extra["early_reply"] = True
                self.early_replies["adopted"] += 1
                pieces = early.adopt()
            else:
                await turn.acquire()  # waiting for other sessions' turns is not counted against the turn timeout
                pieces = _release_at_end(self.conversation.reply(text, self.decode), turn)
            async with asyncio.timeout(self.config.dialog.turn_timeout_s):
                await speak_reply(
                    pieces,
                    tts=self.assistant.tts if speak else None,
                    chunker=self._chunker(), emit=self.emit, trace=trace, outcome=outcome,
                    sink=self.sink if speak else None,
                    text_filter=parser.push if parser else None, text_flush=parser.flush if parser else None,
                    on_speaking=lambda: self._set_state(State.SPEAKING))
        except asyncio.CancelledError:
            interrupted = True
        except StageError as exc:
            error = exc
        except TimeoutError as exc:
            error = StageError("timeout", exc)
        finally:
            turn.release()
        trace.mark("turn_end", time.monotonic())
        heard = outcome.text.strip()
        if interrupted and speak:
            heard = outcome.heard_text(self.sink.played_samples if self.sink is not None else None)
        replied = bool(self.history) and self.history[-1] is not previous_last and self.history[-1]["role"] == "assistant"
        if (interrupted or error is not None) and replied:
            try:
                self.conversation.trim_last_reply(heard)
            except ValueError:  # what was spoken is not a prefix of the raw reply (action markers removed)
                log.info("history kept untrimmed", extra={"session": self.id, "heard": heard})
        stats = self.conversation.last_stats
        trace.extra.update({"interrupted": interrupted,
                            "decoder": stats.to_dict() if stats is not None else None})
        for request in (parser.requests if parser else []):
            self.emit(request if isinstance(request, ActionRequested) else ActionRequested(**request))
        if error is not None:
            self.emit(TurnError(trace.turn_id, error.stage, str(error)))
            log.warning("turn failed", extra={"session": self.id, "stage": error.stage, "error": str(error)})
        done = TurnDone(trace.turn_id, text, heard, interrupted, trace.to_dict())
        self.assistant.stats.add(trace)
        self.emit(done)
        log.info("turn", extra={"session": self.id, **trace.to_dict()})
        if not interrupted:
            self._set_state(State.IDLE)
        return done

    def _fail(self, trace: LatencyTrace, stage: str, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self.emit(TurnError(trace.turn_id, stage, message))
        log.warning("turn failed", extra={"session": self.id, "stage": stage, "error": message})
        self._set_state(State.IDLE)

    async def _barge_in(self) -> None:
        """Stop the reply in progress: cancel generation and TTS, flush audio, trim history (in ``_reply``)."""
        await self._drop_early()
        task = self._turn_task
        if self.sink is not None:
            self.sink.flush()
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._turn_task = None

    async def cancel(self) -> None:
        """Client-requested stop (response.cancel): same as a barge-in, then idle."""
        await self._barge_in()
        self._set_state(State.IDLE)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._warm_task is not None:
            self._warm_task.cancel()
            await asyncio.gather(self._warm_task, return_exceptions=True)
        await self._stop_partials()
        await self._barge_in()
        self.assistant._sessions.discard(self)


class _Turn:
    """This reply's hold on the shared generation lock; released exactly once, whichever path ends first."""

    def __init__(self, lock: asyncio.Lock) -> None:
        self.lock, self.held = lock, False

    async def acquire(self) -> None:
        await self.lock.acquire()
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.lock.release()


class _EarlyReply:
    """A reply generated from the pause transcript before the endpoint. Its emissions wait in a queue until the
    turn adopts it (``adopt``); if it is cancelled first, it makes the conversation forget it, in its own task,
    so the history is clean however the cancel came about."""

    def __init__(self, text: str, session: Session) -> None:
        self.text = text
        self.conversation = session.conversation
        self.previous_last = session.history[-1] if session.history else None
        self.cancelled = False
        self._adopted = False
        self._messages_before = list(session.history)
        self._queue: asyncio.Queue = asyncio.Queue()  # Emission, then None at the end, or the exception raised
        self._task = asyncio.create_task(self._generate(session))

    async def _generate(self, session: Session) -> None:
        turn = _Turn(session.assistant.generation_turn)
        try:
            await turn.acquire()
            async for emission in _release_at_end(self.conversation.reply(self.text, session.decode), turn):
                self._queue.put_nowait(emission)
        except asyncio.CancelledError:
            if not self._adopted and self.conversation.messages != self._messages_before:
                self.conversation.forget_last_turn()  # the reply got as far as the history: take it back
            raise
        except Exception as exc:  # surfaces in the turn that adopts this reply
            self._queue.put_nowait(exc)
        finally:
            turn.release()
            self._queue.put_nowait(None)

    def cancel(self) -> None:
        if not self._adopted:
            self.cancelled = True
            self._task.cancel()

    async def discard(self) -> None:
        self.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def adopt(self) -> AsyncIterator:
        """The reply is the turn's: what was generated so far, then the rest as it comes. Closing the stream
        early (barge-in) stops generation; the history is then trimmed like any interrupted reply."""
        self._adopted = True
        return self._pieces()

    async def _pieces(self) -> AsyncIterator:
        try:
            while (item := await self._queue.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            if not self._task.done():
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)


async def _release_at_end(pieces: AsyncIterator, turn: _Turn) -> AsyncIterator:
    """Pass the decoder's stream through and free the generation turn as soon as generation ends (the rest of
    the reply is only speech), or when the stream is closed early (barge-in, error)."""
    try:
        async for piece in pieces:
            yield piece
    finally:
        turn.release()
