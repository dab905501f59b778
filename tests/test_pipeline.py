"""The assistant end to end on the small real models: speech in, speech out, latency marks, early replies,
multi-turn history, failing stages, and no leaks over many turns (barge-in: test_pipeline_barge_in.py; the wake
word: test_pipeline_wake.py)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.sinks import WavSink
from voice.assistant import Assistant
from voice.dialog.turn import LLM_FAILED_SPEECH
from voice.events import (
    ReplyAudio,
    SpeechStarted,
    SpeechStopped,
    State,
    StateChanged,
    TranscriptPartial,
    TurnDone,
    TurnError,
)
from voice.latency import MARKS

BLOCK = SPEECH_RATE // 50  # 20 ms


def small_assistant(small_config) -> Assistant:
    """The small models, with short replies (a test hears the start of an answer, not all of it)."""
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 40
    return Assistant.load_sync(config)


def spoken_by(assistant: Assistant):
    """Spoken test utterances at 16 kHz, made by the assistant's piper voice at test time."""
    cache: dict[str, np.ndarray] = {}

    def make(text: str) -> np.ndarray:
        if text not in cache:
            cache[text] = resample(
                np.concatenate(list(assistant.tts.synthesize(text))), assistant.tts_sample_rate, SPEECH_RATE
            )
        return cache[text]

    return make


assistant = pytest.fixture(small_assistant, scope="module", name="assistant")
speech = pytest.fixture(spoken_by, scope="module", name="speech")


