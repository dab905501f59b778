"""The playback gate: is there energy in this mic block that our own playback cannot explain?

A cheap yes/no per block, used alone (``audio.echo`` mode ``gate``: half duplex, the mic is muted while only our
voice is heard) or as a second opinion after the echo canceller (audio/echo.py).
"""

from __future__ import annotations

import math

import numpy as np

from audio.frames import SPEECH_RATE

_TINY = 1e-12
FAST_LEARNING_BLOCKS = 50  # a fresh gate learns the echo gain fast for this many blocks (1 s of 20 ms)
_SILENT_POWER = 1e-8  # mean square of a float signal in [-1, 1): about -80 dBFS; below it a signal is "silent"


def check_block(name: str, samples: np.ndarray, length: int | None) -> np.ndarray:
    """Validate one int16 mono block; the message says what is wrong and how to fix it."""
    if not isinstance(samples, np.ndarray):
        raise TypeError(
            f"{name} must be a numpy int16 array (got {type(samples).__name__}); "
            f"fix: np.asarray(...).astype(np.int16) or audio.frames.to_int16"
        )
    if samples.dtype != np.int16:
        raise TypeError(
            f"{name} must be int16 mono samples (got dtype {samples.dtype}); fix: convert with audio.frames.to_int16"
        )
    if samples.ndim != 1:
        raise ValueError(f"{name} must be a 1-D mono block (got shape {samples.shape}); fix: downmix to mono first")
    if length is not None and len(samples) != length:
        raise ValueError(
            f"{name} has {len(samples)} samples but this works on blocks of {length}; "
            f"fix: pass exactly {length} samples per call, or use EchoSuppressor, which takes any length"
        )
    return samples


