"""What the MQTT bridge checks in its settings before it connects, and how it explains a connection that failed:
each problem phrased with the setting to fix."""

from __future__ import annotations

from pathlib import Path

import aiomqtt

from voice.config_servers import MQTTConfig
from voice.dialog.actions import check_allowed
from voice.transports.mqtt.payloads import template_fields


def check_settings(cfg: MQTTConfig, prefix: str, allowed: dict[str, list[str]]) -> None:
    """Raise ValueError, naming the key and the fix, for settings the bridge must not run with."""
    check_allowed(allowed)
    for topic in allowed:
        if topic.startswith((prefix + "/", cfg.discovery_prefix + "/")):
            raise ValueError(
                f"mqtt.allowed_actions[{topic!r}] would let the model command the assistant or "
                "Home Assistant discovery itself; fix: allow only device command topics"
            )
    for topic, template in cfg.events.items():
        try:
            template_fields(template)
        except ValueError as exc:
            raise ValueError(
                f"mqtt.events[{topic!r}]: the sentence {template!r} is not a valid template ({exc}); "
                "fix: write fields as {name} and a literal brace as {{ or }}"
            ) from None
    for key in ("ca_file", "cert_file", "key_file"):
        path = getattr(cfg, key)
        if cfg.tls and path and not Path(path).expanduser().is_file():
            raise ValueError(
                f"mqtt.{key} = {path!r} does not exist; fix: point it at a PEM file readable by "
                "the service (or unset it)"
            )


def explain(exc: aiomqtt.MqttError, cfg: MQTTConfig) -> str:
    """The connection error, with the setting to look at."""
    text = str(exc)
    lowered = text.lower()
    if "not authori" in lowered or "bad user" in lowered or "credentials" in lowered:
        return f"{text}; fix: check mqtt.username and mqtt.password (the broker refused them)"
    if "certificate" in lowered or "ssl" in lowered or "tls" in lowered:
        return f"{text}; fix: check mqtt.tls, mqtt.ca_file (the CA that signed the broker's certificate) and mqtt.host"
    if "refused" in lowered or "connect" in lowered or "errno" in lowered:
        return f"{text}; fix: check that the broker runs at mqtt.host:mqtt.port ({cfg.host}:{cfg.port})"
    return text
