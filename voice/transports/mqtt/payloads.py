"""The MQTT bridge's wire format: topics under the prefix, command payloads, trigger templates.

Every payload a client can send is decoded and validated here, with an error that names the problem and the
fix (the bridge publishes it on ``<p>/error``); nothing here talks to a broker.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any

MAX_PAYLOAD_BYTES = 16 * 1024
MAX_TEXT_CHARS = 1000
_CONVERSATION_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")


class PayloadError(ValueError):
    """A command payload we cannot use; the message names the problem and the fix (sent on <p>/error)."""


class Priority(IntEnum):
    """Which messages wait ahead of which in the outbox, and which go first when it is full."""

    COMMAND = 0  # home actions: a person waits on them, so they go first and are never dropped (home_commands.py)
    CONTROL = 1  # availability, state, discovery: only the latest per topic matters, so they never pile up
    RESULT = 2  # answers, spoken, action notices, transcripts, replies, events: what a home automation acts on
    TELEMETRY = 3  # per-turn traces, latency, error reports: the first to be dropped


@dataclass(eq=False)  # identity: the outbox removes exactly the message it published
class Outgoing:
    topic: str
    payload: str
    retain: bool = False
    priority: Priority = Priority.RESULT

    @property
    def packet_bytes(self) -> int:
        """The PUBLISH packet's size (QoS 1): fixed header, topic, packet id, payload (MQTT 3.1.1, 3.3)."""
        rest = 2 + len(self.topic.encode()) + 2 + len(self.payload.encode())
        return 1 + (1 if rest < 128 else 2 if rest < 16384 else 3 if rest < 2097152 else 4) + rest


@dataclass
class Command:
    kind: str  # "say" or "ask"
    text: str
    source: str  # the topic it came from
    id: Any = None
    speak: bool = True
    conversation: str | None = None  # ask: the conversation_id whose history it continues (None: a fresh one)


@dataclass(frozen=True)
class Topics:
    """Every topic under ``mqtt.prefix``: ``Topics.under("specvoice").say == "specvoice/say"``."""

    say: str
    ask: str
    cancel: str
    availability: str
    state: str
    transcript: str
    reply: str
    latency: str
    turn: str
    answer: str
    spoken: str
    action: str
    error: str
    event: str

    @classmethod
    def under(cls, prefix: str) -> Topics:
        return cls(**{f.name: f"{prefix}/{f.name}" for f in fields(cls)})


# ---- payloads ---------------------------------------------------------------------------------------------------


def decode_payload(payload: bytes | bytearray | str | None) -> str:
    if payload is None:
        return ""
    if isinstance(payload, str):
        return payload
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise PayloadError(
            f"payload of {len(payload)} bytes is over the {MAX_PAYLOAD_BYTES} byte limit; fix: send a shorter text"
        )
    try:
        return bytes(payload).decode("utf-8")
    except UnicodeDecodeError:
        raise PayloadError("payload is not UTF-8 text; fix: send UTF-8 text or a JSON object") from None


def parse_json_object(text: str) -> dict[str, Any] | None:
    """A payload that starts with '{' is JSON and must be a valid object; anything else is plain text (None)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError(
            f"invalid JSON ({exc.msg} at character {exc.pos}); fix: send valid JSON such as "
            '{"text": "hello"}, or plain text that does not start with "{"'
        ) from None
    except RecursionError:
        raise PayloadError('JSON nested too deeply; fix: send a flat object such as {"text": "hello"}') from None
    return data  # text that starts with "{" and parses is always an object


def parse_text_command(payload, *, fields: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """Plain text, or a JSON object with "text" and the optional ``fields``; returns the validated fields."""
    raw = decode_payload(payload)
    data = parse_json_object(raw)
    if data is None:
        data = {"text": raw}
    unknown = sorted(set(data) - {"text"} - set(fields))
    if unknown:
        known = ", ".join(["text", *fields])
        raise PayloadError(f"unknown field(s) {', '.join(map(repr, unknown))}; fix: use only {known}")
    text = data.get("text")
    if text is not None and not isinstance(text, str):
        raise PayloadError(f"field 'text' must be a string, got {type(text).__name__}; fix: send it as text")
    if not text or not text.strip():
        raise PayloadError('no text to use; fix: send the text itself, or {"text": "..."} with a non-empty string')
    if len(text) > MAX_TEXT_CHARS:
        raise PayloadError(f"text of {len(text)} characters is over the {MAX_TEXT_CHARS} limit; fix: send less")
    for name, kind in fields.items():
        if name in data and not isinstance(data[name], kind):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise PayloadError(f"field {name!r} must be {names}, got {type(data[name]).__name__}; fix: correct it")
    return {**data, "text": text.strip()}


def parse_ask(payload) -> Command:
    """An ask: plain text, or {"text", "id", "speak", "conversation_id"}. Without a conversation_id the question
    starts a fresh conversation, so no asker reads another's history."""
    data = parse_text_command(payload, fields={"id": (str, int), "speak": bool, "conversation_id": (str, int)})
    conversation = data.get("conversation_id")
    if conversation is not None:
        conversation = str(conversation)
        if not _CONVERSATION_ID.fullmatch(conversation):
            raise PayloadError(
                f"conversation_id {conversation[:80]!r} is not usable; fix: 1-64 letters, digits or "
                "'_', '-', '.', ':', '@'"
            )
    return Command("ask", data["text"], "", data.get("id"), data.get("speak", True), conversation)


def template_fields(template: str) -> list[str]:
    """The field names a sentence template uses; raises ValueError for a malformed template."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def render_event(template: str, topic: str, payload) -> str:
    """Fill a trigger's sentence template from the payload: JSON fields, {payload} (raw text) and {topic}."""
    raw = decode_payload(payload).strip()
    data = parse_json_object(raw) or {}
    values = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool))}
    values.update(payload=raw, topic=topic)
    for name in template_fields(template):
        key = name.split(".")[0].split("[")[0]
        if key not in values:
            raise PayloadError(
                f"the sentence {template!r} needs the field {key!r}; fix: send it in a JSON "
                f'object, e.g. {{"{key}": "..."}}'
            )
    try:
        sentence = template.format_map(values).strip()
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise PayloadError(
            f"cannot fill the sentence {template!r} from this payload ({exc}); fix: send plain values for its fields"
        ) from None
    if not sentence:
        raise PayloadError("the announcement would be empty; fix: send the fields the sentence uses")
    return sentence[:MAX_TEXT_CHARS]
