"""A room between the talker and the microphone: reverberation by the image-source method (pyroomacoustics), the
talker and the noises each at their own place, mixed at a chosen signal-to-noise ratio at the microphone.

Benchmarks and tests hear speech as a device on a shelf would: ``Room.hear`` takes the dry sources (16 kHz int16
or float) and returns what the microphone gets. Impulse responses are computed once per room and position (the
image-source method is the slow part) and applied by FFT convolution.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.signal import fftconvolve

from audio.frames import SPEECH_RATE

Point = tuple[float, float, float]


@dataclass(frozen=True)
class Room:
    """A shoebox room: its size (metres), reverberation time (RT60, seconds) and where the device's microphone
    stands. Sources are placed by distance and bearing from the microphone, at head height."""

    name: str
    size_m: Point
    rt60_s: float
    microphone: Point

    def place(self, distance_m: float, bearing_deg: float = 0.0, height_m: float = 1.6) -> Point:
        """The point ``distance_m`` from the microphone (horizontally) at ``bearing_deg``, kept inside the walls."""
        x = self.microphone[0] + distance_m * math.cos(math.radians(bearing_deg))
        y = self.microphone[1] + distance_m * math.sin(math.radians(bearing_deg))
        inside = (min(max(x, 0.3), self.size_m[0] - 0.3), min(max(y, 0.3), self.size_m[1] - 0.3))
        if math.dist(inside, self.microphone[:2]) < distance_m - 0.05:
            raise ValueError(f"{self.name}: no point {distance_m} m away at {bearing_deg} degrees inside the walls")
        return (*inside, height_m)

    def impulse_response(self, source: Point) -> np.ndarray:
        """The room's impulse response from ``source`` to the microphone (float32, 16 kHz), its direct path at
        unit gain: a source keeps its level at the microphone and only the room is added."""
        return _impulse_response(self, source)

    def hear(self, dry: np.ndarray, source: Point) -> np.ndarray:
        """``dry`` (16 kHz mono) played at ``source``, as the microphone hears it (float32, same length)."""
        wet = fftconvolve(np.asarray(dry, np.float32), self.impulse_response(source))
        return wet[: len(dry)].astype(np.float32)


@functools.cache
def _impulse_response(room: Room, source: Point) -> np.ndarray:
    try:
        import pyroomacoustics as pra
    except ImportError as exc:
        raise RuntimeError("rooms need pyroomacoustics; fix: pip install 'specvoice[test]'") from exc

    absorption, max_order = pra.inverse_sabine(room.rt60_s, list(room.size_m))
    shoebox = pra.ShoeBox(list(room.size_m), fs=SPEECH_RATE, materials=pra.Material(absorption), max_order=max_order)
    shoebox.add_source(list(source))
    shoebox.add_microphone(list(room.microphone))
    shoebox.compute_rir()
    rir = np.asarray(shoebox.rir[0][0], np.float32)
    return rir / np.max(np.abs(rir))  # the strongest tap is the direct path


# A living room and a kitchen of ordinary sizes; their reverberation times are typical of furnished rooms (soft
# furniture damps a living room; a kitchen's hard surfaces ring longer). The device stands on a shelf near a wall.
ROOMS = {
    room.name: room
    for room in (
        Room("living-room", (5.5, 4.5, 2.6), 0.5, (0.4, 2.2, 1.0)),
        Room("kitchen", (4.0, 3.5, 2.5), 0.7, (0.4, 1.7, 1.1)),
    )
}


def power(samples: np.ndarray) -> float:
    return float(np.mean(np.square(np.asarray(samples, np.float64))))


def mix(speech: np.ndarray, noise: np.ndarray, snr_db: float, speech_power: float | None = None) -> np.ndarray:
    """``speech`` with ``noise`` scaled so that the speech is ``snr_db`` above it (float32; both at the
    microphone, the same length). ``speech_power``: the speech's power where it is spoken (default: over all of
    ``speech``, which counts its silences and so overstates the noise)."""
    if len(noise) != len(speech):
        raise ValueError(f"noise of {len(noise)} samples for speech of {len(speech)}")
    signal = power(speech) if speech_power is None else speech_power
    scale = math.sqrt(signal / 10 ** (snr_db / 10) / max(power(noise), 1e-12))
    return (np.asarray(speech, np.float32) + scale * np.asarray(noise, np.float32)).astype(np.float32)


def to_int16(samples: np.ndarray, peak: float = 0.9) -> np.ndarray:
    """Float samples (int16 scale) as int16, scaled down only when they would clip: a loud noise never wraps."""
    top = float(np.max(np.abs(samples))) if len(samples) else 0.0
    if top > peak * 32767:
        samples = samples * (peak * 32767 / top)
    return np.round(samples).astype(np.int16)
