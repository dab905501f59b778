"""The speech config sections: [stt], [tts], [vad], [turn] (the end of the user's turn) and [audio].

Apart from voice/config.py so each file stays readable in one sitting; voice.config re-exports them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from voice.config_servers import Section as _Section

# faster-whisper keeps at most 223 tokens of hotwords (half of Whisper's 448-token context); English names run
# about 4 characters a token, so this many characters fit with room to spare
HOTWORDS_MAX_CHARS = 600


class STTConfig(_Section):
    language: str | None = "en"
    device: str = "cpu"
    compute_type: str = "int8"
    beam_size: int = Field(1, ge=1, description="beam of every pass that can become the final transcript")
    partial_beam_size: int = Field(1, ge=1, description="beam of the passes while the user speaks (partials)")
    partial_interval_ms: int = Field(600, ge=100)
    window_s: int = Field(
        0,
        ge=0,
        le=30,
        description="Whisper's input window in seconds: 0 (the default) fits it to the audio, at least 10 s, for "
        "the pass at a pause (p50 274 vs 427 ms, WER .101 vs .107 on the varied set; plain passes keep 30); 30 is "
        "Whisper's own padded window for every pass",
    )
    threads: int = Field(
        1,
        ge=1,
        description="CTranslate2 threads of a Whisper pass: tiny.en's pass at a pause took 289 ms on one thread and "
        "320-388 on two (2-core CPU, quiet), and one leaves the other core to the LLM",
    )
    backend: Literal["local", "wyoming"] = Field(
        "local",
        description="wyoming: transcribe on a Wyoming asr "
        "server at stt.uri (another specvoice, wyoming-faster-whisper)",
    )
    uri: str | None = Field(None, description="tcp://host:port of the Wyoming asr server (stt.backend = 'wyoming')")
    timeout_s: float = Field(10.0, gt=0, description="wyoming: connecting, and the transcript after the audio")
    hotwords: list[str] | None = Field(
        None,
        description="phrases Whisper is told to expect (faster-whisper's hotwords): names it would mishear. "
        "Unset: the names and areas of mqtt.devices (voice.config.stt_hotwords); [] for none",
    )

    @field_validator("hotwords")
    @classmethod
    def _hotwords(cls, phrases: list[str] | None) -> list[str] | None:
        if phrases is None:
            return None
        kept = list(dict.fromkeys(" ".join(p.split()) for p in phrases))
        if "" in kept:
            raise ValueError("an empty phrase; fix: remove it (stt.hotwords = [] turns the hint off)")
        if len(", ".join(kept)) > HOTWORDS_MAX_CHARS:
            raise ValueError(
                f"{len(', '.join(kept))} characters of phrases; Whisper reads about the first "
                f"{HOTWORDS_MAX_CHARS} (~{HOTWORDS_MAX_CHARS // 4} tokens) and cuts the rest; fix: list only "
                f"the names Whisper mishears"
            )
        return kept

    @model_validator(mode="after")
    def _remote_needs_uri(self) -> STTConfig:
        _check_uri("stt", self.backend, self.uri)
        return self


class TTSConfig(_Section):
    speaker_id: int | None = None
    length_scale: float = Field(1.0, gt=0.0)
    noise_scale: float | None = Field(
        None, ge=0.0, description="piper's sampling noise (none: the voice's own); 0: the same audio every time"
    )
    noise_w_scale: float | None = Field(
        None, ge=0.0, description="piper's phoneme-length noise (none: the voice's own); 0: the same timing every time"
    )
    first_fragment_chars: int = Field(12, ge=1)
    first_fragment_words: int = Field(
        3,
        ge=0,
        description="cut the first fragment after this many words if no punctuation came yet (0: wait for punctuation)",
    )
    max_fragment_words: int = Field(30, ge=4)
    backend: Literal["local", "wyoming"] = Field(
        "local", description="wyoming: speak with a Wyoming tts server at tts.uri (another specvoice, wyoming-piper)"
    )
    uri: str | None = Field(None, description="tcp://host:port of the Wyoming tts server (tts.backend = 'wyoming')")
    voice: str | None = Field(None, description="wyoming: the server's voice name; default: the server's own")
    timeout_s: float = Field(10.0, gt=0, description="wyoming: connecting, and the first audio of a sentence")

    @model_validator(mode="after")
    def _remote_needs_uri(self) -> TTSConfig:
        _check_uri("tts", self.backend, self.uri)
        return self


def _check_uri(section: str, backend: str, uri: str | None) -> None:
    """A Wyoming backend needs tcp://host:port (what Home Assistant and the wyoming package call a uri)."""
    if backend != "wyoming":
        return
    from urllib.parse import urlsplit

    parts = urlsplit(uri or "")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise ValueError(
            f"{section}.backend = 'wyoming' needs {section}.uri = 'tcp://host:port' (got {uri!r}); "
            f"fix: e.g. {section}.uri = 'tcp://192.168.1.20:10300'"
        )


class VADConfig(_Section):
    engine: Literal["silero", "webrtc"] = "silero"
    threshold: float = Field(0.5, gt=0.0, lt=1.0)
    min_speech_ms: int = Field(200, ge=0)
    end_silence_ms: int = Field(500, ge=50)
    preroll_ms: int = Field(300, ge=0)


class TurnConfig(_Section):
    """When the user's turn is over (audio.end_of_turn.EndOfTurnPolicy). 'smart': after min_silence_ms of silence ask
    the Smart Turn model; end at once if it says complete (and the transcript so far does not trail off),
    else keep listening up to max_silence_ms. 'vad' (or the model missing): vad.end_silence_ms of silence."""

    engine: Literal["smart", "vad"] = "smart"
    threshold: float = Field(0.5, gt=0.0, lt=1.0, description="P(complete) at or above which the turn ends")
    min_silence_ms: int = Field(200, ge=20, description="silence before the model is asked")
    max_silence_ms: int = Field(1000, ge=100, description="silence that ends the turn whatever the model says")
    reask_ms: int = Field(
        0,
        ge=0,
        description="after 'incomplete', ask again each time the pause grew this much "
        "(0: once per pause; asking later raises false cuts)",
    )
    use_transcript: bool = Field(
        True, description="a transcript ending on 'the', 'and', 'for', '...' vetoes 'complete'"
    )
    threads: int = Field(1, ge=1, le=8, description="onnxruntime threads for the model")

    @model_validator(mode="after")
    def _ordered(self) -> TurnConfig:
        if self.min_silence_ms > self.max_silence_ms:
            raise ValueError(
                f"turn.min_silence_ms ({self.min_silence_ms}) is above turn.max_silence_ms "
                f"({self.max_silence_ms}); fix: make min_silence_ms the smaller"
            )
        return self


class AudioConfig(_Section):
    input_device: str | int | None = None
    output_device: str | int | None = None
    block_ms: int = Field(20, ge=5, le=200)
    latency: Literal["low", "high"] | float = Field(
        "high", description="device buffering (PortAudio 'low'/'high' or seconds); 'low' underflows on a busy CPU"
    )
    echo: Literal["off", "gate", "cancel"] = "cancel"
    echo_filter_ms: int = Field(200, ge=20, le=1000, description="longest speaker-to-mic delay the canceller covers")
    noise_suppression: bool = Field(
        False, description="WebRTC's noise suppressor after the echo canceller, before the VAD and the recogniser"
    )
    follow_up_s: float = Field(
        5.0,
        ge=0,
        le=60,
        description="after a reply, speech starting this soon opens a turn without the wake word (conversation "
        "mode: an answer to a question back, a second request); 0: every turn needs the wake word",
    )
