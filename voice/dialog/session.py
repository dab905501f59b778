"""One conversation: a Listener for the user's audio, Turns for the assistant's replies, and the rules between.

    idle --speech--> listening --end of turn--> thinking --first audio--> speaking --done--> idle
                         ^                          |                          |
                         +-------- barge-in --------+--------------------------+

Every transport (microphone, websocket, Wyoming, MQTT) drives a session through the same few calls:
``push_audio`` (the ears), ``ask`` / ``say`` (text in), ``cancel``, ``close``. Speech from the user while a turn
is running is a barge-in: the turn is cancelled (``Turn.cancel``, the only way anything stops), and it commits
the reply to the history as far as the session's sink says the user heard it; speech that comes before any
of the reply is out means the user had not finished (a pause read as the end of the turn): the turn hands its
utterance over and the next turn answers both together (``Turn.hand_over``). Speech while the reply is being
heard first holds its audio (``dialog.backchannels``, a sink that can hold): if its words are only "mhm",
"yeah", a cough (voice/dialog/backchannel.py), the reply goes on where it stopped; else it is the barge-in.
A turn that fails ends with a ``TurnError`` and leaves the session idle, ready for the next one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence

import numpy as np

from audio.sinks import HoldableSink
from llm.settings import DecodeSettings
from voice.dialog.ahead import WorkAhead
from voice.dialog.backchannel import Hold, clearly_interrupts, is_backchannel
from voice.dialog.home import action_setup
from voice.dialog.host import Host
from voice.dialog.turn import EarlyReply, Turn, TurnContext
from voice.events import (
    Event,
    EventHandler,
    PauseHeard,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    State,
    StateChanged,
    TranscriptPartial,
    TurnDone,
)
from voice.hearing.listener import Listener
from voice.hearing.utterance import ListenEvent, Utterance, UtteranceEnded
from voice.latency import LatencyTrace
from voice.ports import AudioSink, LocalChat, Tool
from voice.tasks import cancel_and_wait

log = logging.getLogger("specvoice.session")


class Session:
    """One conversation with its own history, KV caches and listener. Call everything from the event loop."""

    def __init__(
        self,
        assistant: Host,
        on_event: EventHandler | None = None,
        *,
        sink: AudioSink | None = None,
        name: str = "",
        endpointing: bool = True,
        on_close: Callable[[Session], None] = lambda session: None,
    ) -> None:
        cfg = assistant.config
        self.assistant = assistant
        self._on_close = on_close  # the assistant forgets the session
        self.config = cfg
        self.id = name or uuid.uuid4().hex[:8]
        self.sink = sink
        self.state = State.IDLE
        self._on_event = on_event or (lambda event: None)
        allowed = cfg.mqtt.allow_list
        self.home = assistant.home
        setup = action_setup(allowed, cfg.mqtt.action_format, cfg.dialog.system_prompt, self.home)
        self._actions_prompt, self._base_prompt = setup.prompt, setup.base
        self.conversation = assistant.engine.conversation(setup.system_prompt, cfg.dialog.history_tokens)
        self._action_tools: list[Tool] = setup.tools  # before any client's own tools
        # what only a chat whose prompt is built here can do (tools in its template, a constrained reply)
        self._local: LocalChat | None = chat if isinstance(chat := self.conversation, LocalChat) else None
        if setup.tools:
            if self._local is None:
                raise ValueError(
                    "mqtt.action_format = 'tools' needs a model whose chat template this process applies (a local "
                    "llm.engine); fix: set mqtt.action_format = 'markers'"
                )
            self._local.tools = list(setup.tools)
        self.listener: Listener = assistant.listener(endpointing=endpointing)
        self.ctx = TurnContext(
            conversation=self.conversation,
            decode=assistant.decode_settings(),
            tts=assistant.tts,
            tts_config=cfg.tts,
            sink=sink,
            emit=self.emit,
            set_state=self._set_state,
            generation_lock=assistant.generation_lock,
            stats=assistant.stats,
            turn_timeout_s=cfg.dialog.turn_timeout_s,
            stt_timeout_s=cfg.dialog.stt_timeout_s,
            allowed_actions=allowed,
            home=self.home,
            resolve_device=setup.resolve,
            constrained=setup.constrained,
            local=self._local,
            session_id=self.id,
            warm=self._warm_idle,
        )
        self._turn_ids = itertools.count(1)
        self._listen_trace: LatencyTrace | None = None
        self._turn: Turn | None = None
        self._hold: Hold | None = None  # a reply held by speech that may be a backchannel (dialog.backchannels)
        self.backchannels = {"held": 0, "resumed": 0, "interrupted": 0}  # for benchmarks and tests
        self.held_words: list[tuple[str, float | None, bool]] = []  # (words, voiced s, backchannel?) per verdict
        self.speak_replies = True  # voice turns answer aloud (False: text only, e.g. a websocket in text mode)
        self._closed = False
        self._carried: list[Utterance] = []  # turns handed over to the next utterance (Turn.hand_over)
        self.ahead = WorkAhead(self.ctx, cfg.dialog, assistant.spawn, self._pause_decided)
        # prefill the system prompt while the user is still speaking: the first reply then pays only for its words
        self._warm_idle()

    # ---- events and state -----------------------------------------------------------------------------------

    @property
    def history(self) -> Sequence[dict]:
        return self.conversation.messages

    @property
    def decode(self) -> DecodeSettings:
        """The decode settings of this session's turns; benchmarks and websocket clients swap them."""
        return self.ctx.decode

    @decode.setter
    def decode(self, settings: DecodeSettings) -> None:
        self.ctx.decode = settings

    @property
    def tools(self) -> list[Tool] | None:
        """The functions the model may call (a websocket client's ``session.tools``): their calls are kept out of
        the speech, and a conversation that takes tools (the local one, via its chat template) is given them."""
        return self.ctx.tools

    @tools.setter
    def tools(self, tools: list[Tool] | None) -> None:
        self.ctx.tools = tools
        if self._local is not None:
            self._local.tools = [*self._action_tools, *(tools or [])] or None

    @property
    def replying(self) -> bool:
        return self._turn is not None and not self._turn.done

    @property
    def last_turn(self) -> Turn | None:
        return self._turn

    def emit(self, event: Event) -> None:
        try:
            self._on_event(event)
        except Exception:
            log.exception("session event handler failed", extra={"session": self.id})
        self.assistant.broadcast(self.id, event)

    def _set_state(self, state: State) -> None:
        held = self._hold is not None and state == State.SPEAKING  # a held reply is quiet: the user is speaking
        if state != self.state and not held:
            self.state = state
            self.emit(StateChanged(state))

    def _new_trace(self) -> LatencyTrace:
        return LatencyTrace(next(self._turn_ids), budget_ms=self.config.budget.model_dump())

    # ---- audio in -------------------------------------------------------------------------------------------

    async def push_audio(
        self, samples: np.ndarray, t: float | None = None, reference: np.ndarray | None = None
    ) -> None:
        """Feed microphone audio (int16 mono 16 kHz). ``t``: monotonic time of its first sample (default:
        contiguous with the last push). ``reference``: what the speaker played over the same interval (16 kHz),
        so our own voice never counts as the user's."""
        if self._closed:
            raise RuntimeError(f"session {self.id} is closed")
        self.listener.replying = self.replying
        for event in await self.listener.accept_chunk(samples, t, reference):
            if await self._on_listen_event(event):
                break  # a backchannel was heard on its pause: the end of its utterance that follows is no turn

    async def _on_listen_event(self, event: ListenEvent) -> bool:
        if isinstance(event, SpeechStarted):
            if self._hold is not None:
                await self._hold.goes_on()
            elif self._turn is not None and self.replying:
                if self._can_hold(self._turn):
                    self._start_hold(self._turn, event)
                else:
                    carried = self._turn.hand_over()  # nothing of the reply out yet: the user had not finished
                    await self._interrupt()
                    self._carried = carried
            self._listen_trace = self._new_trace()
            self._listen_trace.mark("speech_start", self.listener.arrival(event.t))
            self._set_state(State.LISTENING)
            self.emit(event)
        elif isinstance(event, TranscriptPartial):
            self.emit(event)
            if self._hold is not None and clearly_interrupts(event.text, time.monotonic() - self._hold.since):
                self.held_words.append((event.text, None, False))
                await self._barge_in()
            self.ahead.prefill_heard(event.text, self.replying)
        elif isinstance(event, PauseHeard):
            pause = self.listener.vad.pause_since if self.listener.vad is not None else None
            if self._hold is not None and not self._hold.before and pause is not None:  # not if already going on
                if self._judge(event.text, pause - self._hold.start_t):
                    self.listener.clear()  # the "mhm" is not a question to answer
                    await self._resume(event.text)
                    return True
                await self._barge_in()
            self.ahead.start_reply(event.text, self.replying)
        elif isinstance(event, SpeechResumed):
            await self.ahead.drop_reply()  # the early reply answered a question not yet asked
        elif isinstance(event, UtteranceEnded):
            if self._hold is not None:
                self._hold.ended = event
                self._hold.deciding = self.assistant.spawn(self._decide(self._hold))
            else:
                self._answer(event)
        return False

    # ---- backchannels ---------------------------------------------------------------------------------------

    def _can_hold(self, turn: Turn) -> bool:
        """Hold rather than stop: some of the reply is out, through a sink that can go quiet keeping its queue."""
        return self.config.dialog.backchannels and isinstance(self.sink, HoldableSink) and turn.outcome.samples_out > 0

    def _start_hold(self, turn: Turn, event: SpeechStarted) -> None:
        assert isinstance(self.sink, HoldableSink)
        self.sink.hold()  # quiet at once, as a barge-in would be; nothing queued is lost
        self._hold = hold = Hold(turn, since=time.monotonic(), start_t=event.t)
        hold.timer = self.assistant.spawn(self._hold_expires(hold))
        self.backchannels["held"] += 1

    async def _hold_expires(self, hold: Hold) -> None:
        """Talking this long is not a backchannel (and a client may stop sending audio mid-word: the clock, not
        the next chunk, ends the hold)."""
        await asyncio.sleep(self.config.dialog.backchannel_hold_s)
        if self._hold is hold and hold.deciding is None:
            hold.timer = None  # this task is the one deciding: _barge_in must not cancel it
            await self._barge_in()

    async def _decide(self, hold: Hold) -> None:
        """The held speech ended: its words say backchannel (resume) or interruption (stop, and answer them)."""
        assert hold.ended is not None
        said = [*hold.before, hold.ended.utterance]
        text = " ".join([t for u in said if (t := await u.final())])
        if self._hold is not hold:
            return  # decided otherwise meanwhile (more speech, a cancel)
        if self._judge(text, sum(u.speech_end - u.speech_start for u in said)):
            await self._resume(text)
        else:
            hold.deciding = None  # this task is the one deciding: _barge_in must not cancel it
            await self._barge_in()
            self._carried = [*hold.before]  # asked together with the last burst, as a hand-over is
            self._answer(hold.ended)

    def _judge(self, text: str, voiced_s: float | None) -> bool:
        verdict = is_backchannel(text, voiced_s)
        self.held_words.append((text, voiced_s, verdict))
        log.debug("held speech", extra={"session": self.id, "text": text, "voiced_s": voiced_s, "backchannel": verdict})
        return verdict

    async def _resume(self, text: str) -> None:
        hold, self._hold = self._hold, None
        assert hold is not None and isinstance(self.sink, HoldableSink)
        await hold.stop_timer()
        self.sink.release()
        self._listen_trace = None
        self.backchannels["resumed"] += 1
        hold.turn.trace.extra.setdefault("backchannels", []).append(text)
        log.debug("backchannel: the reply goes on", extra={"session": self.id, "text": text})
        if not hold.turn.done:
            self._set_state(State.SPEAKING)

    async def _barge_in(self) -> None:
        """The held speech was an interruption: stop the reply (as a barge-in always did). An utterance whose
        words were still being decided goes with the next one (as a hand-over does)."""
        hold, self._hold = self._hold, None
        if hold is None:
            return
        self.backchannels["interrupted"] += 1
        await hold.stop_timer()
        self._carried.extend(hold.before)  # earlier bursts go with the speech that goes on, as a hand-over
        if hold.deciding is not None and hold.ended is not None:
            deciding, hold.deciding = hold.deciding, None
            await cancel_and_wait(deciding)
            self._carried.append(hold.ended.utterance)
        await self._interrupt()

    def _answer(self, ended: UtteranceEnded) -> None:
        """The user's turn is over: transcribe it and reply, in a turn that a barge-in can cancel."""
        u = ended.utterance
        trace, self._listen_trace = self._listen_trace or self._new_trace(), None
        for mark, t in (("speech_start", u.speech_start), ("speech_end", u.speech_end), ("endpoint", u.endpoint)):
            trace.mark(mark, self.listener.arrival(t))  # the wall clock, as every later mark
        trace.extra["end_of_turn"] = {
            "rule": self.listener.end_of_turn,
            "reason": u.reason,
            "probability": u.probability,
        }
        self.emit(SpeechStopped(u.speech_end, cut=u.cut))
        early = self.ahead.take_reply()
        before, self._carried = self._carried, []
        self._turn = Turn(self.ctx, "", trace, speak=self.speak_replies, utterance=u, early=early, before=before)
        self._turn.start()

    def _warm_idle(self) -> None:
        self.ahead.warm_idle()

    async def _pause_decided(self) -> None:
        await self.listener.pause_decided()  # the listener of now (set_endpointing replaces it)

    async def warmed(self) -> None:
        """Wait until the background prefill is done (benchmarks and tests: how long the idle work takes)."""
        await self.ahead.warmed()

    @property
    def early_replies(self) -> dict[str, int]:
        return self.ahead.early_replies

    @property
    def early_reply(self) -> EarlyReply | None:
        """The reply started on the pause transcript and not yet adopted or dropped, if any."""
        return self.ahead.reply

    async def end_utterance(self) -> bool:
        """End the user's speech now and answer it (a client that knows better than the VAD, or a manual
        commit): the utterance in progress, or with endpointing off everything pushed so far. False: no speech."""
        ended = self.listener.end()
        if ended is None:
            return False
        if self.replying:
            await self._interrupt()
        self._answer(ended)
        return True

    def take_utterance(self) -> Utterance | None:
        """End the utterance in progress without answering it (a client that decides itself when to ask for a
        response); ``await utterance.final()`` gives its transcript."""
        ended = self.listener.end()
        return ended.utterance if ended is not None else None

    def clear_audio(self) -> None:
        self.listener.clear()

    def set_endpointing(self, on: bool) -> None:
        """Turn detection on (the VAD ends turns) or off (the client ends them); audio in progress is dropped."""
        if on != self.listener.endpointing:
            old, self.listener = self.listener, self.assistant.listener(endpointing=on)
            self.assistant.spawn(old.close())

    # ---- text in --------------------------------------------------------------------------------------------

    async def ask(self, text: str | None, *, speak: bool = True, spoken: bool = False) -> TurnDone:
        """A text turn: the reply is generated (and spoken) with the same events as a voice turn. ``None``: no new
        words, the reply continues the history as it is (a greeting; the answer after a function's output)."""
        if text is not None:
            text = text.strip()
            if not text:
                raise ValueError("ask() needs a non-empty question (or None to continue the conversation)")
        await self._interrupt()
        self._carried = []  # a typed question supersedes spoken words still waiting for their end
        trace = self._new_trace()
        trace.mark("turn_start", time.monotonic())
        self._turn = turn = Turn(self.ctx, text or "", trace, speak=speak, spoken=spoken).start()
        done = await self._wait(turn)
        assert done is not None
        return done

    async def say(self, text: str) -> TurnDone | None:
        """Speak ``text`` now, without the LLM and without touching the history (announcements)."""
        await self._interrupt()
        trace = self._new_trace()
        trace.mark("turn_start", time.monotonic())
        self._turn = turn = Turn(self.ctx, text, trace, source=text).start()
        return await self._wait(turn)

    async def _wait(self, turn: Turn) -> TurnDone | None:
        """The turn's result; cancelling the caller cancels the turn too (one way to stop: task cancellation)."""
        try:
            return await turn.wait()
        except asyncio.CancelledError:
            await turn.cancel()
            self._set_state(State.IDLE)
            raise

    async def wait_turn(self) -> TurnDone | None:
        """Wait for the turn in progress (if any) to finish; returns its TurnDone."""
        return await self._turn.wait() if self._turn is not None else None

    def set_instructions(self, text: str | None) -> None:
        """The system prompt from now on (a websocket client's ``instructions``; None: the configured one). The
        home-action commands stay appended: they are the only way the model knows them. The caches keep what
        still matches, and the new prompt is prefilled now if the session is idle."""
        self.conversation.set_system(((self._base_prompt if text is None else text) + self._actions_prompt).strip())
        if not self.replying:
            self._warm_idle()

    def truncate(self, heard_ms: float) -> str | None:
        """The client says the listener heard only ``heard_ms`` of the last reply's audio
        (conversation.item.truncate): the history keeps the words heard by then. Returns the kept text, or None
        when there is no reply to cut."""
        turn = self._turn
        if turn is None:
            return None
        return turn.truncate(heard_ms / 1000.0)

    # ---- stopping -------------------------------------------------------------------------------------------

    async def _interrupt(self) -> None:
        """Stop the reply in progress (and any early reply): the turn commits what was heard."""
        if (hold := self._hold) is not None:
            self._hold = None  # flushing the sink ends its hold too
            await hold.stop_timer()
        await self.ahead.drop_reply()
        if self.sink is not None and self.replying:
            self.sink.flush()
        if self._turn is not None:
            await self._turn.cancel()

    async def cancel(self) -> None:
        """Client-requested stop (response.cancel, MQTT cancel): same as a barge-in, then idle."""
        await self._interrupt()
        self._carried = []
        self._set_state(State.IDLE)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.ahead.close()
        await self._interrupt()
        await self.listener.close()
        self._on_close(self)
