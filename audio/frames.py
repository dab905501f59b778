"""The unit of audio that flows through the ears: a block of mono int16 samples with its capture time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The rate of the ears: VAD, wake word, echo canceller and Whisper all take 16 kHz mono int16. One constant,
# so every converter and buffer agrees on it.
SPEECH_RATE = 16000


@dataclass
class AudioChunk:
    """``samples``: int16 mono; ``t``: time.monotonic() of the first sample (for a device: its ADC time)."""

    samples: np.ndarray
    sample_rate: int
    t: float

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate

    @property
    def end_t(self) -> float:
        """Monotonic time just after the last sample."""
        return self.t + self.duration


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float audio in [-1, 1] (or int16 already) to int16, clipping instead of wrapping around."""
    if samples.dtype == np.int16:
        return samples
    if np.issubdtype(samples.dtype, np.floating):
        return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
    return np.clip(samples, -32768, 32767).astype(np.int16)


def to_float32(samples: np.ndarray) -> np.ndarray:
    """int16 to float32 in [-1, 1): the form the models take."""
    if samples.dtype == np.float32:
        return samples
    return samples.astype(np.float32) / 32768.0
