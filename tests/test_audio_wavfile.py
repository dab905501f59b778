"""WAV in and out: round trips, the conversion path, and a clear error for each kind of bad file."""

import wave

import numpy as np
import pytest

from audio.resample import resample
from audio.wavfile import WavFormatError, read_wav, write_wav


def _write_raw(path, data: bytes, *, channels=1, width=2, rate=16000):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data)


def _tone(freq=440.0, rate=16000, seconds=0.5, amp=0.5):
    t = np.arange(int(rate * seconds)) / rate
    return (amp * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def test_round_trip_is_exact(tmp_path):
    samples = _tone()
    write_wav(tmp_path / "a.wav", samples, 16000)
    back, rate = read_wav(tmp_path / "a.wav", 16000)
    assert rate == 16000 and back.dtype == np.int16
    np.testing.assert_array_equal(back, samples)


def test_wrong_rate_is_rejected_with_the_fix(tmp_path):
    write_wav(tmp_path / "a.wav", _tone(rate=22050), 22050)
    with pytest.raises(WavFormatError, match=r"22050 Hz; 16000 Hz is required; fix: .*sox .* -r 16000"):
        read_wav(tmp_path / "a.wav", 16000)


def test_stereo_is_rejected_and_converted_on_request(tmp_path):
    left, right = _tone(), np.zeros(8000, np.int16)
    _write_raw(tmp_path / "s.wav", np.stack([left, right], axis=1).tobytes(), channels=2)
    with pytest.raises(WavFormatError, match="2 channels; mono is required; fix: "):
        read_wav(tmp_path / "s.wav", 16000)
    mono, rate = read_wav(tmp_path / "s.wav", 16000, convert=True)
    assert rate == 16000 and len(mono) == 8000
    assert np.max(np.abs(mono.astype(int) - left.astype(int) // 2)) <= 1  # downmix = mean of the channels


def test_8bit_is_rejected_and_converted_on_request(tmp_path):
    tone = _tone()
    _write_raw(tmp_path / "b.wav", ((tone.astype(np.int32) >> 8) + 128).astype(np.uint8).tobytes(), width=1)
    with pytest.raises(WavFormatError, match="8-bit; 16-bit PCM is required"):
        read_wav(tmp_path / "b.wav", 16000)
    widened, _ = read_wav(tmp_path / "b.wav", 16000, convert=True)
    assert np.max(np.abs(widened.astype(int) - tone.astype(int))) <= 256  # 8-bit quantisation step


def test_convert_resamples_and_keeps_the_pitch(tmp_path):
    write_wav(tmp_path / "t.wav", _tone(1000, rate=44100, seconds=1.0), 44100)
    samples, rate = read_wav(tmp_path / "t.wav", 16000, convert=True)
    assert rate == 16000 and abs(len(samples) - 16000) <= 1
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * 16000 / len(samples) - 1000) < 2


def test_empty_file_and_file_without_samples(tmp_path):
    (tmp_path / "zero.wav").write_bytes(b"")
    with pytest.raises(WavFormatError, match=r"is empty \(0 bytes\); fix: "):
        read_wav(tmp_path / "zero.wav", 16000)
    _write_raw(tmp_path / "none.wav", b"")
    with pytest.raises(WavFormatError, match="has no audio samples; fix: "):
        read_wav(tmp_path / "none.wav", 16000)


def test_truncated_file(tmp_path):
    write_wav(tmp_path / "full.wav", _tone(seconds=1.0), 16000)
    data = (tmp_path / "full.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: len(data) // 2])
    with pytest.raises(WavFormatError, match=r"truncated: the header promises 16000 frames but only \d+ are present"):
        read_wav(tmp_path / "cut.wav", 16000)
    (tmp_path / "header.wav").write_bytes(data[:20])
    with pytest.raises(WavFormatError, match="not a readable PCM WAV file"):
        read_wav(tmp_path / "header.wav", 16000)


def test_not_a_wav_and_missing_file(tmp_path):
    (tmp_path / "x.wav").write_text("hello, I am text")
    with pytest.raises(WavFormatError, match="not a readable PCM WAV file"):
        read_wav(tmp_path / "x.wav")
    with pytest.raises(WavFormatError, match="no such file"):
        read_wav(tmp_path / "missing.wav")


def test_write_rejects_float_samples(tmp_path):
    with pytest.raises(ValueError, match="int16"):
        write_wav(tmp_path / "f.wav", np.zeros(10, np.float32), 16000)


def test_resample_int16_round_trip_keeps_the_signal():
    tone = _tone(300, rate=16000, seconds=1.0)
    back = resample(resample(tone, 16000, 22050), 22050, 16000)
    assert back.dtype == np.int16 and abs(len(back) - len(tone)) <= 1
    n = min(len(back), len(tone))
    err = back[200 : n - 200].astype(float) - tone[200 : n - 200].astype(float)
    assert np.sqrt(np.mean(err**2)) < 0.01 * 32767
