"""WAV files in and out.

Two ways in: the strict path (the default) accepts exactly 16-bit mono PCM at the expected rate, because the
protocols promise that format and a silent conversion would hide a client bug; ``convert=True`` downmixes,
widens and resamples anything PCM, for files a person hands us. Every rejection names the problem and the fix.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from audio.frames import SPEECH_RATE
from audio.resample import resample

_SOX_HINT = "convert it, e.g. `sox in.wav -r {rate} -c 1 -b 16 out.wav`"


class WavFormatError(ValueError):
    """A WAV file we cannot use as it is; the message says why and how to fix it."""


def read_wav(path: str | Path, rate: int | None = None, *, convert: bool = False) -> tuple[np.ndarray, int]:
    """Read a PCM WAV file as (int16 mono samples, sample rate).

    ``rate``: the rate the caller needs (None: any). Strict mode rejects other rates, stereo, and 8/24/32-bit
    files; ``convert=True`` downmixes to mono, converts to 16-bit and resamples to ``rate`` instead.
    """
    path = Path(path)
    if not path.exists():
        raise WavFormatError(f"{path}: no such file; fix: check the path")
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, src_rate, n = wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()
            raw = wav.readframes(n)
    except (wave.Error, EOFError) as exc:
        size = path.stat().st_size
        what = "is empty (0 bytes)" if size == 0 else f"is not a readable PCM WAV file ({exc})"
        raise WavFormatError(f"{path}: {what}; fix: pass a 16-bit PCM WAV file") from None
    hint = _SOX_HINT.format(rate=rate or src_rate)
    frame_bytes = channels * width
    if n == 0 or len(raw) == 0:
        raise WavFormatError(f"{path}: has no audio samples; fix: record or generate some audio first")
    if len(raw) < n * frame_bytes:
        raise WavFormatError(
            f"{path}: is truncated: the header promises {n} frames but only {len(raw) // frame_bytes} are present; "
            f"fix: re-record or re-export the file"
        )
    if not convert:
        if width != 2:
            raise WavFormatError(f"{path}: is {8 * width}-bit; 16-bit PCM is required; fix: {hint}")
        if channels != 1:
            raise WavFormatError(f"{path}: has {channels} channels; mono is required; fix: {hint}")
        if rate is not None and src_rate != rate:
            raise WavFormatError(f"{path}: is {src_rate} Hz; {rate} Hz is required; fix: {hint}")
        return np.frombuffer(raw, dtype="<i2").copy(), src_rate
    samples = _decode(raw, width, path).reshape(-1, channels).mean(axis=1)
    out = np.clip(np.round(samples * 32768.0), -32768, 32767).astype(np.int16)
    if rate is not None and rate != src_rate:
        out = resample(out, src_rate, rate)
        src_rate = rate
    return out, src_rate


def _decode(raw: bytes, width: int, path: Path) -> np.ndarray:
    """PCM bytes of any common width to float64 in [-1, 1)."""
    if width == 1:  # 8-bit WAV is unsigned
        return (np.frombuffer(raw, dtype=np.uint8).astype(np.float64) - 128.0) / 128.0
    if width == 2:
        return np.frombuffer(raw, dtype="<i2") / 32768.0
    if width == 3:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        return np.where(v >= 1 << 23, v - (1 << 24), v) / float(1 << 23)
    if width == 4:
        return np.frombuffer(raw, dtype="<i4") / float(1 << 31)
    raise WavFormatError(
        f"{path}: {8 * width}-bit samples are not supported; fix: {_SOX_HINT.format(rate=SPEECH_RATE)}"
    )


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    """Write int16 mono samples as a 16-bit PCM WAV file."""
    samples = np.asarray(samples)
    if samples.dtype != np.int16:
        raise ValueError(f"write_wav needs int16 samples (got {samples.dtype}); fix: use audio.frames.to_int16")
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.astype("<i2").tobytes())
