"""What a session needs from the assistant that holds the models and owns the sessions."""

from __future__ import annotations

import asyncio
from typing import Protocol

from llm.settings import DecodeSettings
from voice.config import Config
from voice.dialog.home import Home
from voice.events import Event
from voice.hearing.listener import Listener
from voice.latency import LatencyStats
from voice.ports import ChatEngine, SpeechSynthesizer
from voice.tasks import Job


class Host(Protocol):
    """What a session needs from the assistant that holds the models (voice.assistant.Assistant)."""

    config: Config
    engine: ChatEngine
    tts: SpeechSynthesizer
    stats: LatencyStats
    home: Home | None  # the named devices and their state (mqtt.devices); None: none named

    @property
    def generation_lock(self) -> asyncio.Lock: ...
    def listener(self, *, endpointing: bool = True) -> Listener: ...
    def decode_settings(self, **overrides: object) -> DecodeSettings: ...
    def broadcast(self, session_id: str, event: Event) -> None: ...
    def spawn(self, job: Job) -> asyncio.Task[object] | None: ...
