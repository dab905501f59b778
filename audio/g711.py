"""G.711 u-law and A-law (ITU-T G.711), int16 <-> one byte per sample, in numpy.

Why: the Realtime API's other two audio formats, ``audio/pcmu`` and ``audio/pcma``, are G.711 at 8 kHz (what
telephone gateways send). Python's ``audioop`` did this but is gone in 3.13, so it is written out here; the
tests check every one of the 65536 inputs and 256 codes against ``audioop`` while it still exists.

Encoding follows the classic reference: u-law works on the top 14 bits of the sample, A-law on the top 13,
and both store the result bit-inverted as the standard prescribes (u-law all bits, A-law the even ones).
"""

from __future__ import annotations

import numpy as np

RATE = 8000  # G.711's sample rate
_ULAW_BIAS = 0x84  # added to the magnitude so that every segment starts on a power of two
_ULAW_CLIP = 8159  # largest magnitude u-law represents (in 14-bit units)


def ulaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples -> u-law bytes."""
    x = _as_int16(samples).astype(np.int32) >> 2  # 14-bit
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), _ULAW_CLIP) + (_ULAW_BIAS >> 2)  # 33 .. 8192
    seg = _segment(mag, first_end=0x3F)  # 0..8
    code = np.where(seg > 7, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0x0F))  # 8: past the top, clipped
    return (code ^ mask).astype(np.uint8).tobytes()


def alaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples -> A-law bytes."""
    x = _as_int16(samples).astype(np.int32) >> 3  # 13-bit
    negative = x < 0
    mask = np.where(negative, 0x55, 0xD5)
    mag = np.where(negative, -x - 1, x)  # 0 .. 4095
    seg = np.minimum(_segment(mag, first_end=0x1F), 7)  # 4095 is the top of segment 7
    mantissa = np.where(seg < 2, mag >> 1, mag >> np.maximum(seg, 1)) & 0x0F
    return (((seg << 4) | mantissa) ^ mask).astype(np.uint8).tobytes()


def ulaw_decode(data: bytes | bytearray | memoryview) -> np.ndarray:
    """u-law bytes -> int16 samples."""
    return _ULAW_TABLE[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode(data: bytes | bytearray | memoryview) -> np.ndarray:
    """A-law bytes -> int16 samples."""
    return _ALAW_TABLE[np.frombuffer(data, dtype=np.uint8)]


def _as_int16(samples: np.ndarray) -> np.ndarray:
    if samples.dtype != np.int16:
        raise TypeError(f"G.711 encodes int16 samples (got {samples.dtype})")
    return samples.reshape(-1)


def _segment(mag: np.ndarray, first_end: int) -> np.ndarray:
    """Each magnitude's segment (exponent): segment k ends at ``(first_end + 1) << k`` minus one; 8 is past the top."""
    ends = (first_end + 1) << np.arange(8)
    return np.searchsorted(ends, mag, side="right").astype(np.int32)


def _ulaw_table() -> np.ndarray:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((code & 0x0F) << 3) + _ULAW_BIAS) << ((code & 0x70) >> 4)
    return np.where(code & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


def _alaw_table() -> np.ndarray:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (code & 0x70) >> 4
    mantissa = (code & 0x0F) << 4
    t = np.where(seg == 0, mantissa + 8, (mantissa + 0x108) << np.maximum(seg - 1, 0))
    return np.where(code & 0x80, t, -t).astype(np.int16)


_ULAW_TABLE = _ulaw_table()
_ALAW_TABLE = _alaw_table()
