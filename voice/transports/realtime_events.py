"""The Realtime API's wire format: client events validated into small typed objects, audio decoding, errors.

Validation is strict (a number where a string belongs is an error) and every error names the problem, the
parameter and the fix; the connection turns it into one ``error`` event and the session goes on.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

WIRE_RATE = 24000  # the Realtime API's audio/pcm rate


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class ClientError(Exception):
    """A problem with what the client sent; becomes an ``error`` event, the session goes on."""

    def __init__(self, code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ClientEvent(_Strict):
    type: str
    event_id: str | None = None


class Append(ClientEvent):
    audio: str


class TextPart(_Strict):
    type: Literal["input_text"]
    text: str


class UserItem(_Strict):
    type: Literal["message"]
    role: Literal["user"]
    content: list[TextPart]
    id: str | None = None


class ItemCreate(ClientEvent):
    item: UserItem
    previous_item_id: str | None = None


class Truncate(ClientEvent):
    item_id: str
    content_index: int = 0
    audio_end_ms: int


class ResponseParams(_Strict):
    output_modalities: list[Literal["text", "audio"]] | None = None
    conversation: Literal["auto"] | None = None
    input: None = None
    metadata: dict[str, str] | None = None


class ResponseCreate(ClientEvent):
    response: ResponseParams | None = None


class ResponseCancel(ClientEvent):
    response_id: str | None = None


class _Format(_Strict):
    type: Literal["audio/pcm"]
    rate: Literal[24000] = 24000


class _TurnDetection(_Strict):
    type: Literal["server_vad", "semantic_vad"]
    create_response: Literal[True] = True      # our VAD always answers at end of speech
    interrupt_response: Literal[True] = True   # and speech during a reply is always a barge-in


class _AudioIn(_Strict):
    format: _Format | None = None
    turn_detection: _TurnDetection | None = None


class _AudioOut(_Strict):
    format: _Format | None = None


class _Audio(_Strict):
    input: _AudioIn | None = None
    output: _AudioOut | None = None


class SessionParams(_Strict):
    type: Literal["realtime"] = "realtime"
    audio: _Audio | None = None
    output_modalities: list[Literal["text", "audio"]] | None = None


class SessionUpdate(ClientEvent):
    session: SessionParams


SCHEMAS: dict[str, type[ClientEvent]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": Append,
    "input_audio_buffer.commit": ClientEvent,
    "input_audio_buffer.clear": ClientEvent,
    "conversation.item.create": ItemCreate,
    "conversation.item.truncate": Truncate,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
}


def parse_client_event(text: str | bytes) -> ClientEvent:
    """JSON text -> a validated client event, or ClientError naming the problem and the fix."""
    if isinstance(text, bytes):
        raise ClientError("binary_not_supported", "binary frames are not part of this API; send JSON text frames "
                          "(audio goes base64 in input_audio_buffer.append)")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClientError("invalid_json", f"the message is not valid JSON ({exc}); send one JSON object per "
                          "frame") from None
    if not isinstance(raw, dict):
        raise ClientError("invalid_json", "the message must be a JSON object with a 'type' field")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise ClientError("missing_type", "the event has no string 'type' field", param="type", event_id=event_id)
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise ClientError("unknown_event_type", f"unsupported event type {kind!r}; this server accepts: "
                          f"{', '.join(SCHEMAS)}", param="type", event_id=event_id)
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"])
        got = err.get("input")
        got_text = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        raise ClientError("invalid_value", f"{kind}: {param}: {err['msg']}{got_text}", param=param,
                          event_id=event_id) from None


def decode_pcm16(b64: str) -> np.ndarray:
    """base64 pcm16 little-endian -> int16 samples, or ClientError saying what is wrong with the audio."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ClientError("invalid_audio", "audio is not valid base64; send base64 of 16-bit little-endian mono "
                          "PCM at 24 kHz", param="audio") from None
    if len(raw) % 2:
        raise ClientError("invalid_audio", f"audio has {len(raw)} bytes, an odd number: pcm16 needs 2 bytes per "
                          "sample; send 16-bit little-endian mono PCM at 24 kHz", param="audio")
    return np.frombuffer(raw, dtype="<i2").astype(np.int16)


def encode_pcm16(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode("ascii")


def one_modality(values: list[str], param: str) -> list[str]:
    if len(set(values)) != 1:
        raise ClientError("invalid_value", f"{param} must be [\"audio\"] or [\"text\"] (audio always comes with "
                          f"its transcript); got {values!r}", param=param)
    return [values[0]]
