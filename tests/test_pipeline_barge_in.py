"""Talking over a reply, end to end on the small real models: a barge-in at several moments trims the history to
what was heard, a backchannel leaves the reply playing, and neither a short noise nor the assistant's own voice
through the room barges in."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.sinks import WavSink
from voice.events import (
    ReplyAudio,
    ReplyTextDelta,
    SpeechStarted,
    State,
    StateChanged,
    TranscriptFinal,
    TranscriptPartial,
    TurnDone,
    TurnError,
)

from test_pipeline import BLOCK, Mic, Recorder, small_assistant, spoken_by

assistant = pytest.fixture(small_assistant, scope="module", name="assistant")
speech = pytest.fixture(spoken_by, scope="module", name="speech")


async def _reply_in_progress(assistant, speech, rec, sink, until):
    session = assistant.session(rec, sink=sink)
    mic = Mic(session)
    await mic.play(speech("Tell me a long story about a brave little fox."))
    feeder = asyncio.create_task(mic.silence(30.0))
    async with asyncio.timeout(120):  # polled: a reply generated at once sends no event while it plays
        while not any(until(e) for e in rec.events):
            await asyncio.sleep(0.02)
    feeder.cancel()
    await asyncio.gather(feeder, return_exceptions=True)
    return session, mic


@pytest.mark.parametrize("moment", ["thinking", "first_fragment", "mid_answer"])
async def test_barge_in_trims_history_to_what_was_heard(assistant, speech, moment):
    rec, sink = Recorder(), WavSink(None, assistant.tts_sample_rate, realtime=True)
    conditions = {
        "thinking": lambda e: isinstance(e, StateChanged) and e.state == State.THINKING,
        "first_fragment": lambda e: isinstance(e, ReplyAudio),
        "mid_answer": lambda e: sink.played_samples > assistant.tts_sample_rate * 1.0,
    }
    session, mic = await _reply_in_progress(assistant, speech, rec, sink, conditions[moment])
    played_before = sink.played_samples
    await mic.play(speech("Stop, wait a moment please."))
    await rec.wait_for(lambda e: isinstance(e, TurnDone))
    done = rec.of(TurnDone)[0]
    assert done.interrupted
    assert sink.queued_samples == 0, "playback was flushed"
    generated = "".join(e.text for e in rec.of(ReplyTextDelta))
    replies = [m["content"] for m in session.history if m["role"] == "assistant"]
    # an assistant message only if some of the reply was heard (never an empty one)
    if moment == "thinking":
        assert played_before == 0 and done.reply == "" and replies == []
    else:
        assert replies == ([done.reply] if done.reply else []), "the history keeps exactly what was heard"
        assert generated.split()[: len(done.reply.split())] == done.reply.split(), "heard text is a prefix"
        assert len(done.reply) < len(generated.strip()), "the unheard rest is gone"
    # the question, then the interruption: one burst, or two when its comma outlasts the VAD's end silence on a
    # loaded CPU ("Stop," / "wait a moment please.", seen once in a full-suite run; a hold counts each burst)
    assert sum(isinstance(e, SpeechStarted) for e in rec.events) in (2, 3)
    await mic.silence(1.3)  # the interrupting speech becomes the next turn (max_silence_ms fits)
    await rec.wait_for(
        lambda e: (
            isinstance(e, TranscriptFinal)
            and "stop" in e.text.lower()
            or isinstance(e, TranscriptFinal)
            and "wait" in e.text.lower()
        )
    )
    await session.close()
    sink.close()


@pytest.mark.parametrize("said", ["Okay.", "Yeah, okay."])
async def test_a_backchannel_during_a_reply_leaves_it_playing(assistant, speech, said):
    """'Mhm' while the reply is heard: its audio is held at once, then goes on from where it stopped; nothing of
    it is lost, the history keeps the whole reply, and the 'mhm' never becomes a turn."""
    rec, sink = Recorder(), WavSink(None, assistant.tts_sample_rate, realtime=True)
    mid = lambda e: sink.played_samples > assistant.tts_sample_rate * 0.5  # noqa: E731
    session, mic = await _reply_in_progress(assistant, speech, rec, sink, mid)
    await mic.play(speech(said))
    feeder = asyncio.create_task(mic.silence(120.0))
    done = await rec.turn_done(timeout=180)
    await asyncio.sleep(1.0)  # room for a wrong second turn to show up
    feeder.cancel()
    await asyncio.gather(feeder, return_exceptions=True)
    heard = [(type(e).__name__, e.text) for e in rec.events if isinstance(e, TranscriptPartial | TranscriptFinal)]
    assert done is not None and not done.interrupted, (session.backchannels, heard[2:])
    assert session.backchannels == {"held": 1, "resumed": 1, "interrupted": 0}, (session.backchannels, heard)
    # judged a backchannel on its words (the turn's trace lists it too when the turn was still running then: a
    # reply generated before it is heard has sent its TurnDone already)
    assert [verdict for *_, verdict in session.held_words] == [True], session.held_words
    assert "backchannels" not in done.trace or len(done.trace["backchannels"]) == 1, done.trace
    sent = sum(len(e.samples) for e in rec.of(ReplyAudio))
    for _ in range(300):  # a turn that handed all its audio over is done before the speaker has played it
        if sink.queued_samples == 0:
            break
        await asyncio.sleep(0.1)
    assert sent == sink.played_samples, "every sample was played"
    assert session.history[-1] == {"role": "assistant", "content": done.reply}
    assert len(rec.of(TurnDone)) == 1 and not rec.of(TurnError), "the backchannel was not answered"
    await session.close()
    sink.close()


async def test_short_noise_is_not_a_barge_in(assistant, speech):
    rec, sink = Recorder(), WavSink(None, assistant.tts_sample_rate, realtime=True)
    session, mic = await _reply_in_progress(assistant, speech, rec, sink, lambda e: isinstance(e, ReplyAudio))
    blip = speech("Mhm.")
    voiced = np.flatnonzero(np.abs(blip) > 500)
    short = blip[voiced[0] : voiced[0] + int(0.12 * SPEECH_RATE)]  # 120 ms: under vad.min_speech_ms
    await mic.play(short)
    await mic.silence(0.5)
    feeder = asyncio.create_task(mic.silence(60.0))
    done = await rec.turn_done()
    feeder.cancel()
    assert done is not None and not done.interrupted
    assert len(rec.of(SpeechStarted)) == 1
    await session.close()
    sink.close()


async def test_own_voice_through_the_room_never_barges_in(assistant, speech):
    """A simulated room: what the assistant plays comes back into the microphone 60 ms later at 0.5 gain."""
    rec, sink = Recorder(), WavSink(None, assistant.tts_sample_rate, realtime=True)
    played = np.zeros(0, np.int16)  # the reply audio at 16 kHz, in playback order

    def on_event(event):
        nonlocal played
        if isinstance(event, ReplyAudio):
            played = np.concatenate([played, resample(event.samples, event.sample_rate, SPEECH_RATE)])
        rec(event)

    session = assistant.session(on_event, sink=sink)
    mic = Mic(session, speed=1.0)
    await mic.play(speech("Tell me about the ocean."))
    start = None

    def reference(t, n):  # what the speaker played in this block, and the echo of it
        nonlocal start
        if sink.first_audible_t is None:
            return np.zeros(n, np.int16)
        start = start if start is not None else t
        i = int((t - start) * SPEECH_RATE)
        return np.pad(played[i : i + n], (0, max(0, n - len(played[i : i + n]))))

    async def room():
        delay = int(0.06 * SPEECH_RATE)
        history = np.zeros(delay, np.int16)
        while True:
            ref = reference(mic.t, BLOCK)
            history = np.concatenate([history, ref])
            echo = (history[:BLOCK] * 0.5).astype(np.int16)
            history = history[BLOCK:]
            await session.push_audio(echo, mic.t, reference=ref)
            mic.t += BLOCK / SPEECH_RATE
            await asyncio.sleep(BLOCK / SPEECH_RATE)

    task = asyncio.create_task(room())
    done = await rec.turn_done(timeout=180)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert done is not None and not done.interrupted
    assert len(rec.of(SpeechStarted)) == 1, "only the user's question started speech"
    await session.close()
    sink.close()
