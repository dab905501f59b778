"""What a session tells the outside world. Plain dataclasses, so every transport (websocket, Wyoming, MQTT,
the desktop UI) can turn them into its own wire format without knowing the pipeline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np


class State(StrEnum):
    IDLE = "idle"
    LISTENING = "listening"
    THINKING = "thinking"
    SPEAKING = "speaking"


@dataclass
class StateChanged:
    state: State


@dataclass
class SpeechStarted:
    t: float  # monotonic seconds


@dataclass
class SpeechStopped:
    t: float
    cut: bool = False  # the utterance hit the length limit (server.max_turn_audio_s) and was ended there


@dataclass
class TranscriptPartial:
    text: str  # the whole partial transcript so far (committed + tentative)
    committed: str = ""  # the part of it that will not change any more


@dataclass
class PauseHeard:
    """The user paused, and the transcript so far covers all their speech: a likely end of turn."""

    text: str


@dataclass
class SpeechResumed:
    """The user went on speaking after a PauseHeard: the pause was not the end of the turn."""


@dataclass
class TranscriptFinal:
    text: str


@dataclass
class ReplyTextDelta:
    text: str  # newly accepted text, as the decoder emits it


@dataclass
class ReplyAudio:
    samples: np.ndarray  # int16 mono
    sample_rate: int


@dataclass
class ActionRequested:
    """The LLM asked for a home action; ``allowed`` says whether the allow-list let it through."""

    topic: str
    payload: str
    allowed: bool
    reason: str = ""


@dataclass
class ToolCallRequested:
    """The LLM called a function the client declared (``arguments``: JSON text); the client runs it."""

    name: str
    arguments: str


@dataclass
class TurnDone:
    turn_id: int
    transcript: str
    reply: str  # what was actually spoken/kept (trimmed after barge-in)
    interrupted: bool
    trace: dict[str, Any] = field(default_factory=dict)  # LatencyTrace.to_dict()


@dataclass
class TurnError:
    turn_id: int
    stage: str
    message: str


Event = (
    StateChanged
    | SpeechStarted
    | SpeechStopped
    | TranscriptPartial
    | TranscriptFinal
    | ReplyTextDelta
    | ReplyAudio
    | ActionRequested
    | ToolCallRequested
    | TurnDone
    | TurnError
    | PauseHeard
    | SpeechResumed
)
EventHandler = Callable[[Event], None]
