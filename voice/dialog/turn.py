"""One turn of the assistant: the user's words in, the spoken reply out, the history written once.

    user text -> llm stream of accepted tokens -> action filter -> clause chunker -> TTS (piper) -> sink

Two tasks joined by a bounded queue: the producer reads the decoder's stream and cuts it into fragments; the
speaker synthesizes each fragment and hands its audio to the sink, so the first clause is heard while the rest
is still being generated. There is one way to stop a turn: cancel its task (``Turn.cancel``: a barge-in, a
client's cancel, shutdown), which stops both stages between two steps. Whatever ended it, the turn then writes
the exchange into the conversation exactly once, with the reply as far as the sink says the user heard it.

What every turn of a session works with is a ``TurnContext``, built once by the session; a reply started on a
guess before the turn ended is an ``EarlyReply``, adopted by the turn or dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from audio.resample import resample
from llm.remote_errors import RemoteLLMError
from voice import tasks
from voice.dialog.actions import ACTION_TOOL, ActionParser, take_action_calls
from voice.dialog.context import TurnContext, asked
from voice.dialog.early_reply import EarlyReply, Pieces, close_reply
from voice.dialog.rehearing import rehear
from voice.dialog.reply import ReplyOutcome, SpokenFragment, StageError
from voice.dialog.toolcalls import ToolCallParser, call_message
from voice.events import ActionRequested, ReplyAudio, ReplyTextDelta, State, TranscriptFinal, TurnDone, TurnError
from voice.hearing.utterance import Utterance
from voice.latency import LatencyTrace
from voice.ports import AudioSink

__all__ = ["EarlyReply", "Turn", "TurnContext", "asked"]  # what a session builds a turn from

log = logging.getLogger("specvoice.turn")

# what a person hears when the local model fails in the middle of a reply (the error itself goes to the log and
# the TurnError event)
LLM_FAILED_SPEECH = "Sorry, something went wrong with my answer."


class Turn:
    """One reply, from the user's words to the last sample handed to the sink. ``start()`` runs it in its own
    task; ``cancel()`` stops it and waits until it has committed; ``wait()`` returns its ``TurnDone`` (None for a
    voice turn whose transcript was empty).

    Where the words come from: ``utterance`` (a voice turn: its final transcript is the question), else
    ``text``. ``source``: None asks the LLM and commits the exchange to the history; a string is spoken as it is
    (announcements; nothing is committed). ``early``: a reply already generating on the pause transcript, which
    the turn adopts when the final transcript is the same words, and drops otherwise."""

    def __init__(
        self,
        ctx: TurnContext,
        text: str,
        trace: LatencyTrace,
        *,
        speak: bool = True,
        source: str | None = None,
        utterance: Utterance | None = None,
        early: EarlyReply | None = None,
        before: Sequence[Utterance] = (),
        spoken: bool = False,
    ) -> None:
        self.ctx, self.text, self.trace, self.speak = ctx, text, trace, speak
        self.spoken = spoken or utterance is not None  # words a recogniser made (here or elsewhere): not certain
        self.source, self.utterance, self.early = source, utterance, early
        if early is not None:  # the eager end of turn's gain: the reply began this long before the turn ended
            trace.extra["early_lead_ms"] = round((time.monotonic() - early.started) * 1000)
        self.before = list(before)  # utterances of turns the user went on from (hand_over): asked together
        self._handed_over = False
        self.outcome = ReplyOutcome()
        self.interrupted = False
        self.task: asyncio.Task[TurnDone | None] | None = None
        self._commits = source is None  # a fixed text never reaches the conversation
        self._holding = False  # this turn holds the generation lock
        self._heard_cap: int | None = None  # the client said it heard only this many samples (truncate)
        self._committed: str | None = None  # the assistant message this turn wrote
        self._tools: ToolCallParser | None = None

    @property
    def done(self) -> bool:
        return self.task is not None and self.task.done()

    def start(self) -> Turn:
        self.task = tasks.start(self._run(), name=f"turn {self.trace.turn_id}")
        return self

    async def cancel(self) -> None:
        """Stop the turn (between two decoder steps or TTS sentences) and wait until it has committed."""
        await tasks.cancel_and_wait(self.task)

    async def wait(self) -> TurnDone | None:
        assert self.task is not None, "start() the turn first"
        return await asyncio.shield(self.task)

    def hand_over(self) -> list[Utterance]:
        """The user spoke again before any of this reply was out: they had not finished. The turn gives its
        question up (it will not commit) and returns its utterances, for the next turn to transcribe and answer
        together with the new one; [] when there is nothing to hand over (no utterance, or reply audio already
        out: a barge-in proper, which commits what was heard)."""
        if self.utterance is None or self.done or self.outcome.samples_out > 0 or self._handed_over:
            return []
        self._handed_over = True
        self.trace.extra["handed_over"] = True
        return [*self.before, self.utterance]

    def truncate(self, heard_s: float) -> str | None:
        """The listener heard only the first ``heard_s`` seconds of this reply's audio. While the turn runs, that
        caps what it will commit; afterwards the committed message is cut to the words heard by then."""
        samples = max(0, int(heard_s * self.ctx.tts.sample_rate))
        if not self.done:
            self._heard_cap = samples if self._heard_cap is None else min(samples, self._heard_cap)
            return None
        messages = self.ctx.conversation.messages
        if self._committed is None or not messages or messages[-1] != {"role": "assistant", "content": self._committed}:
            return None  # nothing of ours to cut (no reply, or a later turn came since)
        heard = self.outcome.heard_text(samples)
        try:
            self.ctx.conversation.trim_last_reply(heard)
        except ValueError:  # the reply held action markers the listener never heard: keep it as it was
            log.info("history kept untrimmed", extra={"session": self.ctx.session_id, "heard": heard})
            return None
        self._committed = messages[-1]["content"] if messages[-1]["role"] == "assistant" else None
        return heard

    # ---- the turn --------------------------------------------------------------------------------------------

    async def _run(self) -> TurnDone | None:
        ctx, trace = self.ctx, self.trace
        if not isinstance(self.source, str):  # an announcement has nothing to think about
            ctx.set_state(State.THINKING)
        if self.utterance is not None:
            try:
                text = await self._hear(self.utterance)
            except asyncio.CancelledError:  # barge-in before the transcript was ready: nothing was said back
                await self._drop_early()
                self.interrupted = True
                trace.mark("turn_end", time.monotonic())
                done = TurnDone(trace.turn_id, self.utterance.stream.text, "", True, trace.to_dict())
                ctx.emit(done)
                return done
            if text is None:
                await self._drop_early()
                return None
            self.text = text
        home = ctx.home
        ground = home.grounding(self.text, ctx.conversation.messages, self.spoken) if home and self.text else None
        markers = ctx.resolve_device is None
        parser = (
            ActionParser(ctx.allowed_actions, ground, once_per_topic=ctx.home is not None, markers=markers)
            if ctx.allowed_actions and self._commits
            else None
        )
        tools = ctx.tools if self._commits else None  # declared: their calls are not spoken
        names = {t["function"]["name"] for t in tools or []} | ({ACTION_TOOL} if parser and not markers else set())
        self._tools = ToolCallParser(names) if names else None
        sink = ctx.sink if self.speak else None
        if sink is not None:
            sink.begin_utterance()
        error: StageError | None = None
        try:
            if isinstance(self.source, str):
                pieces = _once(self.source)
            elif self.early is not None:
                trace.extra["early_reply"] = True
                pieces = self.early.adopt()
            else:
                await ctx.generation_lock.acquire()  # waiting for other sessions is not counted in the timeout
                self._holding = True
                pieces = self._generate()
            async with asyncio.timeout(ctx.turn_timeout_s):
                await self._speak(pieces, sink, parser)
        except asyncio.CancelledError:
            self.interrupted = True
        except StageError as exc:
            error = exc
        except TimeoutError as exc:
            error = StageError("timeout", exc)
        finally:
            self._release()
        if error is not None:
            await self._say_sorry(error, sink)
        return self._finish(parser, sink, error)

    async def _say_sorry(self, error: StageError, sink: AudioSink | None) -> None:
        """An LLM that failed says so, after whatever of the reply was heard: a remote server's error has its own
        sentence (down, busy or slow), any other failure the general one, so a person is never left with a reply
        that stops mid-word and silence. It is not part of the reply: the history never sees it. A barge-in
        stops it like any speech."""
        cause = error.__cause__
        if error.stage != "llm" or not self.speak:
            return
        spoken = cause.spoken if isinstance(cause, RemoteLLMError) else LLM_FAILED_SPEECH
        try:
            await self._speak_fragment(SpokenFragment(spoken, start_sample=self.outcome.samples_out), sink)
            if sink is not None:
                await sink.drain()
        except asyncio.CancelledError:
            self.interrupted = True
        except Exception as exc:  # the TTS failing too: the TurnError still says what happened
            log.warning("could not say the error", extra={"session": self.ctx.session_id, "error": repr(exc)})

    async def _hear(self, utterance: Utterance) -> str | None:
        """The final transcript (None: nothing to answer); an early reply is kept only if it heard the same."""
        ctx, trace = self.ctx, self.trace
        try:
            async with asyncio.timeout(ctx.stt_timeout_s):
                text = " ".join([t for u in [*self.before, utterance] if (t := await u.final())])
                if not self.before:  # an answer to a question back, a device name heard wrong
                    text = await rehear(ctx.home, text, ctx.conversation.messages, utterance.stream)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            ctx.emit(TurnError(trace.turn_id, "stt", message))
            log.warning("turn failed", extra={"session": ctx.session_id, "stage": "stt", "error": message})
            ctx.set_state(State.IDLE)
            return None
        trace.mark("stt_final", time.monotonic())
        ctx.emit(TranscriptFinal(text))
        if self.early is not None and (self.early.text.strip() != text or not self.early.alive):
            await self._drop_early()  # the guess was wrong: forgotten, and the real question answered
        if not text:
            ctx.set_state(State.IDLE)
            return None
        return text

    async def _drop_early(self) -> None:
        early, self.early = self.early, None
        if early is not None:
            await early.discard()

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self.ctx.generation_lock.release()

    async def _generate(self) -> Pieces:
        """The LLM's stream; the generation lock is freed the moment generation ends (the rest is only speech)."""
        prompt = asked(self.ctx, self.text, spoken=self.spoken)
        stream = self.ctx.conversation.reply(prompt, self.ctx.decode, commit=False)
        try:
            async for emission in stream:
                yield emission
        finally:
            await close_reply(stream)  # at once: the conversation is free
            self._release()
            self.ctx.warm()  # the reply's audio still plays: trim ahead and prefill now, not in the next turn

    def _finish(self, parser: ActionParser | None, sink: AudioSink | None, error: StageError | None) -> TurnDone:
        ctx, trace, outcome = self.ctx, self.trace, self.outcome
        trace.mark("turn_end", time.monotonic())
        heard = outcome.text.strip()
        cut = self._heard_cap is not None or (self.interrupted and sink is not None)
        if cut:
            heard = outcome.heard_text(self._heard_samples(sink))
        if self._handed_over and ctx.conversation.uncommitted:
            ctx.conversation.discard()  # the next turn asks these words again, with what the user added
        elif self._commits and ctx.conversation.uncommitted:
            # the exchange enters the history once: the whole reply (with its action markers) when it was all
            # delivered and nothing refused, else the words the user heard (a refusal, a question back)
            complete = not cut and not self.interrupted and error is None and not (parser and parser.refused)
            calls = self._tools.calls if self._tools is not None and complete else []
            self._committed = outcome.raw.strip() if complete and not calls else heard
            ctx.conversation.commit(self._committed)
            if calls:
                ctx.conversation.add(call_message(heard, calls))  # the template's form
            self._committed = self._committed or None
        stats = ctx.conversation.last_stats if self._commits else None
        trace.extra.update({"interrupted": self.interrupted, "decoder": stats.to_dict() if stats is not None else None})
        for request in parser.requests if parser else []:
            ctx.emit(request if isinstance(request, ActionRequested) else ActionRequested(**request))
        for call in self._tools.calls if self._tools is not None and not (cut or self.interrupted) else []:
            ctx.emit(call)
        if error is not None:
            ctx.emit(TurnError(trace.turn_id, error.stage, str(error)))
            log.warning("turn failed", extra={"session": ctx.session_id, "stage": error.stage, "error": str(error)})
        done = TurnDone(trace.turn_id, self.text, heard, self.interrupted, trace.to_dict())
        ctx.stats.add(trace)
        ctx.emit(done)
        log.info("turn", extra={"session": ctx.session_id, **trace.to_dict()})
        if not self.interrupted:
            ctx.set_state(State.IDLE)
        if self._commits:
            ctx.warm()  # the exchange is in the history now: prefill it too
        return done

    def _heard_samples(self, sink: AudioSink | None) -> int:
        """How much of the reply's audio (at the voice's rate) the listener heard, by the sink's heard port and
        the client's own word (truncate), whichever is less."""
        heard = self.outcome.samples_out
        if sink is not None:
            heard = int(sink.heard_samples() * self.ctx.tts.sample_rate / sink.sample_rate)
        return heard if self._heard_cap is None else min(heard, self._heard_cap)

    # ---- speaking ------------------------------------------------------------------------------------------

    async def _speak(
        self, pieces: Pieces, sink: AudioSink | None, parser: ActionParser | None, queue_size: int = 8
    ) -> None:
        """Run the reply to the end (or until cancelled); ``self.outcome`` is filled in as it goes."""
        fragments: asyncio.Queue[str | None] = asyncio.Queue(maxsize=queue_size)
        producer = tasks.start(self._produce(pieces, fragments, parser), name="turn producer")
        try:
            while (text := await fragments.get()) is not None:
                frag = SpokenFragment(text, start_sample=self.outcome.samples_out)
                self.outcome.fragments.append(frag)
                if not self.speak:
                    frag.done = True
                    continue
                try:
                    await self._speak_fragment(frag, sink)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    raise StageError("tts", exc) from exc
            if sink is not None:
                await sink.drain()
                if sink.first_audible_t is not None:
                    self.trace.mark("playback_start", sink.first_audible_t)
            await producer
        finally:
            await tasks.cancel_and_wait(producer)

    async def _produce(self, pieces: Pieces, fragments: asyncio.Queue[str | None], parser: ActionParser | None) -> None:
        trace, chunker, outcome = self.trace, self.ctx.chunker(), self.outcome

        async def put(text: str) -> None:
            if text:
                self.ctx.emit(ReplyTextDelta(text))  # clients see what is spoken, never action markers
            outcome.text += text
            for frag in chunker.push(text):
                trace.mark("first_fragment", time.monotonic())
                await fragments.put(frag)

        try:
            async for piece in pieces:
                text = piece if isinstance(piece, str) else piece.text
                trace.mark("llm_first_token", time.monotonic() if isinstance(piece, str) else piece.t)
                outcome.raw += text
                text = self._tools.push(text) if self._tools is not None else text
                await put(self._act(parser) + parser.push(text) if parser else text)
            tail = self._tools.flush() if self._tools is not None else ""
            await put(self._act(parser) + parser.push(tail) + parser.flush() if parser else tail)
            for frag in chunker.flush():
                trace.mark("first_fragment", time.monotonic())
                await fragments.put(frag)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await fragments.put(None)  # the speaker finishes what it has, then the error surfaces
            raise StageError("llm", exc) from exc
        finally:
            await pieces.aclose()  # cancelled while waiting on the queue: the stream stops now, not at collection
        await fragments.put(None)

    def _act(self, parser: ActionParser) -> str:
        """The home actions among the tool calls made so far (the tool-call format), decided like markers."""
        resolve = self.ctx.resolve_device
        return take_action_calls(self._tools, parser, resolve) if self._tools and resolve else ""

    async def _speak_fragment(self, frag: SpokenFragment, sink: AudioSink | None) -> None:
        tts, trace = self.ctx.tts, self.trace
        async for pcm in tts.stream(frag.text):
            if pcm.size == 0:
                continue
            trace.mark("tts_first_audio", time.monotonic())
            self.ctx.set_state(State.SPEAKING)
            self.ctx.emit(ReplyAudio(pcm, tts.sample_rate))
            if sink is not None:
                await sink.write(
                    pcm if sink.sample_rate == tts.sample_rate else resample(pcm, tts.sample_rate, sink.sample_rate)
                )
                if sink.first_audible_t is not None:
                    trace.mark("playback_start", sink.first_audible_t)
            else:
                trace.mark("playback_start", time.monotonic())  # handed to the transport
            frag.n_samples += len(pcm)
            self.outcome.samples_out += len(pcm)
        frag.done = True


async def _once(text: str) -> Pieces:
    yield text
