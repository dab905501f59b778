"""Echo suppression: the assistant must not hear its own voice as a barge-in.

The speaker plays our TTS; the microphone hears it back, delayed, quieter and coloured by the room. We know
exactly what was played and when, so two things are possible:

* ``EchoCanceller``: learn the echo path (speaker -> room -> mic) as a linear filter, subtract the predicted
  echo, then suppress what the linear filter could not explain. This keeps the user audible while we speak
  (full duplex), which is what makes barge-in work.
* ``PlaybackGate``: a cheap yes/no per block, "is this mic energy explained by the playback?", used alone
  (mode ``gate``: half duplex, the mic is muted while only our voice is heard) or as a second opinion after
  the canceller.

``EchoSuppressor`` is what the pipeline calls: any block length, ``reference=None`` when nothing plays.

How the canceller works (learned from the published descriptions of Speex MDF and WebRTC AEC3; written from
scratch):

1. Partitioned-block frequency-domain NLMS (PBFDAF): the filter is cut into ``P`` partitions of one block
   each, so a 200 ms filter costs ``P`` complex multiplies per bin instead of a 3200-tap convolution. Overlap-
   save with an FFT of two blocks; the gradient is constrained (its second half zeroed) so the filter stays a
   linear, not circular, convolution.
2. Two filters (Speex's trick) instead of a fragile double-talk detector: a *background* filter adapts on
   every block where we play, with a plain NLMS step; a *foreground* filter, which makes the output, is
   copied from the background only when the background cancels clearly better (1.5 dB, over ~4 blocks).
   User speech over our voice (double talk) misleads the background, but then it cancels worse and is not
   copied (and is reset from the foreground when 6 dB worse); when the room changes, the background
   re-converges, cancels better, and is copied.
3. Residual suppressor: a per-bin Wiener-like gain on a short-time spectrum (sqrt-Hann, 50 % overlap). The
   residual echo per bin is ``leak * |echo estimate|^2``; ``leak`` (Speex's word) is the running ratio of
   error to echo-estimate power, learned at full rate only while the error looks like residual echo, so
   double talk barely moves it and the user passes. Residual-echo peaks are held briefly and spread to
   neighbouring bins (they fluctuate far more than their average), and suppressed energy is replaced by
   comfort noise at the room's own noise level: silero VAD hears speech-shaped remnants down to -70 dBFS
   in silence, but not under noise. Until the filter has reached 10 dB ERLE once, the suppressor assumes
   the worst (the echo as loud as the reference, at any delay within the filter's reach), so a fresh
   canceller does not leak our voice either. The overlap-add costs one block of delay (``delay_samples``).
4. Echo-path changes (the speaker moved, the device latency changed): the foreground then makes the mic
   *louder* by about its own echo estimate, which double talk cannot do. Two such blocks in a row reset the
   foreground to zero and the suppressor to its worst-case assumption until the background re-converges.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from audio.frames import SPEECH_RATE
from audio.playback_gate import NoiseFloor, PlaybackGate, check_block

Mode = Literal["off", "gate", "cancel"]
# The VAD's threshold while the gate hears the user over our playback (double talk): the suppressor takes part of
# their voice away with our echo, most where they sound like our voice, and silero's score on what is left stays
# near 0.2-0.4 even for a whole sentence. Our echo alone, which the gate explains, never gets the lower threshold.
DOUBLE_TALK_THRESHOLD = 0.2

_TINY = 1e-12
_SILENT_POWER = 1e-8  # mean square of a float signal in [-1, 1): about -80 dBFS; below it a signal is "silent"


class EchoCanceller:
    """Adaptive echo canceller: frequency-domain NLMS from the playback reference to the microphone, with
    double-talk-safe adaptation (foreground/background filters) and a residual-echo suppressor.

    ``process(mic, reference)`` takes int16 blocks of exactly ``block`` samples; ``reference`` is what was
    played during the same interval, resampled to ``sample_rate``. The echo must arrive no earlier than the
    reference and at most ``filter_ms`` later (device latency included). Returns the cleaned block, delayed
    by ``delay_samples`` (one block, from the suppressor's overlap-add; none with ``suppress=False``, which
    returns the linear filter's error, for measurements). ``linear`` is the same block before the residual
    suppressor: what Whisper should hear. The suppressor's per-bin gains, right for a VAD, turn a user's "mhm"
    heard over our voice into words ("The beach.", "That is him."); the linear output, with our echo some
    10-30 dB down, does not. It is given from the start, before the filter has converged (about 1.5 s of
    speech): a fresh suppressor assumes the echo as loud as the reference and takes the most out of the user
    then, while Whisper hears a user over our half-cancelled echo well (``specvoice bench backchannel``, the
    clip 1 s into the reply: 95.6% of backchannels right against 86.7%, echo gain 0.6).

    Diagnostics: ``erle_db``, ``adapted`` (the filter has reached 10 dB once since the start or the last path
    change), ``copies`` (foreground updates), ``path_changes``. Not modelled: a loudspeaker's non-linear
    distortion (the suppressor has to absorb it) and echo arriving later than ``filter_ms``.
    """

    def __init__(
        self,
        sample_rate: int = SPEECH_RATE,
        block: int = 320,
        filter_ms: int = 200,
        *,
        step: float = 1.0,
        suppress: bool = True,
        suppress_floor_db: float = -60.0,
        over_suppress: float = 4.0,
    ) -> None:
        if sample_rate <= 0 or block <= 0 or filter_ms <= 0:
            raise ValueError(
                f"sample_rate, block and filter_ms must be positive (got {sample_rate}, {block}, "
                f"{filter_ms}); fix: e.g. EchoCanceller({SPEECH_RATE}, 320, 200)"
            )
        if not 0.0 < step <= 1.0:
            raise ValueError(f"step must be in (0, 1] (got {step}); fix: 1.0 (the default) converges fastest")
        self.sample_rate, self.block = sample_rate, block
        self.partitions = max(1, math.ceil(filter_ms * sample_rate / 1000 / block))
        self.step, self.suppress = step, suppress
        self.floor = 10 ** (suppress_floor_db / 20)
        self.over = over_suppress
        self.delay_samples = block if suppress else 0
        n, bins = 2 * block, block + 1
        self._window = np.sqrt(0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n))  # sqrt periodic Hann: COLA at 50 %
        self._xbuf = np.zeros((2 * self.partitions, bins), np.complex128)  # reference spectra, twice over
        self._pbuf = np.zeros((2 * self.partitions, bins))  # their powers
        self._head = 0
        self._w = np.zeros((2, self.partitions, bins), np.complex128)  # [0]: foreground, [1]: background
        self._ref_prev = np.zeros(block)
        self._delta = n * 1e-8  # regularises the NLMS normalisation for near-silent reference bins
        # smoothed error powers of both filters; the suppressor's leak, noise floor and comfort-noise phases
        self._err_fg = self._err_bg = 0.0
        self._leak_fg = _Leak(bins)
        self._noise = NoiseFloor(bins)
        self._rng = np.random.default_rng(0)
        self._mic_pow = self._res_pow = 0.0  # for erle_db, while the reference plays
        self.adapted = False  # reached 10 dB ERLE once: from then on the suppressor trusts the echo estimate
        self.copies = 0  # how many times the foreground was taken from the background (diagnostics)
        self.path_changes = 0  # how many times an echo-path change was detected (diagnostics)
        self._mic_fast = self._err_fast = self._est_fast = 0.0
        self._worse = 0
        self._mic_floor = NoiseFloor(1)
        # suppressor state: previous halves of the analysis frames, overlap-add tail, spectral smoothing
        self._prev = np.zeros((3, block))
        self._ref_hist = np.zeros((self.partitions + 1, bins))  # |windowed reference spectrum|^2, recent blocks
        self._hist_i = 0
        self._tail = np.zeros(block)
        self._s_err = np.zeros(bins)
        self._s_res = np.zeros(bins)
        self._hold = 0.8  # per-block decay of held residual-echo peaks (about 2 dB per block)
        self._lin_prev = np.zeros(block)
        self.linear = np.zeros(block, np.int16)  # for speech recognition: see ``process``

    @property
    def erle_db(self) -> float:
        """Echo return loss enhancement of the linear filter, dB: mic power / residual power, smoothed over about
        half a second of blocks where the reference plays. Double talk lowers it (the user is in both)."""
        return 10 * math.log10((self._mic_pow + _TINY) / (self._res_pow + _TINY))

    def process(self, mic: np.ndarray, reference: np.ndarray) -> np.ndarray:
        mic = check_block("mic", mic, self.block)
        reference = check_block("reference", reference, self.block)
        B = self.block
        d = mic.astype(np.float64) / 32768.0
        r = reference.astype(np.float64) / 32768.0

        # 1. overlap-save: the newest reference spectrum covers the previous and the current block. The history
        #    lives twice in a buffer of 2P rows, so the newest-first view is a slice, never a copy.
        P = self.partitions
        self._head = (self._head - 1) % P
        newest = np.fft.rfft(np.concatenate((self._ref_prev, r)))
        self._xbuf[self._head] = self._xbuf[self._head + P] = newest
        self._pbuf[self._head] = self._pbuf[self._head + P] = newest.real**2 + newest.imag**2
        X = self._xbuf[self._head : self._head + P]
        self._ref_prev = r
        y_fg, y_bg = np.fft.irfft((self._w * X).sum(axis=1), axis=1)[:, B:]  # both filters in one transform
        e_fg, e_bg = d - y_fg, d - y_bg

        # 2. foreground/background: keep whichever cancels better
        self._err_fg = 0.7 * self._err_fg + 0.3 * float(e_fg @ e_fg)
        self._err_bg = 0.7 * self._err_bg + 0.3 * float(e_bg @ e_bg)
        if self._err_bg < 0.7 * self._err_fg:
            self._w[0] = self._w[1]
            self._err_fg = self._err_bg
            e_fg, y_fg = e_bg, y_bg
            self.copies += 1
        elif self._err_bg > 4.0 * self._err_fg + _TINY:  # the background diverged (double talk): restart it
            self._w[1] = self._w[0]
            self._err_bg = self._err_fg

        mic_floor = float(self._mic_floor.update(np.array([float(d @ d)]))[0])  # the room's noise, per block
        # 3. adapt the background filter (NLMS, normalised per bin by the reference power over the whole filter)
        if float(r @ r) / B > _SILENT_POWER:
            E_bg = np.fft.rfft(np.concatenate((np.zeros(B), e_bg)))
            norm = self._pbuf[self._head : self._head + P].sum(axis=0) + self._delta
            grad = np.fft.irfft(np.conj(X) * (self.step * E_bg / norm), axis=1)
            grad[:, B:] = 0.0  # gradient constraint: keep the filter a linear convolution of B taps per partition
            self._w[1] += np.fft.rfft(grad, axis=1)
            self._mic_pow = 0.95 * self._mic_pow + 0.05 * float(d @ d)
            self._res_pow = 0.95 * self._res_pow + 0.05 * float(e_fg @ e_fg)
            # The room changed when the foreground makes the mic louder by about its own estimate: the estimate
            # no longer matches the echo and adds to it. (Double talk cannot do that: the user is in both mic and
            # error, and the estimate still removes most of the echo.)
            self._mic_fast = 0.5 * self._mic_fast + 0.5 * float(d @ d)
            self._err_fast = 0.5 * self._err_fast + 0.5 * float(e_fg @ e_fg)
            self._est_fast = 0.5 * self._est_fast + 0.5 * float(y_fg @ y_fg)
            loud = self._mic_fast > 30 * mic_floor
            wrong = (
                self._err_fast > self._mic_fast + 0.5 * self._est_fast  # mic + an uncorrelated estimate
                and self._est_fast > 0.1 * self._mic_fast
            )  # (a user far louder than the echo is not a sign)
            self._worse = self._worse + 1 if loud and wrong else 0
            if self._worse >= 2 and self.adapted:
                self._w[0] = 0.0  # output the plain mic rather than mic + a wrong echo estimate
                self._err_fg = self._mic_fast
                self.adapted = False  # the suppressor assumes the worst again until re-converged
                self._leak_fg = _Leak(len(self._s_res))
                self._mic_pow = self._res_pow = 0.0
                self.path_changes += 1
            if not self.adapted and self._mic_pow > 10 * self._res_pow and self._mic_pow > B * _SILENT_POWER:
                self.adapted = True

        if not self.suppress:
            self.linear = _to_int16(e_fg)
            return self.linear
        out = _to_int16(self._suppress(e_fg, y_fg, r))
        self.linear = _to_int16(self._lin_prev)  # the same (previous) block as ``out``
        self._lin_prev = e_fg
        return out

    def _suppress(self, e: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
        """Per-bin gain on the short-time spectrum of the linear output; returns the previous block."""
        w = self._window
        frames = np.concatenate((self._prev, np.stack((e, y, r))), axis=1)  # error, echo estimate, reference
        self._prev = frames[:, self.block :]
        E, Y, Xs = np.fft.rfft(w * frames, axis=1)
        err2, est2 = E.real**2 + E.imag**2, Y.real**2 + Y.imag**2
        self._hist_i = (self._hist_i + 1) % len(self._ref_hist)  # a ring: only its maximum is used
        self._ref_hist[self._hist_i] = Xs.real**2 + Xs.imag**2
        if self._ref_hist[self._hist_i].any():
            self._leak_fg.update(err2, est2)
        residual = self._leak_fg.value * est2
        if not self.adapted:  # no trustworthy echo estimate yet: assume the echo is as loud as the reference
            residual = np.maximum(residual, self._ref_hist.max(axis=0))
        # residual echo fluctuates per bin and per frame far more than its average: hold its peaks a little in
        # time (echo tails) and spread them over neighbouring bins, so remnants do not slip through
        residual = np.maximum(residual, np.maximum(np.roll(residual, 1), np.roll(residual, -1)))
        self._s_res = np.maximum(residual, self._s_res * self._hold)
        self._s_err = 0.5 * self._s_err + 0.5 * err2
        gain = np.clip(1.0 - self.over * self._s_res / (self._s_err + _TINY), self.floor, 1.0)
        # comfort noise: what is taken away is replaced by noise at the room's own level. Without it the output
        # is silence with speech-shaped remnants, and silero VAD hears speech down to -70 dBFS in silence.
        noise = self._noise.update(err2)
        fill = np.sqrt(np.maximum(0.0, 1.0 - gain**2) * noise)
        phase = np.exp(2j * np.pi * self._rng.random(len(fill)))
        frame = w * np.fft.irfft(gain * E + fill * phase)
        out = self._tail + frame[: self.block]
        self._tail = frame[self.block :]
        return out


class _Leak:
    """How much of the echo estimate is still left in the error, per bin (Speex calls it the leak): running
    error power over echo-estimate power. It learns at full rate only while the error looks like residual echo
    (about ``leak`` times the estimate); when the error is much larger (the user talks) it barely moves, so the
    suppressor keeps trusting the filter and lets the user through."""

    def __init__(self, bins: int) -> None:
        self.err = np.zeros(bins)
        self.est = np.zeros(bins)
        self.value = np.ones(bins)

    def update(self, err2: np.ndarray, est2: np.ndarray) -> None:
        err_total, est_total = float(err2.sum()), float(est2.sum())
        broad = float(self.err.sum() / self.est.sum()) if self.est.sum() > _TINY else 1.0
        rate = 0.05 * min(1.0, 2.0 * broad * est_total / (err_total + _TINY))
        self.err = (1 - rate) * self.err + rate * err2
        self.est = (1 - rate) * self.est + rate * est2
        if est_total > _TINY:
            self.value = np.clip(self.err / (self.est + _TINY), 1e-4, 1.0)


def _to_int16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)


class EchoSuppressor:
    """What the pipeline calls: mic blocks of any length in, the same number of samples out.

    ``mode``: ``cancel`` (the canceller, with the gate as a second opinion), ``gate`` (no cancelling: the
    mic is muted while the playback explains it; half duplex, cheaper), ``off`` (pass through).
    ``reference``: what the speaker played over the same interval, at ``sample_rate``; None means silence.
    After each call, ``linear`` holds the same samples as speech recognition should hear them (the canceller's
    linear output: ``EchoCanceller``). Audio is processed in blocks of ``block`` samples, so the output lags the
    input by ``delay_samples``
    (one block of buffering, plus one block of overlap-add in cancel mode): stamp the output
    ``delay_samples / sample_rate`` seconds earlier than the input it came with. Call it for every mic block,
    with or without playback, so the stream and the delay stay continuous.
    """

    def __init__(
        self, sample_rate: int = SPEECH_RATE, mode: Mode = "cancel", *, block: int = 320, filter_ms: int = 200
    ) -> None:
        if mode not in ("off", "gate", "cancel"):
            raise ValueError(f"unknown echo mode {mode!r}; fix: use 'off', 'gate' or 'cancel'")
        self.mode, self.sample_rate, self.block = mode, sample_rate, block
        self.canceller = EchoCanceller(sample_rate, block, filter_ms) if mode == "cancel" else None
        self.gate = PlaybackGate(sample_rate, block, filter_ms) if mode != "off" else None
        self.delay_samples = 0 if mode == "off" else block + (self.canceller.delay_samples if self.canceller else 0)
        self._mic = np.zeros(0, np.int16)
        self._ref = np.zeros(0, np.int16)
        self._out = np.zeros(block if mode != "off" else 0, np.int16)  # primed: the constant buffering delay
        self._lin = self._out.copy()
        self.linear = np.zeros(0, np.int16)  # the samples ``process`` returned last, as speech recognition hears them
        self._likely = True

    @property
    def erle_db(self) -> float:
        """The canceller's ERLE (dB); 0.0 when there is no canceller."""
        return self.canceller.erle_db if self.canceller is not None else 0.0

    def process(self, mic: np.ndarray, reference: np.ndarray | None) -> np.ndarray:
        mic = check_block("mic", mic, None)
        if reference is None:
            reference = np.zeros(len(mic), np.int16)
        reference = check_block("reference", reference, None)
        if len(reference) != len(mic):
            raise ValueError(
                f"mic has {len(mic)} samples but reference has {len(reference)}; the reference must "
                f"cover exactly the same interval; fix: pad it with zeros (silence) or trim it"
            )
        if self.mode == "off":
            self.linear = mic
            return mic
        self._mic = np.concatenate((self._mic, mic))
        self._ref = np.concatenate((self._ref, reference))
        done, linear = [], []
        B = self.block
        while len(self._mic) >= B:
            m, r = self._mic[:B], self._ref[:B]
            self._mic, self._ref = self._mic[B:], self._ref[B:]
            done.append(self._block(m, r))
            linear.append(self.canceller.linear if self.canceller is not None else done[-1])
        self._out = np.concatenate([self._out, *done])
        self._lin = np.concatenate([self._lin, *linear])
        out, self._out = self._out[: len(mic)], self._out[len(mic) :]
        self.linear, self._lin = self._lin[: len(mic)], self._lin[len(mic) :]
        return out

    def _block(self, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
        assert self.gate is not None  # mode "off" never gets here
        if self.canceller is not None:
            changes = self.canceller.path_changes
            cleaned = self.canceller.process(mic, ref)
            if self.canceller.path_changes != changes:  # what the gate learned about the residual is void now
                self.gate.forget()
            self._likely = self.gate.update(mic, ref, cleaned)
            return cleaned
        self._likely = self.gate.update(mic, ref, mic)
        return mic if self._likely else np.zeros_like(mic)  # muted: even -80 dBFS speech can wake silero

    def double_talk(self) -> bool:
        """The user speaks over our playback: the gate hears what the playback cannot explain while it plays
        (not merely nothing to explain). The VAD may then take ``DOUBLE_TALK_THRESHOLD``."""
        return self._likely and self.gate is not None and self.gate.playing

    def user_speech_likely(self) -> bool:
        """False while everything heard in the last blocks is explained by our own playback; True otherwise
        (always True in mode ``off``). Ask it when the VAD reports speech_start during a reply."""
        return self._likely
