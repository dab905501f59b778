"""What counts as a backchannel ("mhm") and what as an interruption, and the sink hold the session uses."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from audio.sinks import HoldableSink, WavSink
from voice.dialog.backchannel import clearly_interrupts, is_backchannel


@pytest.mark.parametrize(
    "text",
    [
        "Mhm.",
        "Mm-hmm.",
        "Uh-huh.",
        "Yeah.",
        "Yeah, okay.",
        "Right.",
        "Okay!",
        "I see.",
        "(coughs)",
        "[laughter]",
        "Ha ha.",
        "",
        "  ",
    ],
)
def test_acknowledgements_and_sounds_are_backchannels(text):
    assert is_backchannel(text)


@pytest.mark.parametrize(
    "text",
    [
        "Stop.",
        "Wait.",
        "No, I meant the other one.",
        "Hold on.",
        "Yeah, but what about Paris?",
        "Okay stop",
        "Thank you, that's enough.",
        "What?",
    ],
)
def test_anything_else_is_an_interruption(text):
    assert not is_backchannel(text)


def test_an_acknowledgement_said_too_long_is_no_backchannel():
    """Whisper under the held prompt may write real words as "Mm-hmm."; 1.7 s of voice is not a hum."""
    assert is_backchannel("Yeah, okay.", 1.2)
    assert is_backchannel("Mm-hmm.", 0.5)
    assert not is_backchannel("Mm-hmm.", 1.7)


async def test_a_held_sink_keeps_its_queue_and_plays_on_from_the_same_sample():
    sink = WavSink(None, 16000, realtime=True, block_ms=20)
    assert isinstance(sink, HoldableSink)
    audio = (np.arange(16000) % 1000 + 1).astype(np.int16)  # 1 s, no zero sample
    await sink.write(audio)
    await asyncio.sleep(0.2)
    sink.hold()
    await asyncio.sleep(0.05)  # the block being pumped when the hold came may finish
    held_at = sink.played_samples
    await asyncio.sleep(0.3)
    assert sink.played_samples == held_at and 0 < held_at < len(audio), "nothing plays while held"
    sink.release()
    await sink.drain()
    assert sink.played_samples == len(audio)
    assert np.array_equal(sink.audio, audio), "the same samples, in order, none lost or repeated"
    sink.close()


async def test_flush_ends_a_hold():
    sink = WavSink(None, 16000, realtime=True, block_ms=20)
    await sink.write(np.ones(16000, np.int16))
    sink.hold()
    sink.flush()
    assert not sink.held and sink.queued_samples == 0
    await sink.write(np.ones(320, np.int16))
    await sink.drain()
    assert sink.played_samples >= 320
    sink.close()


@pytest.mark.parametrize("text", ["Uh...", "Hmm, yes.", "Tick.", ""])
def test_a_short_sound_whisper_guessed_at_is_a_backchannel(text):
    assert is_backchannel(text, voiced_s=0.5)


@pytest.mark.parametrize("text", ["Yeah. That's", "I see. See you", "Mm-hmm. And"])
def test_an_acknowledgement_whisper_ran_on_from_is_a_backchannel_when_the_voice_was_short(text):
    assert is_backchannel(text, voiced_s=0.3)  # no room in 0.3 s of voice for the words after it
    assert not is_backchannel(text, voiced_s=1.0)  # "yeah, that's ..." said: the user goes on


@pytest.mark.parametrize("text", ["Yeah, but no.", "Okay, stop.", "Yeah, tell me more about it."])
def test_an_acknowledgement_then_a_request_is_an_interruption_however_short(text):
    assert not is_backchannel(text, voiced_s=0.3)


def test_a_short_phrase_off_the_list_is_an_interruption():
    assert not is_backchannel("Sit up.", voiced_s=0.3)  # "Stop, that's enough." with its start gated


@pytest.mark.parametrize("text", ["Stop.", "Wait.", "No.", "What?", "Hold on."])
def test_a_short_word_that_asks_to_stop_is_an_interruption(text):
    assert not is_backchannel(text, voiced_s=0.5)


def test_a_long_utterance_off_the_list_is_an_interruption():
    assert not is_backchannel("And may Chen.", voiced_s=1.5)


@pytest.mark.parametrize(
    ("partial", "stop_now"),
    [
        ("Stop", True),
        ("Wait, what", True),
        ("Actually, tell me about dogs", True),
        ("And may", False),
        ("Mm-hmm, yeah", False),
        ("Open the second", False),
    ],
)
def test_a_partial_stops_the_reply_only_when_it_clearly_interrupts(partial, stop_now):
    assert clearly_interrupts(partial, speaking_s=1.2) is stop_now


def test_a_long_partial_from_a_short_sound_waits_for_its_end():
    assert not clearly_interrupts("I'm going to go ahead", speaking_s=0.5)  # Whisper's sentence for a hum
    assert clearly_interrupts("Wait", speaking_s=0.3)
