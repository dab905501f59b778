"""The servers' config sections: websocket ([server]), Wyoming ([wyoming]) and the MQTT bridge ([mqtt]).

Kept apart from voice/config.py (the models, audio and turn-taking sections, loading and overrides) so that each
file stays readable; ``voice.config`` re-exports these classes.
"""

from __future__ import annotations

import re
import socket
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from voice.dialog.wording import words


class Section(BaseModel):
    """The base of every config section (here and in voice/config.py): unknown keys are errors, assignments are
    validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


_Section = Section


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    token: str | None = None
    max_message_bytes: int = Field(1 << 20, ge=1024)
    max_turn_audio_s: float = Field(60.0, gt=0)
    max_sessions: int = Field(16, ge=1)
    idle_timeout_s: float = Field(300.0, gt=0)
    metrics_port: int | None = Field(None, ge=0, le=65535, description="extra /metrics listener on 127.0.0.1")
    shutdown_grace_s: float = Field(10.0, ge=0, description="on SIGTERM, turns in progress get this long to finish")
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="browser origins (scheme://host[:port]) that may open the websocket "
        "besides the server's own page, e.g. ['https://home.example.com']",
    )
    max_text_chars: int = Field(
        16384,
        ge=256,
        le=1 << 20,
        description="longest text in one websocket field (a message, instructions, a tool's output)",
    )
    max_items: int = Field(512, ge=16, description="conversation items a websocket session keeps (oldest dropped)")

    @model_validator(mode="after")
    def _origins(self) -> ServerConfig:
        for origin in self.allowed_origins:
            scheme, sep, rest = origin.partition("://")
            if scheme not in ("http", "https") or not sep or not rest or "/" in rest or origin != origin.strip():
                raise ValueError(
                    f"server.allowed_origins: {origin!r} is not an origin; fix: write it as a browser "
                    "sends it, scheme://host[:port] with no path, e.g. 'https://home.example.com'"
                )
        return self


class WyomingConfig(_Section):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(10300, ge=0, le=65535)
    zeroconf: bool = False
    allowed_clients: list[str] = Field(
        default_factory=list,
        description="IPs/networks allowed to connect; required when host is not loopback "
        "(Wyoming has no tokens), e.g. ['192.168.1.0/24']",
    )
    read_timeout_s: float = Field(
        2.0,
        gt=0,
        description="an event must arrive whole (header, data, payload) "
        "within this long after its first byte; a LAN sends one in milliseconds",
    )
    write_timeout_s: float = Field(10.0, gt=0, description="a client that reads nothing for this long is dropped")
    max_conversations: int = Field(
        16,
        ge=1,
        description="handle service: conversation ids remembered at once (least recently used forgotten first)",
    )
    conversation_idle_s: float = Field(
        300.0, gt=0, description="handle service: a conversation id is forgotten this long after its last turn"
    )


def host_name() -> str:
    """This machine's short name, usable in an MQTT client id and a Home Assistant node id: two devices on one
    broker must not share either (a shared client id makes the broker disconnect one for the other)."""
    name = re.sub(r"[^a-z0-9_-]+", "-", socket.gethostname().split(".")[0].lower()).strip("-_")
    return name[:40] or "host"


_IDENTIFIERS = {  # field -> (pattern, what it is, the characters allowed, its default)
    "node_id": (
        re.compile(r"[A-Za-z0-9_-]{1,64}"),
        "a valid Home Assistant node id",
        "letters, digits, '_' or '-'",
        "this host's name",
    ),
    "client_id": (
        re.compile(r"[A-Za-z0-9_.:-]{1,64}"),
        "a usable MQTT client id",
        "letters, digits, '_', '-', '.' or ':'",
        "specvoice-<host name>",
    ),
}


class HomeDeviceConfig(_Section):
    """A named device (``[[mqtt.devices]]``): the model sees its name and area, and may command its topic."""

    name: str = Field(min_length=1, description="as a user says it, e.g. 'kitchen light'")
    topic: str = Field(min_length=1, description="the command topic, e.g. 'home/kitchen/light/set'")
    payloads: list[str] = Field(min_length=1, description="the allowed commands, e.g. ['ON', 'OFF']")
    area: str | None = Field(None, description="the room, e.g. 'kitchen'")
    state_topic: str | None = Field(None, description="where the device reports its state (read, never written)")
    aliases: list[str] = Field(default_factory=list, description="other names people use, e.g. ['ceiling lamp']")
    floor: str | None = Field(None, description="the floor its area is on, e.g. 'upstairs'")
    domain: Literal["light", "switch", "fan", "cover", "lock", "climate", "media_player", "valve", "vacuum", None] = (
        Field(
            None,
            description="Home Assistant's domain: what 'turn on' means for it and what 'the lights' selects; default: "
            "a topic level that names a domain, else what its payloads can do",
        )
    )
    device_class: str | None = Field(
        None, description="a cover's class (blind, curtain, door, awning, ...); default: the one its name says"
    )


class MQTTConfig(_Section):
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(1883, ge=0, le=65535)
    username: str | None = None
    password: str | None = Field(None, description="better a systemd credential (LoadCredential=mqtt.password)")
    tls: bool = False
    ca_file: str | None = None
    client_id: str = Field(
        default_factory=lambda: f"specvoice-{host_name()}",
        description="unique per device; default: specvoice-<host name>",
    )
    prefix: str = "specvoice"
    discovery_prefix: str = "homeassistant"
    node_id: str = Field(default_factory=host_name, description="Home Assistant node id; default: the host name")
    allowed_actions: dict[str, list[str]] = Field(
        default_factory=dict, description="topic -> allowed payloads, e.g. {'home/kitchen/light/set' = ['ON','OFF']}"
    )
    devices: list[HomeDeviceConfig] = Field(
        default_factory=list,
        description="named devices by area (the assistant's home): their topics join the allow-list, and "
        "their state topics are followed to answer questions about state",
    )
    area: str | None = Field(
        None, description="the area this assistant stands in, for 'turn on the light here' (an area of the devices)"
    )
    action_format: Literal["markers", "tools", "constrained"] = Field(
        "constrained",
        description="how the model asks for an action: 'constrained' ([ACTION topic payload] markers in the reply, "
        "and after '[ACTION' only a command for a device the user's words name can be decoded; a remote model "
        "writes plain markers), 'markers' (the same, unconstrained) or 'tools' (a control_device call through "
        "the chat template, Hermes <tool_call> syntax; local model). All pass the same allow-list and grounding; "
        "`specvoice bench home --format` compares them",
    )
    events: dict[str, str] = Field(
        default_factory=dict, description="trigger topic -> sentence template, e.g. '{name} is at the door'"
    )
    cert_file: str | None = Field(None, description="TLS client certificate (PEM), when the broker asks for one")
    key_file: str | None = Field(None, description="TLS client key (PEM) for cert_file")
    keepalive_s: int = Field(30, ge=5, le=3600)
    reconnect_min_s: float = Field(1.0, gt=0, description="first wait before reconnecting; doubles up to the max")
    reconnect_max_s: float = Field(60.0, gt=0)
    command_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="a home command the broker has not taken within this time is never sent, and the user is told",
    )
    discovery: bool = Field(True, description="publish Home Assistant discovery configs")
    publish_turns: Literal["local", "all", "none"] = Field(
        "local",
        description="whose state, transcripts and replies are published: 'local' = MQTT-originated and "
        "the local device's turns, 'all' = every transport's (websocket and Wyoming too)",
    )
    retain_results: bool = Field(False, description="retain transcript and reply (anyone who subscribes reads them)")
    max_queued_commands: int = Field(8, ge=1, le=1000, description="say/ask/events waiting; more are refused")
    max_conversations: int = Field(8, ge=1, le=256, description="ask conversations kept (by conversation_id)")
    conversation_idle_s: float = Field(900.0, gt=0, description="an ask conversation idle this long starts afresh")
    max_packet_bytes: int = Field(
        256 * 1024, ge=1024, le=268_435_455, description="the broker's maximum packet size; bigger messages are skipped"
    )

    @property
    def allow_list(self) -> dict[str, list[str]]:
        """Every command the model may ask for: ``allowed_actions`` and the devices' topics (one owner for both
        the session's parser and the bridge's own check)."""
        allowed = {topic: list(payloads) for topic, payloads in self.allowed_actions.items()}
        allowed.update({d.topic: list(d.payloads) for d in self.devices})
        return allowed

    @field_validator("node_id", "client_id")
    @classmethod
    def _identifier(cls, value: str, info: Any) -> str:
        pattern, what, allowed, default = _IDENTIFIERS[info.field_name]
        if not pattern.fullmatch(value):
            raise ValueError(
                f"{value!r} is not {what}; fix: use 1-64 {allowed}, unique per device (default: {default})"
            )
        return value

    @field_validator("prefix", "discovery_prefix")
    @classmethod
    def _topic_prefix(cls, value: str) -> str:
        if not value.strip("/") or any(c in value for c in "+#\0") or value != value.strip().strip("/"):
            raise ValueError(
                f"topic prefix {value!r} is not usable; fix: a topic without wildcards (+ #) or "
                "leading/trailing '/', e.g. 'specvoice' or 'home/kitchen/voice'"
            )
        return value

    @model_validator(mode="after")
    def _usable(self) -> MQTTConfig:
        from voice.dialog.actions import check_allowed  # late: actions imports events only, but keep config light

        check_allowed(self.allowed_actions)
        seen: set[str] = set()
        for i, device in enumerate(self.devices):
            where = f"mqtt.devices[{i}] ({device.name!r})"
            if device.topic in seen:
                raise ValueError(f"{where}: topic {device.topic!r} is listed twice; fix: one device per topic")
            seen.add(device.topic)
            listed = self.allowed_actions.get(device.topic)
            if listed is not None and listed != device.payloads:
                raise ValueError(
                    f"{where}: topic {device.topic!r} is also in mqtt.allowed_actions with other payloads; "
                    "fix: list it in one place only"
                )
            try:
                check_allowed({device.topic: device.payloads})
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            for payload in device.payloads:
                if not words(payload):  # the grounding sends a value only when the user's words ask for it
                    raise ValueError(
                        f"{where}: payload {payload!r} has no letter or digit, so no words can ask for it and it "
                        "would always be refused; fix: a payload with a word or number (e.g. 'ON', '50'), or the "
                        "topic in mqtt.allowed_actions without a name"
                    )
            if device.state_topic is not None and any(c in device.state_topic for c in "+#\0 "):
                raise ValueError(
                    f"{where}: state_topic {device.state_topic!r} must be a plain topic without spaces or "
                    "wildcards (+ #); fix: name the exact topic the device reports its state on"
                )
        areas = sorted({d.area for d in self.devices if d.area})
        if self.area is not None and self.area not in areas:
            raise ValueError(f"mqtt.area {self.area!r} is no device's area; fix: one of {areas}, or leave it out")
        for topic, template in self.events.items():
            if not topic.strip() or not template.strip():
                raise ValueError(
                    f"mqtt.events[{topic!r}] needs a topic and a sentence; fix: e.g. "
                    "'home/doorbell' = '{name} is at the door'"
                )
        if self.key_file and not self.cert_file:
            raise ValueError("mqtt.key_file is set without mqtt.cert_file; fix: set both, or neither")
        return self
