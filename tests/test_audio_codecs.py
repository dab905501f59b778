"""Audio on the wire: G.711 against the stdlib's audioop (an independent reference), and the streaming resampler
against the old chunk-by-chunk way, measured as the SNR of a 440 Hz tone.

Measured here (5 s tone at half scale; SNR = the best-fitting 440 Hz sinusoid over the rest):
                                               fresh resample() per chunk      one StreamResampler (HQ)
                                               irregular 20-100 ms / 20 ms     any chunking
  24 kHz -> 16 kHz (client to the ears)            23.3 dB / 38.5 dB              91.2 dB
  22.05 kHz -> 24 kHz (piper to the client)        19.7 dB / 41.6 dB              89.4 dB
  8 kHz -> 16 kHz (a G.711 client to the ears)     35.0 dB / 30.0 dB              91.1 dB
Fixed 20 ms chunks show the clicks alone; irregular ones add a slipping phase, because each chunk's output
length is rounded on its own.
Print the figures with: pytest -s tests/test_audio_codecs.py -k snr
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audio import g711
from audio.resample import StreamResampler, resample

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop", reason="audioop left the stdlib in Python 3.13")

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))
TONE_HZ = 440.0


# ---- G.711 ---------------------------------------------------------------------------------------------------


def test_ulaw_matches_audioop_on_every_sample_and_code():
    assert g711.ulaw_encode(ALL_INT16) == audioop.lin2ulaw(ALL_INT16.tobytes(), 2)
    assert g711.ulaw_decode(ALL_CODES).tobytes() == audioop.ulaw2lin(ALL_CODES, 2)


def test_alaw_matches_audioop_on_every_sample_and_code():
    assert g711.alaw_encode(ALL_INT16) == audioop.lin2alaw(ALL_INT16.tobytes(), 2)
    assert g711.alaw_decode(ALL_CODES).tobytes() == audioop.alaw2lin(ALL_CODES, 2)


@pytest.mark.parametrize(
    "encode, decode", [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)], ids=["ulaw", "alaw"]
)
def test_g711_round_trip_keeps_a_tone_at_telephone_quality(encode, decode):
    x = tone(g711.RATE, 1.0)
    data = encode(x)
    assert isinstance(data, bytes) and len(data) == len(x)  # one byte a sample
    y = decode(data)
    assert y.dtype == np.int16 and len(y) == len(x)
    assert decode(encode(y)).tobytes() == y.tobytes()  # decoded values are fixed points
    assert 33 < snr_db(y, g711.RATE) < 45  # G.711's ~38 dB for a loud tone


def test_g711_takes_only_int16():
    with pytest.raises(TypeError, match="int16"):
        g711.ulaw_encode(np.zeros(4, np.float32))
    assert g711.alaw_decode(b"").dtype == np.int16


# ---- the streaming resampler ---------------------------------------------------------------------------------


def tone(rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(amplitude * 32767 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.int16)


def snr_db(x: np.ndarray, rate: int, edge_s: float = 0.05) -> float:
    """Tone power over everything else: the best-fitting 440 Hz sinusoid (any phase, any offset) is the signal,
    the rest (clicks, a phase that slips, quantisation) is noise. The edges are left out: a stream starts and
    ends with its filter's ramp however it is cut."""
    x = x.astype(np.float64)[int(edge_s * rate) : len(x) - int(edge_s * rate)]
    t = np.arange(len(x)) / rate
    basis = np.stack([np.sin(2 * np.pi * TONE_HZ * t), np.cos(2 * np.pi * TONE_HZ * t), np.ones_like(t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, x, rcond=None)
    signal = basis[:, :2] @ coef[:2]
    noise = x - basis @ coef
    return float(10 * np.log10(np.sum(signal**2) / np.sum(noise**2)))


def realtime_chunks(n: int, rate: int, fixed_ms: int | None = None, seed: int = 7) -> list[slice]:
    """Irregular 20-100 ms chunks, as Realtime clients send them (and as TTS fragments come), or fixed ones."""
    rng = np.random.default_rng(seed)
    out, i = [], 0
    while i < n:
        k = rate * fixed_ms // 1000 if fixed_ms else int(rng.uniform(0.020, 0.100) * rate)
        out.append(slice(i, min(n, i + k)))
        i += k
    return out


def per_chunk(x: np.ndarray, src: int, dst: int, chunks: list[slice]) -> np.ndarray:
    """The old way: a fresh resample() for every chunk."""
    return np.concatenate([resample(x[c], src, dst) for c in chunks])


def streamed(x: np.ndarray, src: int, dst: int, chunks: list[slice]) -> np.ndarray:
    stream = StreamResampler(src, dst)
    return np.concatenate([stream.push(x[c]) for c in chunks] + [stream.flush()])


@pytest.mark.parametrize("fixed_ms", [None, 20], ids=["irregular", "20ms"])
@pytest.mark.parametrize(
    "src, dst, direction",
    [
        (24000, 16000, "client -> ears"),
        (22050, 24000, "piper -> client"),
        (8000, 16000, "g711 client -> ears"),
        (16000, 24000, "16 kHz voice -> client"),
    ],
)
def test_tone_snr_stream_against_fresh_resampler_per_chunk(src, dst, direction, fixed_ms):
    x = tone(src, 5.0)
    chunks = realtime_chunks(len(x), src, fixed_ms)
    old, new = per_chunk(x, src, dst, chunks), streamed(x, src, dst, chunks)
    old_db, new_db = snr_db(old, dst), snr_db(new, dst)
    print(
        f"\n440 Hz tone {src} -> {dst} Hz ({direction}), {f'{fixed_ms} ms' if fixed_ms else 'irregular 20-100 ms'} "
        f"chunks: fresh resample() per chunk {old_db:.1f} dB, one StreamResampler {new_db:.1f} dB"
    )
    assert new_db >= 80.0, new_db
    assert old_db < 50.0, old_db  # what the stream fixes is real
    assert len(new) == round(len(x) * dst / src)  # no sample lost or made up over 5 s


def test_stream_equals_resampling_the_whole_signal():
    """Chunking is invisible: the stream gives what one resample() of the whole signal gives (to a step)."""
    rng = np.random.default_rng(1)
    x = np.clip(rng.normal(0, 4000, 24000 * 2), -32768, 32767).astype(np.int16)
    whole = resample(x, 24000, 16000).astype(np.int32)
    got = streamed(x, 24000, 16000, realtime_chunks(len(x), 24000)).astype(np.int32)
    assert np.abs(got - whole).max() <= 2


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=30))
def test_any_chunking_gives_the_same_stream(sizes):
    """Empty, one-sample and odd-sized pushes are all fine: the output depends on the audio, not on the cuts."""
    x = tone(22050, sum(sizes) / 22050 + 0.01)[: sum(sizes)]
    stream, out, i = StreamResampler(22050, 24000), [], 0
    for k in sizes:
        out.append(stream.push(x[i : i + k]))
        i += k
    got = np.concatenate(out + [stream.flush()])
    one = StreamResampler(22050, 24000)
    whole = np.concatenate([one.push(x), one.flush()])
    assert len(got) == len(whole)
    assert np.array_equal(got, whole) or np.abs(got.astype(np.int32) - whole.astype(np.int32)).max() <= 1


def test_stream_lag_is_small_and_flush_starts_a_new_stream():
    stream = StreamResampler(24000, 16000)
    for _ in range(50):  # 1 s in 20 ms appends
        stream.push(tone(24000, 0.02))
        assert stream.pending_ms < 40.0  # soxr holds back a little: measured 7-37 ms at HQ
    tail = stream.flush()
    assert len(tail) > 0 and stream.pending_ms == 0.0 and stream.samples_in == 0
    again = np.concatenate([stream.push(tone(24000, 0.5)), stream.flush()])
    assert len(again) == 8000  # a fresh stream: no leftovers from the first one


def test_equal_rates_pass_through_and_bad_input_is_refused():
    same = StreamResampler(24000, 24000)
    x = tone(24000, 0.1)
    assert same.push(x) is x and len(same.flush()) == 0 and same.pending_ms == 0.0
    stream = StreamResampler(24000, 16000)
    with pytest.raises(TypeError, match="int16"):
        stream.push(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="mono"):
        stream.push(np.zeros((10, 2), np.int16))
    with pytest.raises(ValueError, match="positive"):
        StreamResampler(0, 16000)
    assert len(stream.push(np.zeros(0, np.int16))) == 0