class Recorder:
    """Collects a session's events and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list = []
        self.times: list[float] = []  # time.monotonic() when each event came
        self._changed = asyncio.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        self.times.append(time.monotonic())
        self._changed.set()

    def time_of(self, kind) -> float:
        return next(t for e, t in zip(self.events, self.times, strict=True) if isinstance(e, kind))

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(self, predicate, timeout: float = 120.0):
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                self._changed.clear()
                await self._changed.wait()

    async def turn_done(self, n: int = 1, timeout: float = 120.0) -> TurnDone:
        await self.wait_for(lambda e: len(self.of(TurnDone)) + len(self.of(TurnError)) >= n, timeout)
        return (self.of(TurnDone) + [None])[n - 1] if len(self.of(TurnDone)) >= n else None


class Mic:
    """Feeds audio into a session in 20 ms blocks, paced like a microphone (`speed` times real time).
    ``lockstep``: after each block, wait for the listener's background work (Whisper pass, Smart Turn) and for
    an early reply to produce its first output, as on an infinitely fast machine: what the session decides
    then depends on the audio alone, not on how busy the machine is."""

    def __init__(self, session, speed: float = 1.0, lockstep: bool = False) -> None:
        self.session, self.speed, self.lockstep = session, speed, lockstep
        self.loop = asyncio.get_running_loop()
        self.t = self.start = self.loop.time()  # loop.time() is time.monotonic(): the session's clock

    async def play(self, samples: np.ndarray, reference=None) -> None:
        for i in range(0, len(samples), BLOCK):
            block = samples[i : i + BLOCK]
            if len(block) < BLOCK:
                block = np.pad(block, (0, BLOCK - len(block)))
            ref = None if reference is None else reference(self.t, len(block))
            await self.session.push_audio(block.astype(np.int16), self.t, reference=ref)
            self.t += BLOCK / SPEECH_RATE
            if self.lockstep:
                await self.session.listener.settle()
                if (early := self.session.early_reply) is not None:
                    await early.first_output()
            # paced against the start time, so audio time never drifts behind the clock as the session works
            await asyncio.sleep(max(0.0, self.start + (self.t - self.start) / self.speed - self.loop.time()))

    async def silence(self, seconds: float, reference=None) -> None:
        await self.play(np.zeros(int(seconds * SPEECH_RATE), np.int16), reference)

    async def silence_until(self, done: Callable[[], bool], longest_s: float = 60.0) -> None:
        """Silence block by block until ``done()``, as a microphone in a quiet room keeps sending (an end of turn
        is decided on the audio that follows the speech, however long a busy machine takes to decide it)."""
        for _ in range(int(longest_s * SPEECH_RATE / BLOCK)):
            if done():
                return
            await self.play(np.zeros(BLOCK, np.int16))


def pause_state(session) -> dict:
    """What the listener knew about the pause: why an early reply did or did not start (a failure's message)."""
    listener, turn = session.listener, session.listener.turn
    stream = listener._stream
    return {
        "wait_reason": turn.wait_reason if turn is not None else None,
        "has_transcript": turn.has_transcript if turn is not None else None,
        "probability": turn.policy.last_probability if turn is not None else None,
        "pause_since": listener.vad.pause_since if listener.vad is not None else None,
        "text": stream.text if stream is not None else None,
        "nothing_new": stream.nothing_new() if stream is not None else None,
        "replying": session.replying,
    }


def open_session(assistant, lockstep: bool = False) -> tuple[Recorder, WavSink, object, Mic]:
    """A session that records its events and writes its answers to a WAV sink, with a Mic feeding it."""
    rec, sink = Recorder(), WavSink(None, assistant.tts_sample_rate, realtime=False)
    session = assistant.session(rec, sink=sink)
    return rec, sink, session, Mic(session, lockstep=lockstep)


def transcribe(assistant, pcm: np.ndarray, rate: int) -> str:
    segments, _ = assistant.stt.model.transcribe(
        resample(pcm, rate, SPEECH_RATE).astype(np.float32) / 32768, language="en", beam_size=1
    )
    return " ".join(s.text for s in segments).strip()


async def test_spoken_question_gets_a_spoken_answer(assistant, speech):
    rec, sink, session, mic = open_session(assistant)
    await mic.play(speech("What is the capital of France, and when is the best time of the year to go there?"))
    await mic.silence(1.3)  # room for the longest end-of-turn wait (turn.max_silence_ms)
    done = await rec.wait_for(
        lambda e: isinstance(e, TurnError) or (isinstance(e, TurnDone) and not e.trace.get("handed_over"))
    )
    # piper pauses at the comma, after a complete question: Smart Turn may end the turn there (p 0.99 in a
    # fresh-clone run), and the rest of the sentence then hands that turn over (Turn.hand_over): one answer to
    # the whole question either way, and no other turn
    assert all(d.trace.get("handed_over") for d in rec.of(TurnDone) if d is not done), rec.of(TurnDone)
    assert isinstance(done, TurnDone) and not done.interrupted, done
    assert all(w in done.transcript.lower() for w in ("capital", "france", "time")), done.transcript
    assert rec.of(TranscriptPartial), "partial transcripts while speaking"
    assert done.reply.strip()
    answer = transcribe(assistant, sink.audio, assistant.tts_sample_rate)
    assert len(answer.split()) >= 2, f"the spoken answer transcribes back to words: {answer!r}"
    marks = done.trace["marks_ms"]
    for mark in (
        "speech_start",
        "speech_end",
        "endpoint",
        "stt_final",
        "llm_first_token",
        "first_fragment",
        "tts_first_audio",
        "playback_start",
        "turn_end",
    ):
        assert mark in marks, mark
    early = done.trace.get("early_reply", False)  # a reply started on the pause may have its first token sooner
    order = [marks[m] for m in MARKS if m in marks and not (early and m == "llm_first_token")]
    assert order == sorted(order), marks
    assert marks["llm_first_token"] <= marks["first_fragment"] <= marks["tts_first_audio"]
    assert set(done.trace["stages_ms"]) >= {"voice_to_voice", "endpointing", "stt_final", "llm_first_token"}
    states = [e.state for e in rec.of(StateChanged)]
    handed = sum(1 for d in rec.of(TurnDone) if d.trace.get("handed_over"))  # each: thinking, then listening again
    expected = [State.LISTENING] + [State.THINKING, State.LISTENING] * handed + [State.THINKING, State.SPEAKING]
    assert states[: len(expected) + 1] == expected + [State.IDLE], (states, handed)
    await session.close()
    sink.close()


async def test_committed_words_are_prefilled_while_the_user_speaks(assistant, speech):
    """Work during speech (dialog.prefill_during_speech): before the end of the turn, the LLM cache already
    holds the prompt up to the last committed word; the reply then starts from it."""
    rec, sink, session, mic = open_session(assistant, lockstep=True)
    # one breath (no comma: piper pauses there, and a lockstep Smart Turn may rightly end the turn at it)
    await mic.play(speech("Which month of the year is the best time to go to the south of France for a holiday?"))
    committed = [e.committed for e in rec.of(TranscriptPartial) if e.committed]
    assert committed and not rec.of(TurnDone), "words were committed while the user was still speaking"
    conversation = session.conversation
    one, two = (
        conversation.prompt_ids(conversation.messages + [{"role": "user", "content": f"{committed[-1]}{x}"}])
        for x in (" a", " b c")
    )
    ready = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)  # up to the committed words
    async with asyncio.timeout(60):  # the prefill runs between Whisper passes; this only bounds a hang
        while conversation.cached_tokens[0] < ready:
            await asyncio.sleep(0.05)
    assert conversation._target.ids[:ready] == one[:ready], "the cache holds the open user turn so far"
    await mic.silence(1.3)
    done = await rec.turn_done()
    assert done is not None and done.transcript.startswith(committed[-1]) and done.reply.strip()
    await session.close()
    sink.close()


