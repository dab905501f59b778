"""The Realtime API's client events, validated into small typed objects (GA shapes, as the openai SDK and pipecat
send them).

Validation is strict about types (a number where a string belongs is an error) but lenient about settings: a
field we cannot honour is accepted, and ``session.updated`` shows what is in force instead (an ``error`` event is
a session-killer for real clients, so it is kept for requests that are truly invalid). Every field has a size cap:
ids, counts and numbers here, text by ``server.max_text_chars`` (passed in as ``Limits``). An error names the
problem, the parameter and the fix; the connection sends it as one ``error`` event and the session goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo

from voice.transports.realtime.wire import ClientError, load_json

MAX_ID = 128  # ids and names a client chooses (pipecat's are 32-36 characters)


@dataclass(frozen=True)
class Limits:
    """The caps that come from the config (server section)."""

    max_text_chars: int = 16384


def _capped(value: str, info: ValidationInfo) -> str:
    limit = (info.context or {}).get("max_text_chars", Limits.max_text_chars)
    if len(value) > limit:
        raise ValueError(
            f"the text is {len(value)} characters, more than server.max_text_chars ({limit}); send shorter text"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text holds an unpaired surrogate (\\ud800-\\udfff); send valid Unicode") from None
    return value


Text = Annotated[str, AfterValidator(_capped)]
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
Modalities = Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=2)]
MaxTokens = Annotated[int, Field(ge=1, le=4096)] | Literal["inf"]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ClientEvent(_Strict):
    type: str
    event_id: Id | None = None


class Append(ClientEvent):
    audio: str


# ---- conversation items --------------------------------------------------------------------------------------


class ContentPart(_Strict):
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio", "text", "audio"]
    text: Text | None = None
    transcript: Text | None = None
    audio: str | None = None
    image_url: str | None = None
    detail: str | None = None


class Item(_Strict):
    type: Literal["message", "function_call", "function_call_output"]
    id: Id | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["user", "assistant", "system"] | None = None
    content: Annotated[list[ContentPart], Field(max_length=16)] | None = None
    call_id: Id | None = None
    name: Name | None = None
    arguments: Text | None = None
    output: Text | None = None


class ItemCreate(ClientEvent):
    item: Item
    previous_item_id: Id | None = None


class Truncate(ClientEvent):
    item_id: Id
    content_index: Annotated[int, Field(ge=0, le=64)] = 0
    audio_end_ms: Annotated[int, Field(ge=0, le=86_400_000)]


class ItemRef(ClientEvent):
    item_id: Id


# ---- tools -------------------------------------------------------------------------------------------------


class FunctionTool(_Strict):
    type: Literal["function"] = "function"
    name: Name
    description: Text | None = None
    parameters: dict[str, Any] | None = None


class OtherTool(_Strict):
    """A tool kind we do not run (MCP servers): accepted, and left out of the tools in force."""

    type: Literal["mcp"]


class ToolChoiceFunction(_Strict):
    type: Literal["function", "mcp"]
    name: Name | None = None


Tools = Annotated[list[FunctionTool | OtherTool], Field(max_length=64)]
ToolChoice = Literal["auto", "none", "required"] | ToolChoiceFunction


# ---- session ---------------------------------------------------------------------------------------------------


class Format(_Strict):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
    rate: Annotated[int, Field(ge=1, le=384000)] | None = None


class TurnDetection(_Strict):
    type: Literal["server_vad", "semantic_vad"]
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    prefix_padding_ms: Annotated[int, Field(ge=0, le=60000)] | None = None
    silence_duration_ms: Annotated[int, Field(ge=0, le=60000)] | None = None
    idle_timeout_ms: Annotated[int, Field(ge=0, le=86_400_000)] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None


class Transcription(_Strict):
    model: Annotated[str, Field(max_length=MAX_ID)] | None = None
    language: Annotated[str, Field(max_length=16)] | None = None
    prompt: Text | None = None


class NoiseReduction(_Strict):
    type: Literal["near_field", "far_field"] | None = None


class VoiceId(_Strict):
    id: Id


class AudioIn(_Strict):
    format: Format | None = None
    turn_detection: TurnDetection | None = None
    transcription: Transcription | None = None
    noise_reduction: NoiseReduction | None = None


class AudioOut(_Strict):
    format: Format | None = None
    voice: Annotated[str, Field(max_length=MAX_ID)] | VoiceId | None = None
    speed: Annotated[float, Field(ge=0.25, le=4.0)] | None = None


class Audio(_Strict):
    input: AudioIn | None = None
    output: AudioOut | None = None


class SessionParams(_Strict):
    type: Literal["realtime"] = "realtime"
    model: Annotated[str, Field(max_length=MAX_ID)] | None = None
    instructions: Text | None = None
    output_modalities: Modalities | None = None
    audio: Audio | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None  # not in the GA session, but pipecat and beta clients send it


class SessionUpdate(ClientEvent):
    session: SessionParams


# ---- responses ----------------------------------------------------------------------------------------------


class ResponseAudio(_Strict):
    output: AudioOut | None = None


class ResponseParams(_Strict):
    output_modalities: Modalities | None = None
    instructions: Text | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    conversation: Annotated[str, Field(max_length=MAX_ID)] | None = None
    input: list[Any] | None = None
    audio: ResponseAudio | None = None


class ResponseCreate(ClientEvent):
    response: ResponseParams | None = None


class ResponseCancel(ClientEvent):
    response_id: Id | None = None


SCHEMAS: dict[str, type[ClientEvent]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": Append,
    "input_audio_buffer.commit": ClientEvent,
    "input_audio_buffer.clear": ClientEvent,
    "conversation.item.create": ItemCreate,
    "conversation.item.truncate": Truncate,
    "conversation.item.delete": ItemRef,
    "conversation.item.retrieve": ItemRef,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
}


def parse_client_event(text: str | bytes, limits: Limits = Limits()) -> ClientEvent:
    """JSON text -> a validated client event, or ClientError naming the problem and the fix."""
    if isinstance(text, bytes):
        raise ClientError(
            "binary_not_supported",
            "binary frames are not part of this API; send JSON text frames "
            "(audio goes base64 in input_audio_buffer.append)",
        )
    raw = load_json(text)
    if not isinstance(raw, dict):
        raise ClientError("invalid_json", "the message must be a JSON object with a 'type' field")
    event_id = raw.get("event_id")
    event_id = event_id if isinstance(event_id, str) and len(event_id) <= MAX_ID else None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise ClientError("missing_type", "the event has no string 'type' field", param="type", event_id=event_id)
    schema = SCHEMAS.get(kind)
    if schema is None:
        shown = json.dumps(kind[:60])
        raise ClientError(
            "unknown_event_type",
            f"unsupported event type {shown}; this server accepts: {', '.join(SCHEMAS)}",
            param="type",
            event_id=event_id,
        )
    try:
        return schema.model_validate(raw, context={"max_text_chars": limits.max_text_chars})
    except ValidationError as exc:
        err = exc.errors()[0]
        param = _param(err["loc"])
        got = err.get("input")
        got_text = f" (got {json.dumps(got)[:60]})" if isinstance(got, (str, int, float, bool)) else ""
        message = err["msg"].removeprefix("Value error, ")
        raise ClientError(
            "invalid_value", f"{kind}: {param}: {message}{got_text}", param=param, event_id=event_id
        ) from None


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _param(loc: tuple[Any, ...]) -> str:
    """A validation error's location as the client wrote it: ``session.tools.0.name``, without pydantic's tags
    for union members (class names, ``literal[...]``, ``constrained-int``)."""
    parts = [
        str(p) for p in loc if isinstance(p, int) or not (p[:1].isupper() or "[" in p or "-" in p or p in _TYPE_TAGS)
    ]
    return ".".join(parts)[:200]
