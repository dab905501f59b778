"""What every transport shares: the session budget, the loopback rule, and the shared pieces of a server.

Transports only translate a wire format into Session calls (``push_audio``, ``ask``, ``say``, ``cancel``); the
rules that must be the same everywhere live here, once.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from voice.metrics import Metrics


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, "localhost")."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def package_version() -> str:
    try:
        return version("specvoice")
    except PackageNotFoundError:
        return "0"


class SessionSlots:
    """The ``server.max_sessions`` budget, shared by every transport (websocket and Wyoming connections)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def acquire(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def release(self) -> None:
        self.used = max(0, self.used - 1)


@dataclass
class Shared:
    """What the servers of one ``serve`` share: the loaded assistant, the metrics and the session budget."""

    config: Any  # voice.config.Config
    assistant: Any  # voice.assistant.Assistant
    metrics: Metrics
    slots: SessionSlots
