"""A device of the named home (``mqtt.devices``), as the matcher and the prompt see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HomeDevice:
    """One device the assistant may command: ``payloads`` are the allow-list for ``topic``. ``domain`` is Home
    Assistant's (light, switch, cover, lock, ...): what "turn on" means for it and what "the lights" selects."""

    name: str
    topic: str
    payloads: tuple[str, ...]
    area: str | None = None
    state_topic: str | None = None
    domain: str = "switch"
    aliases: tuple[str, ...] = ()
    floor: str | None = None
    device_class: str | None = None  # a cover's kind, as Home Assistant names them: blind, door, awning, ...
