"""Voice activity detection: speech-start and speech-end events from a stream of 16 kHz blocks.

Silero VAD (onnx, run directly with onnxruntime) scores 512-sample windows (32 ms); webrtcvad is the
fallback (30 ms frames, a yes/no per frame). One state machine turns scores into events:
  - start: the score stays at or above ``threshold`` (with hysteresis: dips above ``threshold - 0.15`` are
    tolerated) for ``min_speech_ms``; the event's ``t`` is the first voiced window, and its ``audio`` is
    the pre-roll: everything from ``preroll_ms`` before that up to the end of the block just processed,
    so the first syllable is not lost and the pipeline simply appends every later block;
  - end: the score stays below ``threshold - 0.15`` for ``end_silence_ms``; ``t`` is the end of the last
    voiced window, ``decided_t`` the stream time at which the silence was long enough (the endpointing
    wait is ``decided_t - t``).
All times are on the chunks' clock (monotonic seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from audio.frames import SPEECH_RATE, AudioChunk

_HYSTERESIS = 0.15


_RESYNC_S = 0.05


@dataclass
class VadEvent:
    kind: Literal["speech_start", "speech_end"]
    t: float  # first voiced sample (start) or end of the last voiced sample (end)
    audio: np.ndarray | None = None  # speech_start: the pre-roll (int16), see the module docstring
    decided_t: float | None = None  # when the event could be decided (stream clock)


class _Silero:
    """Silero VAD v5/v6 onnx: each call takes 64 samples of context + 512 new samples and a recurrent state."""

    window = 512
    _context = 64

    def __init__(self, model_path: str | Path, sample_rate: int) -> None:
        import onnxruntime as ort

        if sample_rate != SPEECH_RATE:
            raise ValueError(f"silero VAD here runs at {SPEECH_RATE} Hz (got {sample_rate}); fix: resample the input")
        opts = ort.SessionOptions()
        opts.inter_op_num_threads = opts.intra_op_num_threads = 1  # 0.3 ms per window: threads only add overhead
        self.session = ort.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
        self.sr = np.array(sample_rate, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        self.state = np.zeros((2, 1, 128), dtype=np.float32)
        self.context = np.zeros((1, self._context), dtype=np.float32)

    def score(self, window: np.ndarray) -> float:
        x = np.concatenate([self.context, (window.astype(np.float32) / 32768.0)[None, :]], axis=1)
        prob, self.state = self.session.run(None, {"input": x, "state": self.state, "sr": self.sr})
        self.context = x[:, -self._context :]
        return float(prob[0, 0])


class _WebRtc:
    """webrtcvad: no model file, a binary decision per 30 ms frame. ``threshold`` maps to its aggressiveness."""

    def __init__(self, sample_rate: int, threshold: float) -> None:
        import webrtcvad

        if sample_rate not in (8000, 16000, 32000, 48000):
            raise ValueError(f"webrtcvad needs 8/16/32/48 kHz (got {sample_rate}); fix: resample the input")
        self.vad = webrtcvad.Vad(min(3, int(threshold * 4)))
        self.rate = sample_rate
        self.window = sample_rate * 30 // 1000

    def reset(self) -> None:
        pass

    def score(self, window: np.ndarray) -> float:
        return 1.0 if self.vad.is_speech(window.astype("<i2").tobytes(), self.rate) else 0.0


class Vad:
    """Stateful VAD over a block stream; ``process`` returns the events each block completes."""

    def __init__(
        self,
        model_path: str | Path | None,
        *,
        engine: Literal["silero", "webrtc"] = "silero",
        threshold: float = 0.5,
        min_speech_ms: int = 200,
        end_silence_ms: int = 500,
        preroll_ms: int = 300,
        sample_rate: int = SPEECH_RATE,
    ) -> None:
        if engine == "silero":
            if model_path is None or not Path(model_path).exists():
                raise FileNotFoundError(
                    f"silero VAD model {model_path!r} not found; fix: `specvoice models prepare "
                    f"silero-vad`, or set vad.engine = 'webrtc'"
                )
            self.model: _Silero | _WebRtc = _Silero(model_path, sample_rate)
        elif engine == "webrtc":
            self.model = _WebRtc(sample_rate, threshold)
        else:
            raise ValueError(f"unknown VAD engine {engine!r}; fix: use 'silero' or 'webrtc'")
        self.rate = sample_rate
        self.threshold = threshold
        self.min_speech_s = min_speech_ms / 1000
        self.end_silence_s = end_silence_ms / 1000
        self.preroll_s = preroll_ms / 1000
        self._history_max = int((preroll_ms + min_speech_ms + 500) * sample_rate / 1000) + self.model.window
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new stream, or after the pipeline finished a turn)."""
        self.model.reset()
        self.speaking = False
        self._pending = np.zeros(0, dtype=np.int16)  # samples not yet scored
        self._pending_t: float | None = None  # time of _pending[0]
        self._history = np.zeros(0, dtype=np.int16)  # the most recent raw samples, for the pre-roll
        self._history_end_t = 0.0
        self._voiced_since: float | None = None  # candidate start while not speaking
        self._silent_since: float | None = None  # candidate end while speaking
        self.last_score = 0.0

    @property
    def pause_since(self) -> float | None:
        """While speaking: the start of the current silence (a possible end of turn), else None. Lets the
        STT decode speculatively during the endpointing wait."""
        return self._silent_since if self.speaking else None

    def process(
        self, chunk: AudioChunk, threshold: float | None = None, keep: np.ndarray | None = None
    ) -> list[VadEvent]:
        """The events this chunk completes. ``threshold``: a lower one for this chunk only, when another detector
        already hears speech in it (the echo gate during a reply: the echo canceller takes part of the user's
        voice away with ours, and the score falls). ``keep``: what the pre-roll (``since``) gives back for this
        chunk, if not the samples scored (the echo canceller's linear output, which Whisper hears better)."""
        if chunk.sample_rate != self.rate:
            raise ValueError(f"VAD expects {self.rate} Hz audio (got {chunk.sample_rate}); fix: resample first")
        samples = np.asarray(chunk.samples, dtype=np.int16)
        expected = None if self._pending_t is None else self._pending_t + len(self._pending) / self.rate
        if expected is None or not len(self._pending) or abs(chunk.t - expected) > _RESYNC_S:
            # a gap or a jump in the stream (a client that paused sending): re-anchor the leftover samples on
            # the new chunk's clock, or every later event would drift by the gap
            self._pending_t = chunk.t - len(self._pending) / self.rate
        self._pending = np.concatenate([self._pending, samples])
        kept = samples if keep is None else np.asarray(keep, dtype=np.int16)
        self._history = np.concatenate([self._history, kept])[-self._history_max :]
        self._history_end_t = chunk.end_t
        events: list[VadEvent] = []
        w = self.model.window
        while len(self._pending) >= w:
            window, self._pending = self._pending[:w], self._pending[w:]
            t = self._pending_t
            assert t is not None  # anchored above, before any window is scored
            self._pending_t = t + w / self.rate
            event = self._step(
                self.model.score(window), t, t + w / self.rate, self.threshold if threshold is None else threshold
            )
            if event is not None:
                events.append(event)
        return events

    def _step(self, score: float, t0: float, t1: float, threshold: float) -> VadEvent | None:
        self.last_score = score
        voiced = score >= threshold
        silent = score < threshold - _HYSTERESIS
        if not self.speaking:
            if voiced and self._voiced_since is None:
                self._voiced_since = t0
            elif silent:
                self._voiced_since = None
            if self._voiced_since is not None and t1 - self._voiced_since >= self.min_speech_s:
                self.speaking, self._silent_since = True, None
                return VadEvent("speech_start", self._voiced_since, self._preroll(self._voiced_since), decided_t=t1)
            return None
        if silent and self._silent_since is None:
            self._silent_since = t0
        elif voiced:
            self._silent_since = None
        if self._silent_since is not None and t1 - self._silent_since >= self.end_silence_s:
            self.speaking, self._voiced_since = False, None
            return VadEvent("speech_end", self._silent_since, None, decided_t=t1)
        return None

    def _preroll(self, start_t: float) -> np.ndarray:
        """History from ``preroll_s`` before ``start_t`` up to the end of the current block."""
        return self.since(start_t - self.preroll_s)

    def since(self, t: float) -> np.ndarray:
        """The samples from time ``t`` up to the end of the last block (as far back as the history goes: about
        ``preroll_ms + min_speech_ms`` + 0.5 s)."""
        keep = int(round((self._history_end_t - t) * self.rate))
        return self._history[-keep:].copy() if keep > 0 else np.zeros(0, dtype=np.int16)
