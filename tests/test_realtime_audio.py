"""The SNR of a tone through the websocket's audio paths, before (a fresh resampler for every chunk, as the server
did) and after (one stream resampler per session in, one per response out).

In: a 440 Hz tone sent to a running server as `input_audio_buffer.append`s of irregular 20-100 ms, captured where
the session's ears receive it (16 kHz). Out: the same tone through a response's audio path (the voice's 22.05 kHz
to the wire), decoded from its `response.output_audio.delta`s. Print the figures with
`pytest -s tests/test_realtime_audio.py`.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from audio import g711
from audio.resample import resample
from voice.assistant import Assistant
from voice.transports.realtime.items import Items
from voice.transports.realtime.responses import Responses
from voice.transports.realtime.wire import WIRE_RATE, WireFormat

from realtime_client import b64, make_config, realtime
from test_audio_codecs import realtime_chunks, snr_db, tone


@pytest.fixture(scope="module")
def assistant(small_config):
    return Assistant.load_sync(small_config)


async def through_server_input(assistant: Any, fmt: dict, wire: np.ndarray, rate: int, encode) -> np.ndarray:
    """Send ``wire`` (int16 at ``rate``) in irregular appends; return what the session's ears got (16 kHz)."""
    got: list[np.ndarray] = []
    async with realtime(make_config(assistant), assistant) as (client, session):
        await client.send(
            type="session.update",
            session={"type": "realtime", "audio": {"input": {"format": fmt, "turn_detection": None}}},
        )  # manual turns: the VAD stays out of the way
        await client.until("session.updated")
        push = session.push_audio

        async def tap(samples, *args, **kwargs):  # records what reaches the ears (the real method runs)
            got.append(samples.copy())
            await push(samples, *args, **kwargs)

        session.push_audio = tap
        for c in realtime_chunks(len(wire), rate):
            await client.send(type="input_audio_buffer.append", audio=encode(wire[c]))
        await client.send(type="input_audio_buffer.clear")  # every append is handled once this is answered
        await client.until("input_audio_buffer.cleared")
    return np.concatenate(got)


async def test_tone_snr_through_the_server_input_path(assistant):
    x = tone(WIRE_RATE, 3.0)
    before = np.concatenate([resample(x[c], WIRE_RATE, 16000) for c in realtime_chunks(len(x), WIRE_RATE)])
    after = await through_server_input(assistant, {"type": "audio/pcm", "rate": WIRE_RATE}, x, WIRE_RATE, b64)
    before_db, after_db = snr_db(before, 16000), snr_db(after, 16000)
    print(
        f"\n440 Hz tone, 24 kHz pcm appends of 20-100 ms -> the ears (16 kHz): before (a resampler per chunk) "
        f"{before_db:.1f} dB, after (one per session) {after_db:.1f} dB"
    )
    assert after_db >= 80.0 and before_db < 50.0, (before_db, after_db)
    assert abs(len(after) - len(x) * 16000 // WIRE_RATE) <= 16000 * 0.04  # only the stream's held-back tail is missing


async def test_tone_snr_through_the_server_g711_input(assistant):
    x = tone(g711.RATE, 3.0)

    def ulaw(samples: np.ndarray) -> str:
        return base64.b64encode(g711.ulaw_encode(samples)).decode()

    after = await through_server_input(assistant, {"type": "audio/pcmu"}, x, g711.RATE, ulaw)
    after_db = snr_db(after, 16000)
    print(
        f"\n440 Hz tone, G.711 u-law 8 kHz appends -> the ears (16 kHz): {after_db:.1f} dB (G.711 itself: "
        f"{snr_db(g711.ulaw_decode(g711.ulaw_encode(x)), g711.RATE):.1f} dB)"
    )
    assert after_db > 33.0, after_db  # the codec's ~38 dB, nothing lost on the way


def test_tone_snr_through_a_response_audio_path():
    """The voice's 22.05 kHz in irregular chunks (piper's sentence chunks are any length) -> a response's deltas."""
    voice_rate = 22050
    sent: list[dict] = []

    class NoConversation:
        messages: list[dict] = []

    responses = Responses(
        lambda kind, **f: sent.append({"type": kind, **f}),
        Items(NoConversation(), lambda: False, max_items=64, max_chars=1000),
        "conv",
        voice_rate,
    )
    x = tone(voice_rate, 3.0)
    chunks = realtime_chunks(len(x), voice_rate)
    responses.open(["audio"], None, WireFormat(), 96)
    for c in chunks:
        responses.audio_delta(x[c])
    responses.close("completed")
    after = np.concatenate(
        [np.frombuffer(base64.b64decode(e["delta"]), "<i2") for e in sent if e["type"] == "response.output_audio.delta"]
    )
    before = np.concatenate([resample(x[c], voice_rate, WIRE_RATE) for c in chunks])
    before_db, after_db = snr_db(before, WIRE_RATE), snr_db(after, WIRE_RATE)
    print(
        f"\n440 Hz tone, voice 22.05 kHz -> response deltas at 24 kHz: before {before_db:.1f} dB, "
        f"after {after_db:.1f} dB"
    )
    assert after_db >= 80.0 and before_db < 50.0, (before_db, after_db)
    assert len(after) == round(len(x) * WIRE_RATE / voice_rate)  # the tail is flushed into the last delta
