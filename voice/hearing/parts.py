"""The parts of a Listener as the config describes them: the VAD, the semantic end of turn, the echo canceller and
the noise suppressor (voice.hearing.listener puts them together). The wake word is the device microphone's alone
(``Assistant.wake_word``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audio.echo import EchoSuppressor
from audio.frames import SPEECH_RATE
from audio.vad import Vad
from audio.wakeword import WakeWord
from audio.webrtc import WebRtcAudio
from voice.hearing.endpointing import SemanticEnd, TurnModel, turn_settings

SAFETY_SILENCE_MS = 500  # semantic end: the VAD still ends a turn this long after turn.max_silence_ms, as a backstop
LOAD_TURN_MODEL = object()  # listener_parts: load the turn model named by the config


@dataclass(frozen=True)
class ListenerParts:
    vad: Vad | None = None
    turn: SemanticEnd | None = None
    echo: EchoSuppressor | None = None
    denoise: tuple[WebRtcAudio, WebRtcAudio] | None = None  # for what the VAD hears, and what Whisper hears


def listener_parts(
    config: Any,
    endpointing: bool = True,
    vad_path: str | None = None,
    turn_model: Any = LOAD_TURN_MODEL,
) -> ListenerParts:
    """The parts ``config`` asks for; without ``endpointing`` none but the noise suppressor (the caller ends
    utterances itself). Model paths are resolved here unless given."""
    # the echo canceller gives two signals (its cleaned output and its linear output): each gets its own suppressor
    denoise = (WebRtcAudio(noise=True), WebRtcAudio(noise=True)) if config.audio.noise_suppression else None
    if not endpointing:
        return ListenerParts(denoise=denoise)
    from voice.models import resolve

    v, m = config.vad, config.models
    if turn_model is LOAD_TURN_MODEL:
        turn_model = TurnModel.load(config)
    turn = SemanticEnd(turn_settings(config), turn_model) if isinstance(turn_model, TurnModel) else None
    end_silence = v.end_silence_ms if turn is None else config.turn.max_silence_ms + SAFETY_SILENCE_MS
    if v.engine == "silero" and vad_path is None:
        vad_path = str(resolve(m.vad, "vad", m.cache_dir).path)
    vad = Vad(
        vad_path or None,
        engine=v.engine,
        threshold=v.threshold,
        min_speech_ms=v.min_speech_ms,
        end_silence_ms=end_silence,
        preroll_ms=v.preroll_ms,
        sample_rate=SPEECH_RATE,
    )
    echo = None
    if config.audio.echo != "off":
        echo = EchoSuppressor(SPEECH_RATE, mode=config.audio.echo, filter_ms=config.audio.echo_filter_ms)
    return ListenerParts(vad=vad, turn=turn, echo=echo, denoise=denoise)


def wake_word(config: Any, wake_dir: str | None = None) -> WakeWord | None:
    """A new detector of the configured wake word (models.wake_word; None when it is off), from ``wake_dir`` or
    the model cache. Only the device's own microphone listens for one (``Assistant.wake_word``)."""
    m = config.models
    if not m.wake_word:
        return None
    if wake_dir is None:
        from voice.models import resolve

        wake_dir = str(resolve(m.wake_word, "wake", m.cache_dir).path)
    return WakeWord(m.wake_word, wake_dir)