@pytest.fixture(params=["smart"])
def patient_assistant(assistant, request):
    """The same loaded models, with an end of turn that always waits long enough for the pause transcript to come
    first, so a reply starts early (on the pause) every time: the semantic end with a threshold the model never
    reaches (every pause sounds unfinished, so the turn waits for turn.max_silence_ms), or the VAD rule with a
    long vad.end_silence_ms."""
    config = assistant.config.model_copy(deep=True)
    config.turn.engine = request.param
    config.turn.threshold = 0.999
    config.turn.max_silence_ms = config.vad.end_silence_ms = 1500
    return Assistant(config, assistant.engine, assistant.stt, assistant.tts, assistant.vad_path)


@pytest.mark.parametrize("patient_assistant", ["smart", "vad"], indirect=True)
async def test_early_reply_is_adopted_when_the_pause_was_the_end(patient_assistant, speech):
    # in lockstep: the pause's transcript and Smart Turn's answer come before the next block, and the early
    # reply's first token before the audio goes on, so the outcome does not hang on the machine's load
    rec, sink, session, mic = open_session(patient_assistant, lockstep=True)
    assert session.listener.end_of_turn == patient_assistant.config.turn.engine
    await mic.play(speech("What is the capital of France?"))
    await mic.silence(2.0)
    done = await rec.turn_done()
    assert session.early_replies == {"started": 1, "adopted": 1}, done.trace["end_of_turn"]
    assert done.trace["early_reply"] is True and not done.interrupted and done.reply.strip()
    marks = done.trace["marks_ms"]
    # generation began before the end of the turn was decided, so the reply was under way at the endpoint
    # (the endpoint mark is on the audio clock, which lags a lockstep mic: compare with when it was decided)
    origin = rec.of(SpeechStarted)[0].t - marks["speech_start"] / 1000  # the monotonic time of marks_ms 0
    assert origin + marks["llm_first_token"] / 1000 < rec.time_of(SpeechStopped), marks
    assert marks["endpoint"] <= marks["first_fragment"] <= marks["playback_start"], marks
    turns = [(m["role"], m["content"]) for m in session.history if m["role"] != "system"]
    assert turns == [("user", done.transcript), ("assistant", done.reply)]
    await session.close()
    await patient_assistant.close()
    sink.close()


async def test_an_adopted_early_reply_is_the_reply_a_turn_without_one_gives(patient_assistant, speech):
    """The eager end of turn changes when the reply starts, not what it says: the same question, answered once
    with an early reply adopted and once with early replies off, gets the same words and the same history."""
    replies = []
    for early in (True, False):
        config = patient_assistant.config.model_copy(deep=True)
        config.dialog.early_reply = early
        assistant = Assistant(
            config, patient_assistant.engine, patient_assistant.stt, patient_assistant.tts, patient_assistant.vad_path
        )
        rec, sink, session, mic = open_session(assistant, lockstep=True)
        await mic.play(speech("What is the capital of France?"))
        await mic.silence(2.0)
        done = await rec.turn_done()
        assert session.early_replies["adopted"] == int(early) and bool(done.trace.get("early_reply")) is early
        replies.append((done.transcript, done.reply, [m for m in session.history if m["role"] != "system"]))
        await session.close()
        sink.close()
    assert replies[0] == replies[1] and replies[0][1].strip()


async def test_early_reply_is_dropped_when_the_user_goes_on(patient_assistant, speech):
    rec, sink, session, mic = open_session(patient_assistant, lockstep=True)  # load-independent, as above
    await mic.play(speech("What is the capital of France?"))
    # a pause long enough for an early reply, shorter than the endpoint wait (1.5 s): in 100 ms steps, so the
    # user goes on right after the early reply started
    for _ in range(13):
        await mic.silence(0.1)
        if session.early_replies["started"]:
            break
    assert session.early_replies["started"] == 1, pause_state(session)
    await mic.play(speech("And what is the capital of Germany?"))
    await mic.silence(2.0)
    done = await rec.turn_done()
    assert "germany" in done.transcript.lower() and "france" in done.transcript.lower()
    assert session.early_replies["adopted"] == 1 and session.early_replies["started"] == 2
    assert len(rec.of(TurnDone)) == 1 and not rec.of(TurnError), "the dropped guess never became a turn"
    turns = [(m["role"], m["content"]) for m in session.history if m["role"] != "system"]
    assert turns == [("user", done.transcript), ("assistant", done.reply)], "the guess left no trace in history"
    # the next turn continues from exactly this history (the dropped reply's tokens were cropped from the caches)
    second = await session.ask("Thank you.", speak=False)
    assert second.reply.strip() and [m["role"] for m in session.history if m["role"] != "system"] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    await session.close()
    sink.close()


