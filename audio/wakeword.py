"""Optional wake word ("hey jarvis", "okay nabu") with pyopen-wakeword: numpy plus a bundled tflite runtime.

Off by default (models.wake_word unset). Feed it the same 16 kHz blocks the VAD gets; ``process`` returns
True on the block where the wake word's probability crosses ``threshold``. After a detection it ignores
``refractory_s`` of audio, so one utterance triggers once.
"""

from __future__ import annotations

from pathlib import Path

from audio.frames import SPEECH_RATE, AudioChunk


class WakeWord:
    def __init__(self, name: str, models_dir: str | Path, *, threshold: float = 0.5, refractory_s: float = 2.0) -> None:
        from pyopen_wakeword import OpenWakeWord, OpenWakeWordFeatures

        model = Path(models_dir) / f"{name}.tflite"
        if not model.exists():
            names = sorted(
                p.stem for p in Path(models_dir).glob("*.tflite") if p.stem not in ("melspectrogram", "embedding_model")
            )
            raise FileNotFoundError(
                f"no wake word model {name!r} in {models_dir}; fix: set models.wake_word to one of {names}"
            )
        self.name = name
        self.threshold = threshold
        self.refractory_s = refractory_s
        self._model = OpenWakeWord.from_model(model)
        self._features = OpenWakeWordFeatures.from_builtin(models_dir)
        self._quiet_until = 0.0
        self.last_probability = 0.0

    def process(self, chunk: AudioChunk) -> bool:
        if chunk.sample_rate != SPEECH_RATE:
            raise ValueError(
                f"wake word detection needs {SPEECH_RATE} Hz audio (got {chunk.sample_rate}); fix: resample"
            )
        fired = False
        for features in self._features.process_streaming(chunk.samples.astype("<i2").tobytes()):
            for prob in self._model.process_streaming(features):
                self.last_probability = prob
                if prob >= self.threshold and chunk.t >= self._quiet_until:
                    fired = True
                    self._quiet_until = chunk.end_t + self.refractory_s
        return fired

    def reset(self) -> None:
        self._model.reset()
        self._features.reset()
        self._quiet_until = 0.0
