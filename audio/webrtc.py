"""WebRTC's audio processing module (echo cancellation, noise suppression, gain control), as the livekit real-time
SDK ships it.

``WebRtcAudio`` takes 16 kHz mono int16 blocks of any length (WebRTC works on 10 ms frames), keeps the remainder
for the next call, and returns as many samples as it was given; its output lags its input by ``delay_samples``
(one frame). With echo cancellation, ``reference`` is what the speaker played over the same interval as the
microphone block (silence when None), and WebRTC's own delay estimator finds where the echo lies.
"""

from __future__ import annotations

import numpy as np

from audio.frames import SPEECH_RATE

FRAME = SPEECH_RATE // 100  # WebRTC processes a hundredth of a second at a time


class WebRtcAudio:
    """One microphone stream through WebRTC's audio processing (each stream needs its own: it is stateful)."""

    def __init__(self, *, echo: bool = False, noise: bool = True, gain: bool = False) -> None:
        from livekit.rtc import AudioProcessingModule

        self.echo = echo
        self._apm = AudioProcessingModule(
            echo_cancellation=echo, noise_suppression=noise, high_pass_filter=True, auto_gain_control=gain
        )
        self._mic = np.zeros(0, np.int16)  # input not yet a whole frame
        self._ref = np.zeros(0, np.int16)
        self._ready = np.zeros(FRAME, np.int16)  # processed output not yet returned (starts as the delay)

    @property
    def delay_samples(self) -> int:
        return FRAME

    def process(self, mic: np.ndarray, reference: np.ndarray | None = None) -> np.ndarray:
        """The processed audio of the same length as ``mic`` (int16), ``delay_samples`` late."""
        from livekit.rtc import AudioFrame

        if reference is not None and len(reference) != len(mic):
            raise ValueError(f"mic has {len(mic)} samples but reference has {len(reference)}; fix: the same interval")
        if reference is None:
            reference = np.zeros(len(mic), np.int16)
        self._mic = np.concatenate([self._mic, np.asarray(mic, np.int16)])
        self._ref = np.concatenate([self._ref, np.asarray(reference, np.int16)])
        whole = len(self._mic) // FRAME * FRAME
        out = [self._ready]
        for start in range(0, whole, FRAME):
            if self.echo:
                played = AudioFrame(self._ref[start : start + FRAME].tobytes(), SPEECH_RATE, 1, FRAME)
                self._apm.process_reverse_stream(played)
                self._apm.set_stream_delay_ms(0)  # the reference is aligned with the mic; the rest is the room's
            frame = AudioFrame(self._mic[start : start + FRAME].tobytes(), SPEECH_RATE, 1, FRAME)
            self._apm.process_stream(frame)  # in place
            out.append(np.frombuffer(frame.data, np.int16).copy())
        self._mic, self._ref = self._mic[whole:], self._ref[whole:]
        ready = np.concatenate(out)
        self._ready = ready[len(mic) :]
        return ready[: len(mic)]