async def test_speech_before_any_of_the_reply_continues_the_question(assistant, speech):
    """The end of turn took a pause for the end (the VAD rule at 300 ms) and the user went on before any of the
    reply was out (here because another session holds the generator): the turn hands its words over, and one
    reply answers both halves; the history holds one user message with all of them."""
    config = assistant.config.model_copy(deep=True)
    config.turn.engine, config.vad.end_silence_ms = "vad", 300
    config.dialog.early_reply = False  # an early reply would wait for the generator too
    quick = Assistant(config, assistant.engine, assistant.stt, assistant.tts, assistant.vad_path)
    rec, sink, session, mic = open_session(quick)
    async with quick.generation_lock:  # another session is generating: this turn waits for it
        await mic.play(speech("What is the capital of France?"))
        await mic.silence(0.6)
        assert rec.of(SpeechStopped), "the pause ended the turn"
        await mic.play(speech("And of Germany?"))
        await mic.silence(0.6)
        first = await rec.turn_done()
    done = await rec.turn_done(2)
    assert first.interrupted and first.reply == "" and first.trace["handed_over"] is True, first
    assert not done.interrupted and done.reply.strip(), done
    assert "france" in done.transcript.lower() and "germany" in done.transcript.lower(), done.transcript
    turns = [(m["role"], m["content"]) for m in session.history if m["role"] != "system"]
    assert turns == [("user", done.transcript), ("assistant", done.reply)], "the first half left no message"
    await session.close()
    await quick.close()
    sink.close()


async def test_multi_turn_keeps_history(assistant):
    rec = Recorder()
    session = assistant.session(rec)
    first = await session.ask("My name is Ada. Please remember it.", speak=False)
    second = await session.ask("What is my name?", speak=False)
    roles = [m["role"] for m in session.history if m["role"] != "system"]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert session.history[-1]["content"] == second.reply and first.reply in [m["content"] for m in session.history]
    assert first.turn_id == 1 and second.turn_id == 2
    await session.close()


class FakeBrokenTTS:
    """Stands in for piper and fails on the first fragment (the TTS is not under test; the state machine is)."""

    sample_rate = 22050

    async def stream(self, fragment):
        raise RuntimeError("synthesizer crashed")
        yield  # pragma: no cover


async def test_failing_stages_end_the_turn_and_the_next_turn_works(assistant, monkeypatch):
    rec = Recorder()
    session = assistant.session(rec)
    monkeypatch.setattr(session.ctx, "tts", FakeBrokenTTS())
    await session.ask("Hello there.")
    monkeypatch.undo()
    error = rec.of(TurnError)[0]
    assert error.stage == "tts" and "synthesizer crashed" in error.message
    assert session.state == State.IDLE

    async def broken_reply(text, settings=None, **kwargs):
        raise RuntimeError("model exploded")
        yield  # pragma: no cover

    monkeypatch.setattr(session.conversation, "reply", broken_reply)
    heard_before = len(rec.of(ReplyAudio))
    await session.ask("Hello again.")
    assert rec.of(TurnError)[1].stage == "llm" and session.state == State.IDLE
    # the person hears that something went wrong, not silence; the history does not keep the apology
    assert len(rec.of(ReplyAudio)) > heard_before
    assert all(LLM_FAILED_SPEECH not in m["content"] for m in session.history)
    monkeypatch.undo()
    done = await session.ask("Say hi.")
    assert not done.interrupted and done.reply and session.state == State.IDLE
    await session.close()


async def test_fifty_turns_leak_no_task_or_thread(assistant):
    session = assistant.session(None, sink=WavSink(None, assistant.tts_sample_rate, realtime=False))
    session.decode.max_new_tokens = 6
    await session.ask("Say one word.")  # warm up thread pools
    gc.collect()  # objects left by earlier tests may schedule their own cleanup tasks: let them finish first
    await asyncio.sleep(0.2)
    await session.warmed()  # the one warm-up a session runs between turns (bounded; not a leak) is done
    tasks_before = len(asyncio.all_tasks())
    threads_before = threading.active_count()
    for i in range(50):
        await session.ask(f"Say the number {i}.")
    gc.collect()
    await session.warmed()
    assert len(asyncio.all_tasks()) == tasks_before
    assert threading.active_count() <= threads_before
    await session.close()


async def test_a_long_conversation_trims_its_history_between_turns_not_in_them(assistant):
    """Between turns (at a reply's last token, and after its commit) the session trims the history ahead and
    prefills it, so no turn pays for a trim: each prefills only its new words."""
    session = assistant.session(name="long")
    session.conversation.history_tokens = 300
    try:
        prefills = []
        for i in range(8):
            await session.warmed()
            done = await session.ask(f"Name a country, number {i + 1}.", speak=False)
            prefills.append(done.trace["decoder"]["prefill_tokens"])
        assert session.conversation.trims >= 1
        assert max(prefills[1:]) < 80, prefills  # the last exchange and the new words, never the whole history
    finally:
        await session.close()
