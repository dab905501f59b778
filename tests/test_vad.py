"""VAD on real synthetic speech with known boundaries: start and end within +-150 ms, leading and trailing
silence, a pause inside a sentence that must not end the turn, and a pre-roll that keeps the first syllable."""

import numpy as np
import pytest

from audio.frames import AudioChunk
from audio.vad import Vad
from voice.models import resolve

from speech import espeak, piper, silence, voiced_bounds

TOLERANCE = 0.150


@pytest.fixture(scope="module")
def silero_path():
    return resolve("silero-vad", "vad").path


def run_vad(vad, signal, block=320, t0=100.0):
    events = []
    for i in range(0, len(signal), block):
        events += vad.process(AudioChunk(signal[i : i + block], 16000, t0 + i / 16000))
    return events


def make(engine, path, **kw):
    return Vad(path if engine == "silero" else None, engine=engine, **kw)


@pytest.mark.parametrize("engine", ["silero", "webrtc"])
@pytest.mark.parametrize("voice", [espeak, piper])
def test_start_and_end_within_150_ms_of_the_known_boundaries(engine, voice, silero_path):
    speech = voice("Turn on the lights in the kitchen, please.")
    signal = np.concatenate([silence(1200), speech, silence(1000)])
    start, end = voiced_bounds(signal)
    events = run_vad(make(engine, silero_path, end_silence_ms=500), signal)
    assert [e.kind for e in events] == ["speech_start", "speech_end"]
    assert events[0].t - 100.0 == pytest.approx(start, abs=TOLERANCE)
    assert events[1].t - 100.0 == pytest.approx(end, abs=TOLERANCE)
    # the end is decided after the configured silence, never before it
    assert events[1].decided_t - events[1].t == pytest.approx(0.5, abs=0.04)


@pytest.mark.parametrize("engine", ["silero", "webrtc"])
def test_a_pause_inside_the_sentence_does_not_end_the_turn(engine, silero_path):
    first, second = espeak("Turn on the lights"), espeak("in the kitchen and the hall.")
    signal = np.concatenate([silence(800), first, silence(300), second, silence(900)])
    start, _ = voiced_bounds(signal)
    _, end = voiced_bounds(signal[: int(16000 * 0.8) + len(first) + 4800 + len(second)])
    events = run_vad(make(engine, silero_path, end_silence_ms=600), signal)
    assert [e.kind for e in events] == ["speech_start", "speech_end"]
    assert events[0].t - 100.0 == pytest.approx(start, abs=TOLERANCE)
    assert events[1].t - 100.0 == pytest.approx(end, abs=TOLERANCE)


def test_a_long_pause_splits_two_utterances(silero_path):
    a, b = piper("What time is it?"), piper("And the weather?")
    signal = np.concatenate([silence(500), a, silence(1200), b, silence(900)])
    events = run_vad(make("silero", silero_path, end_silence_ms=500), signal)
    assert [e.kind for e in events] == ["speech_start", "speech_end"] * 2
    b_start = 0.5 + len(a) / 16000 + 1.2  # a and b are trimmed to their voiced samples
    assert events[2].t - 100.0 == pytest.approx(b_start, abs=TOLERANCE)


def test_preroll_holds_the_first_syllable_and_the_stream_continues_seamlessly(silero_path):
    speech = piper("Kitchen lights on.")
    signal = np.concatenate([silence(1000), speech, silence(800)])
    vad = make("silero", silero_path, preroll_ms=300, min_speech_ms=200)
    collected, started = [], False
    for i in range(0, len(signal), 320):
        chunk = AudioChunk(signal[i : i + 320], 16000, i / 16000)
        if started:
            collected.append(chunk.samples)
        for event in vad.process(chunk):
            if event.kind == "speech_start":
                started = True
                collected.append(event.audio)
                begin = round((event.t - 0.3) * 16000)
    heard = np.concatenate(collected)
    # what the pipeline collects is the signal from 300 ms before the start, with no gap and no repeat
    np.testing.assert_array_equal(heard, signal[begin : begin + len(heard)])
    assert begin <= int(16000 * voiced_bounds(signal)[0]) - 16000 * 0.15  # the first syllable is inside


def test_silence_and_noise_give_no_events(silero_path):
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 200, 16000 * 3).astype(np.int16)  # a quiet fan
    for engine in ("silero", "webrtc"):
        assert run_vad(make(engine, silero_path), np.concatenate([silence(1000), noise])) == []


def test_min_speech_ignores_a_click(silero_path):
    click = (np.sin(np.arange(800) / 3) * 20000).astype(np.int16)  # 50 ms burst
    assert (
        run_vad(make("silero", silero_path, min_speech_ms=200), np.concatenate([silence(500), click, silence(800)]))
        == []
    )


def test_reset_and_bad_input(silero_path, tmp_path):
    vad = make("silero", silero_path)
    with pytest.raises(ValueError, match="16000 Hz"):
        vad.process(AudioChunk(np.zeros(441, np.int16), 44100, 0.0))
    with pytest.raises(FileNotFoundError, match="vad.engine = 'webrtc'"):
        Vad(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="unknown VAD engine"):
        Vad(None, engine="nope")


def test_a_gap_in_the_stream_does_not_shift_later_events(silero_path):
    """A client that stops sending for a while (websocket turns): events after the gap are on the new clock.
    1600-sample chunks never divide into 512-sample windows, so leftover samples straddle the gap."""
    vad = make("silero", silero_path, end_silence_ms=500)
    speech = piper("What time is it?")
    first = np.concatenate([silence(500), speech, silence(900)])
    events = run_vad(vad, first, block=1600, t0=100.0)
    gap_t0 = 100.0 + len(first) / 16000 + 5.0  # five seconds with no audio at all
    second = np.concatenate([silence(500), speech, silence(900)])
    later = run_vad(vad, second, block=1600, t0=gap_t0)
    start, _ = voiced_bounds(second)
    assert [e.kind for e in events + later] == ["speech_start", "speech_end"] * 2
    assert later[0].t - gap_t0 == pytest.approx(start, abs=TOLERANCE)
