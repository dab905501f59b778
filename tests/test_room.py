"""A home device's room: the simulated rooms (pyroomacoustics), noises mixed at a ratio, WebRTC's noise
suppressor, and the real Listener (silero VAD, Whisper tiny.en, Smart Turn) hearing a request across a room
over a fan. The audio is played in lockstep (``Listener.settle`` after each block), so what is decided depends
on the audio alone."""

from __future__ import annotations

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from audio.room import ROOMS, mix, power
from audio.webrtc import WebRtcAudio
from voice.hearing.endpointing import TurnModel
from voice.hearing.listener import Listener
from voice.hearing.stt import SpeechToText
from voice.hearing.utterance import UtteranceEnded
from voice.models import resolve
from voice.roomset import HOLDOUT, Condition, parse
from voice.speechset import TURN_LEAD_S, TURN_TAIL_S, Utterance, Voice, noise, wer

from speech import piper

BLOCK = SPEECH_RATE // 50


def _request(text: str) -> Utterance:
    """``text`` in piper's voice with the complete-turn set's lead and tail silences."""
    speech = Voice("piper-joe", "piper").speak(text)
    lead, tail = (np.zeros(int(s * SPEECH_RATE), np.int16) for s in (TURN_LEAD_S, TURN_TAIL_S))
    span = (TURN_LEAD_S, TURN_LEAD_S + len(speech) / SPEECH_RATE)
    return Utterance(f"test/{text}", Voice("piper-joe", "piper"), text, np.concatenate([lead, speech, tail]), (span,))


def _db(ratio: float) -> float:
    return 10 * float(np.log10(ratio))


def _late_energy(rir: np.ndarray) -> float:
    """Energy arriving more than 50 ms after the direct path, over the direct path's (the direct-to-reverberant
    ratio, inverted)."""
    direct = int(np.argmax(np.abs(rir)))
    return power(rir[direct + SPEECH_RATE // 20 :]) * (len(rir) - direct) / max(rir[direct] ** 2, 1e-12)


def test_a_room_rings_longer_far_from_the_microphone_and_in_the_kitchen():
    import pyroomacoustics as pra

    for room in ROOMS.values():
        near, far = (room.impulse_response(room.place(d)) for d in (1.0, 3.0))
        assert np.max(np.abs(near)) == pytest.approx(1.0) and np.max(np.abs(far)) == pytest.approx(1.0)
        assert _late_energy(far) > 1.5 * _late_energy(near), room.name  # farther: more room, less direct sound
        measured = pra.experimental.measure_rt60(near, fs=SPEECH_RATE)
        assert 0.6 * room.rt60_s < measured < 1.5 * room.rt60_s, (room.name, measured)
    living, kitchen = (
        pra.experimental.measure_rt60(r.impulse_response(r.place(1.0)), fs=SPEECH_RATE)
        for r in (ROOMS["living-room"], ROOMS["kitchen"])
    )
    assert kitchen > living


def test_noise_is_mixed_at_the_asked_ratio():
    speech = piper("Turn on the kitchen light.").astype(np.float32)
    bed = noise("brown", len(speech), seed=3)
    for snr in (20.0, 10.0, 5.0):
        mixed = mix(speech, bed, snr)
        assert _db(power(speech) / power(mixed - speech)) == pytest.approx(snr, abs=0.01)
    with pytest.raises(ValueError, match="noise of"):
        mix(speech, bed[:-1], 10.0)


def test_conditions_are_named_and_read_back():
    for condition in HOLDOUT:
        assert parse(condition.name) == condition
    assert parse("kitchen-3m+clatter@10") == Condition("kitchen", 3.0, "clatter", 10.0)
    assert parse("dry+tv@5") == Condition(None, 1.0, "tv", 5.0)
    for bad, says in (("attic", "no room"), ("kitchen+rain@10", "no noise"), ("clean+fan@5", "clean has no noise")):
        with pytest.raises(ValueError, match=says):
            parse(bad)


def test_every_condition_keeps_the_request_and_puts_its_noise_over_the_silences_too():
    utterance = _request("Turn on the kitchen lights.")
    lead = slice(0, int(utterance.spans[0][0] * SPEECH_RATE) - 800)
    for condition in HOLDOUT:
        heard = condition.hear(utterance)
        assert len(heard.audio) == len(utterance.audio) and heard.audio.dtype == np.int16
        assert heard.text == utterance.text and heard.spans == utterance.spans
        assert (power(heard.audio[lead]) > 1000) == (condition.noise is not None), condition.name


def test_the_denoiser_takes_out_a_fan_and_keeps_the_voice():
    speech = piper("Please open the garage door.")
    fan = (noise("brown", 3 * SPEECH_RATE + len(speech), seed=5) * 2000).astype(np.int16)
    audio = fan.copy()
    audio[2 * SPEECH_RATE : 2 * SPEECH_RATE + len(speech)] += speech
    for block in (7, 320, 1000):
        denoiser = WebRtcAudio(noise=True)
        out = np.concatenate([denoiser.process(audio[i : i + block]) for i in range(0, len(audio), block)])
        assert len(out) == len(audio)
        late = slice(SPEECH_RATE, 2 * SPEECH_RATE)  # the noise alone, after a second to learn it
        voice = slice(2 * SPEECH_RATE + denoiser.delay_samples, 2 * SPEECH_RATE + len(speech))
        assert _db(power(audio[late]) / power(out[late])) > 10, block
        assert abs(_db(power(audio[voice]) / power(out[voice]))) < 3, block


@pytest.fixture(scope="module")
def stt(small_config):
    return SpeechToText(resolve(small_config.models.stt, "stt"), small_config.stt)


@pytest.mark.parametrize("suppress", [False, True], ids=["raw", "denoised"])
async def test_a_request_across_the_living_room_over_a_fan_is_heard_once_and_ends_in_the_noise(
    small_config, stt, suppress
):
    """Said 3 m from the device in the living room with a fan 5 dB under the voice: one turn, the request's
    words, ended while the fan still runs (a steady noise must not hold the turn open)."""
    audio = small_config.audio.model_copy(update={"noise_suppression": suppress})
    config = small_config.model_copy(update={"audio": audio})
    listener = Listener.from_config(config, stt, turn_model=TurnModel.load(config))
    assert (listener.denoise is not None) == suppress
    request = _request("Open the garage door.")
    heard = Condition("living-room", 3.0, "fan", 5.0).hear(request)
    ended = []
    for i in range(0, len(heard.audio), BLOCK):
        for event in await listener.accept_chunk(heard.audio[i : i + BLOCK], 1000.0 + i / SPEECH_RATE):
            if isinstance(event, UtteranceEnded):
                ended.append((await event.utterance.final(), event.utterance.endpoint - 1000.0))
        await listener.settle()
    await listener.close()
    assert len(ended) == 1, ended
    text, endpoint = ended[0]
    assert wer(request.text, text) <= 0.25, text
    assert endpoint < request.speech_end + TURN_TAIL_S, (endpoint, request.speech_end)
