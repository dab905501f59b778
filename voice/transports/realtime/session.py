"""A Realtime session's settings: what a client asked for, what is in force, and the session object that says so.

The rule: every setting a client sends is applied, or ``session.updated`` reports what is in force instead; an
``error`` is only for a request that is truly invalid. Applied: ``instructions`` (the system prompt), audio formats
(``audio/pcm`` at common rates, G.711 u-law and A-law), turn detection on or off, function ``tools`` and
``tool_choice`` auto/none, ``max_output_tokens``, ``temperature``, ``output_modalities``. Reported as in force
instead: the voice (one piper voice), the speed (the voice's own), the transcription model (ours), the VAD's
parameters and ``semantic_vad`` (our VAD, always interruptible), noise reduction (none), ``tool_choice``
required/a named function (auto: the chat template cannot force a call), audio plus text (audio, which always
comes with its transcript).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voice.transports.realtime.events import FunctionTool, ResponseParams, SessionParams
from voice.transports.realtime.wire import WireFormat


@dataclass
class Settings:
    """What is in force for one session (or one response: ``for_response`` overlays its parameters)."""

    instructions: str
    max_output_tokens: int
    temperature: float
    modalities: list[str] = field(default_factory=lambda: ["audio"])
    input_format: WireFormat = field(default_factory=WireFormat)
    output_format: WireFormat = field(default_factory=WireFormat)
    tools: list[FunctionTool] = field(default_factory=list)
    tool_choice: str = "auto"  # auto | none

    def updated(self, params: SessionParams | ResponseParams, default_tokens: int) -> Settings:
        """These settings with a session.update (or a response.create's overrides) applied: a new object, so a
        request with one bad field changes nothing (ClientError names the field)."""
        copy = Settings(
            self.instructions,
            self.max_output_tokens,
            self.temperature,
            list(self.modalities),
            self.input_format,
            self.output_format,
            list(self.tools),
            self.tool_choice,
        )
        copy._update(params, default_tokens)
        return copy

    def _update(self, params: SessionParams | ResponseParams, default_tokens: int) -> None:
        if params.instructions is not None:
            self.instructions = params.instructions
        if params.output_modalities is not None:
            self.modalities = ["audio"] if "audio" in params.output_modalities else ["text"]
        if params.tools is not None:
            self.tools = [t for t in params.tools if isinstance(t, FunctionTool)]
        if params.tool_choice is not None:
            self.tool_choice = "none" if params.tool_choice == "none" else "auto"
        if params.max_output_tokens is not None:
            self.max_output_tokens = default_tokens if params.max_output_tokens == "inf" else params.max_output_tokens
        if params.temperature is not None:
            self.temperature = params.temperature
        audio = params.audio
        if audio is not None and audio.output is not None and audio.output.format is not None:
            f = audio.output.format
            self.output_format = WireFormat.parse(f.type, f.rate, "audio.output.format")
        audio_in = params.audio.input if isinstance(params, SessionParams) and params.audio is not None else None
        if audio_in is not None and audio_in.format is not None:
            f = audio_in.format
            self.input_format = WireFormat.parse(f.type, f.rate, "audio.input.format")

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The tools as a chat template takes them (transformers' ``tools=``), or None (none, or choice none)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": t.parameters or {"type": "object", "properties": {}},
                },
            }
            for t in self.tools
        ]

    def tools_json(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "name": t.name,
                "description": t.description or "",
                "parameters": t.parameters or {"type": "object", "properties": {}},
            }
            for t in self.tools
        ]


def asks_for_unsupported(params: ResponseParams) -> tuple[str, str] | None:
    """A response.create parameter we cannot honour and must not ignore: (param, why), else None."""
    if params.conversation not in (None, "auto"):
        return "response.conversation", (
            "out-of-band responses (conversation other than 'auto') are not supported; omit response.conversation"
        )
    if params.input is not None:
        return "response.input", (
            "a response with its own input items is not supported; add the items with "
            "conversation.item.create, then send response.create without input"
        )
    return None


def session_object(config: Any, session_id: str, s: Settings, server_vad: bool) -> dict[str, Any]:
    """The effective session configuration (what session.created / session.updated report)."""
    cfg = config
    vad = (
        {
            "type": "server_vad",
            "threshold": cfg.vad.threshold,
            "prefix_padding_ms": cfg.vad.preroll_ms,
            "silence_duration_ms": cfg.vad.end_silence_ms,
            "create_response": True,
            "interrupt_response": True,
            "idle_timeout_ms": None,
        }
        if server_vad
        else None
    )
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": cfg.models.target,
        "output_modalities": list(s.modalities),
        "instructions": s.instructions,
        "max_output_tokens": s.max_output_tokens,
        "temperature": s.temperature,
        "tools": s.tools_json(),
        "tool_choice": s.tool_choice,
        "audio": {
            "input": {
                "format": s.input_format.to_json(),
                "transcription": {"model": cfg.models.stt, "language": cfg.stt.language},
                "turn_detection": vad,
                "noise_reduction": None,
            },
            "output": {"format": s.output_format.to_json(), "voice": cfg.models.tts, "speed": 1.0},
        },
    }
