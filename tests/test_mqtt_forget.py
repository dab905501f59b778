"""An MQTT ask's fresh conversation on a kept session (voice/transports/mqtt/commands.py ``forget_history``)."""

from __future__ import annotations

import asyncio

import pytest

from audio.sinks import WavSink
from voice.assistant import Assistant
from voice.transports.mqtt.commands import forget_history


@pytest.fixture(scope="module")
def assistant(small_config):
    return Assistant.load_sync(small_config)


async def test_a_fresh_conversation_stops_a_reply_still_running_first(assistant):
    """An ask without a conversation starts the speaker's history afresh; a reply of that session still running
    (the device answering someone, a turn a noisy room kept open) is stopped first, then only the system prompt
    stays, and the next question is answered."""
    sink = WavSink(None, assistant.tts_sample_rate, realtime=True)  # the reply plays at a speaker's pace
    session = assistant.session(sink=sink)
    running = asyncio.create_task(session.ask("Tell me a long story about a lighthouse keeper."))
    for _ in range(3000):
        if session.replying and sink.played_samples > 0:
            break
        await asyncio.sleep(0.01)
    assert session.replying and session.conversation.uncommitted  # the reply is streaming
    await forget_history(session)
    done = await running
    assert done.interrupted
    assert [m["role"] for m in session.history] == ["system"]
    answer = await session.ask("What colour is the sky on a clear day?", speak=False)
    assert answer.reply.strip() and [m["role"] for m in session.history] == ["system", "user", "assistant"]
    await session.close()
    sink.close()