class PlaybackGate:
    """Is there energy in this block that the playback cannot explain? A yes/no per block.

    It compares, in a few frequency bands, the signal the VAD will hear (``cleaned``: the raw mic in gate
    mode, the canceller's output in cancel mode) with an envelope of the reference: the largest band energy
    the reference had over the last ``window_ms`` (the echo can arrive at any delay up to that), times a
    learned per-band echo gain. The gain is a high quantile of the observed ratio, learned only while the
    gate believes nobody else speaks, starting from the worst case (0 dB: the echo as loud as what we play).
    After a canceller the learned gain is tiny, so user speech stands out by tens of dB; on the raw mic it is
    the room's echo return loss, so the user must be clearly louder than the echo in some bands.

    ``update`` returns True when user speech is likely: more than ``share`` of the block's energy sits in
    bands at least ``margin_db`` above what the playback explains, or in bands the playback left silent (in
    both cases 10 dB above the noise floor), in two of the last three blocks; it then holds for ``hold_ms``. With
    nothing played in the window it returns True: there is nothing to explain, the VAD alone decides.
    ``mic_block`` is validated but the decision is about ``cleaned_block`` (pass the mic itself there when there
    is no canceller).
    """

    def __init__(
        self,
        sample_rate: int = SPEECH_RATE,
        block: int = 320,
        window_ms: int = 200,
        *,
        bands: int = 16,
        margin_db: float = 6.0,
        share: float = 0.5,
        hold_ms: int = 300,
        quantile: float = 0.9,
    ) -> None:
        if sample_rate <= 0 or block <= 0 or window_ms <= 0 or bands < 1:
            raise ValueError(
                f"sample_rate, block, window_ms and bands must be positive (got {sample_rate}, "
                f"{block}, {window_ms}, {bands}); fix: e.g. PlaybackGate({SPEECH_RATE}, 320, 200)"
            )
        self.block = block
        n = 2 * block
        freqs = np.fft.rfftfreq(n, 1 / sample_rate)
        edges = np.geomspace(100.0, min(7000.0, sample_rate / 2 - 1), bands + 1)
        band_of = np.digitize(freqs, edges) - 1  # -1 or bands: outside the speech range, ignored
        self._inside = (band_of >= 0) & (band_of < bands)
        self._band_of = band_of[self._inside]
        self._bands = bands
        self._window = np.hanning(n)
        frames = max(1, math.ceil(window_ms * sample_rate / 1000 / block)) + 1
        self._ref_hist = np.zeros((frames, bands))
        self._hist_i = 0
        self._gain = np.zeros(bands)  # log10 of the learned echo gain per band; 0 = worst case
        self._learned = 0  # blocks learned from since the start (or since forget())
        self._noise = NoiseFloor(bands)
        self._prev_heard = np.zeros(block)
        self._prev_ref = np.zeros(block)
        self._margin = margin_db / 10
        self._share = share
        self._quantile = quantile
        self._hold_blocks = max(1, round(hold_ms * sample_rate / 1000 / block))
        self._recent = [False, False, False]
        self._held = 0
        self.likely = True
        self.playing = False  # something was played within the window: ``likely`` is a verdict, not a default
        self.explained_share = 0.0  # diagnostics: share of the last block's energy the playback explains

    def forget(self) -> None:
        """The echo path changed: back to the worst-case echo gain, and no held verdict."""
        self._gain[:] = 0.0
        self._learned = 0
        self._recent = [False, False, False]
        self._held = 0

    def _band_energy(self, prev: np.ndarray, cur: np.ndarray) -> np.ndarray:
        spec = np.abs(np.fft.rfft(self._window * np.concatenate((prev, cur)))) ** 2
        return np.bincount(self._band_of, weights=spec[self._inside], minlength=self._bands)

    def update(self, mic_block: np.ndarray, reference_block: np.ndarray, cleaned_block: np.ndarray) -> bool:
        check_block("mic_block", mic_block, self.block)
        check_block("reference_block", reference_block, self.block)
        check_block("cleaned_block", cleaned_block, self.block)
        cur = cleaned_block.astype(np.float64) / 32768.0
        ref = reference_block.astype(np.float64) / 32768.0
        heard = self._band_energy(self._prev_heard, cur)
        played = self._band_energy(self._prev_ref, ref)
        self._prev_heard, self._prev_ref = cur, ref
        self._hist_i = (self._hist_i + 1) % len(self._ref_hist)  # a ring: only its maximum is used
        self._ref_hist[self._hist_i] = played
        envelope = self._ref_hist.max(axis=0)
        noise = self._noise.update(heard)

        active = envelope > _SILENT_POWER * len(self._window)
        self.playing = bool(active.any())
        if not self.playing:  # nothing played lately: nothing to explain; when playback resumes, start afresh
            self._recent = [False, False, False]
            self._held = 0
            self.explained_share = 0.0
            self.likely = True
            return True
        log_heard = np.log10(heard + _TINY)
        log_env = np.log10(envelope + _TINY)
        excess = log_heard - (log_env + self._gain)
        unexplained = (heard > 10 * noise) & (~active | (excess > self._margin))
        total = heard.sum() + _TINY
        share = float(heard[unexplained].sum() / total)
        self.explained_share = 1.0 - share
        self._recent = self._recent[1:] + [share > self._share]
        if sum(self._recent) >= 2:
            self._held = self._hold_blocks
        elif self._held:
            self._held -= 1
        self.likely = self._held > 0
        if not self.likely:  # learn the echo gain only while the playback explains what we hear
            # log10 units: up 2.7 dB, down 0.3 dB per block, settling on the 90 % quantile; twice that for the
            # first second, so a fresh gate (the worst case, 0 dB) hears a user early in a reply (at the slow rate
            # it missed short "stop"s a second in). Faster (three times) let an echo 2 dB below the playback through.
            step = 0.3 if self._learned >= FAST_LEARNING_BLOCKS else 0.6
            self._learned += 1
            above = (log_heard - log_env) > self._gain
            moved = self._gain + np.where(above, step * self._quantile, -step * (1 - self._quantile))
            self._gain = np.where(active, np.clip(moved, -8.0, 1.0), self._gain)
        return self.likely


class NoiseFloor:
    """Background-noise power per bin or band: the minimum of the smoothed power over the last ``frames`` blocks
    (minimum statistics). Speech and echo come and go within that window; the noise stays."""

    def __init__(self, size: int, frames: int = 75) -> None:
        self._hist = np.full((frames, size), np.inf)
        self._smooth: np.ndarray | None = None
        self._i = 0

    def update(self, power: np.ndarray) -> np.ndarray:
        self._smooth = power.copy() if self._smooth is None else 0.7 * self._smooth + 0.3 * power
        self._hist[self._i] = self._smooth
        self._i = (self._i + 1) % len(self._hist)
        return self._hist.min(axis=0)
