"""Sample-rate conversion with soxr (high quality, fast, no torch): 16 kHz for the ears, the voice's rate for
the mouth."""

from __future__ import annotations

import numpy as np
import soxr


def resample(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Resample mono audio; int16 in gives int16 out, float in gives float32 out."""
    if src_rate <= 0 or dst_rate <= 0:
        raise ValueError(f"sample rates must be positive (got {src_rate} -> {dst_rate})")
    if src_rate == dst_rate or len(samples) == 0:
        return samples
    if samples.dtype == np.int16:
        out = soxr.resample(samples.astype(np.float32) / 32768.0, src_rate, dst_rate)
        return (np.clip(out, -1.0, 1.0 - 1 / 32768.0) * 32768.0).astype(np.int16)
    return soxr.resample(samples.astype(np.float32), src_rate, dst_rate).astype(np.float32)
