"""The WAV source paced like a microphone, and the buffered sink paced like a speaker (flush, drain, the
reference ring), without devices. tests/test_devices.py runs the same sinks and sources on real devices."""

import asyncio
import time

import numpy as np
import pytest

from audio.sinks import AudioSink, WavSink
from audio.sources import WavSource
from audio.wavfile import read_wav, write_wav


def _ramp(n):
    return (np.arange(n) % 20000 + 100).astype(np.int16)  # never zero, so padding is recognisable


@pytest.fixture
def wav16(tmp_path):
    path = tmp_path / "in.wav"
    write_wav(path, _ramp(16000 // 2), 16000)
    return path


async def test_wav_source_blocks_cover_the_file_with_contiguous_times(wav16):
    source = WavSource(wav16, block_ms=20, realtime=False, tail_silence_ms=100)
    chunks = [c async for c in source]
    assert all(len(c.samples) == 320 and c.sample_rate == 16000 for c in chunks)
    audio = np.concatenate([c.samples for c in chunks])
    np.testing.assert_array_equal(audio[:8000], _ramp(8000))
    assert len(audio) == 8000 + 1600 and not audio[8000:].any()
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert b.t == pytest.approx(a.end_t)
    assert chunks[0].t == pytest.approx(source.start_t)


async def test_wav_source_in_real_time_delivers_no_block_before_its_last_sample(wav16):
    early = []
    async for chunk in WavSource(wav16, block_ms=40, realtime=True):
        early.append(chunk.end_t - time.monotonic())
    assert len(early) == 13 and max(early) <= 0.002


async def test_wav_source_converts_other_rates(tmp_path):
    write_wav(tmp_path / "s.wav", _ramp(22050), 22050)
    chunks = [c async for c in WavSource(tmp_path / "s.wav", realtime=False)]
    assert sum(len(c.samples) for c in chunks) == 16000 and chunks[0].sample_rate == 16000


async def test_sink_plays_everything_written_in_order_then_drains(tmp_path):
    sink = WavSink(tmp_path / "out.wav", 16000, block_ms=20)
    assert isinstance(sink, AudioSink)
    sink.begin_utterance()
    before = time.monotonic()
    for piece in np.array_split(_ramp(8000), 7):
        await sink.write(piece)
    await sink.drain()
    assert sink.played_samples == 8000
    assert before <= sink.first_audible_t <= before + 0.1
    assert time.monotonic() >= sink.first_audible_t + 0.5 - 0.02  # drain waited for the last sample to play
    sink.close()
    played, _ = read_wav(tmp_path / "out.wav", 16000)
    np.testing.assert_array_equal(played, _ramp(8000))


async def test_write_waits_while_the_buffer_is_full():
    sink = WavSink(None, 16000, block_ms=20, max_buffer_s=0.2)
    for _ in range(10):
        await sink.write(_ramp(1600))
        assert sink.queued_samples <= 0.2 * 16000 + 1600
    sink.flush()
    sink.close()


async def test_flush_stops_playback_within_one_block():
    sink = WavSink(None, 16000, block_ms=20)
    sink.begin_utterance()
    await sink.write(_ramp(16000 * 2))
    await asyncio.sleep(0.3)
    sink.flush()
    at_flush = sink.played_samples
    await asyncio.sleep(0.2)
    assert 0 < at_flush < 16000
    assert sink.played_samples - at_flush <= sink.block  # at most the block already in the device
    assert sink.first_audible_t is None  # the next utterance gets its own first-audible time
    np.testing.assert_array_equal(sink.audio, _ramp(16000 * 2)[: sink.played_samples])
    sink.close()


async def test_played_reference_returns_exactly_what_was_played():
    sink = WavSink(None, 16000, block_ms=20)
    sink.begin_utterance()
    tone = _ramp(4000)
    await sink.write(tone)
    await sink.drain()
    t0 = sink.first_audible_t
    np.testing.assert_array_equal(sink.played_reference(t0, t0 + 4000 / 16000), tone)
    before = sink.played_reference(t0 - 0.1, t0)
    assert len(before) == 1600 and not before.any()  # nothing was played before the first sample
    sink.close()


async def test_not_realtime_sink_counts_writes_as_played(tmp_path):
    sink = WavSink(tmp_path / "o.wav", 22050, realtime=False)
    await sink.write(_ramp(500))
    await sink.write(_ramp(300))
    await sink.drain()
    assert sink.played_samples == 800 and sink.first_audible_t is not None
    sink.close()
    assert len(read_wav(tmp_path / "o.wav", 22050)[0]) == 800


async def test_sink_rejects_float_audio():
    sink = WavSink(None, 16000)
    with pytest.raises(ValueError, match="int16"):
        await sink.write(np.zeros(10, np.float32))
