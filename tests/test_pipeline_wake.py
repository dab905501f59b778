"""The device's wake word end to end on the small real models: speech without "hey jarvis" opens no turn, and
after a reply the user goes on without it for the follow-up window (conversation mode)."""

from __future__ import annotations

import pytest

from voice.assistant import Assistant
from voice.events import SpeechStarted, TranscriptFinal, TurnDone
from voice.hearing.listener import WAKE_WINDOW_S

from test_pipeline import Mic, Recorder, small_assistant, spoken_by

assistant = pytest.fixture(small_assistant, scope="module", name="assistant")
speech = pytest.fixture(spoken_by, scope="module", name="speech")


def _with_wake_word(assistant: Assistant, rec: Recorder):
    """A session of ``assistant`` as the device's microphone has it: it listens for "hey jarvis"."""
    from voice.models import resolve

    config = assistant.config.model_copy(deep=True)
    config.models.wake_word = "hey_jarvis"
    woken = Assistant(
        config,
        assistant.engine,
        assistant.stt,
        assistant.tts,
        assistant.vad_path,
        str(resolve("hey_jarvis", "wake").path),
    )
    session = woken.session(rec)
    session.listener.wake = woken.wake_word()
    return session


async def test_wake_word_gates_turns(assistant, speech):
    rec = Recorder()
    session = _with_wake_word(assistant, rec)
    mic = Mic(session, speed=2.0)
    await mic.play(speech("What time is it?"))
    await mic.silence(1.0)
    assert not rec.of(SpeechStarted), "speech without the wake word is not for us"
    await mic.play(speech("Hey Jarvis!"))
    await mic.play(speech("What time is it?"))
    await mic.silence(1.0)
    await rec.wait_for(lambda e: isinstance(e, TranscriptFinal))
    assert rec.of(SpeechStarted)
    await session.cancel()
    await session.close()


async def test_after_a_reply_the_user_goes_on_without_the_wake_word(assistant, speech):
    """Conversation mode: speech that starts within audio.follow_up_s of the reply's end opens a turn with no wake
    word (an answer to a question back, a second request); later speech needs the wake word again."""
    rec = Recorder()
    session = _with_wake_word(assistant, rec)
    session.listener.follow_up_s = WAKE_WINDOW_S + 3.0
    mic = Mic(session, speed=2.0)
    await mic.play(speech("Hey Jarvis!"))
    await mic.play(speech("What time is it?"))
    await mic.silence_until(lambda: bool(rec.of(TurnDone)))
    assert await rec.turn_done(1) is not None
    await mic.silence(WAKE_WINDOW_S)  # the wake word's own window is over: only the follow-up window is open
    await mic.play(speech("And what day is it today?"))
    await mic.silence_until(lambda: len(rec.of(TurnDone)) >= 2)
    assert await rec.turn_done(2) is not None
    assert len(rec.of(SpeechStarted)) == 2
    await mic.silence(session.listener.follow_up_s + 1.0)
    await mic.play(speech("What time is it?"))
    await mic.silence(1.0)
    assert len(rec.of(SpeechStarted)) == 2, "after the follow-up window, speech needs the wake word again"
    await session.close()
