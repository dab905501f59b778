"""What every turn of a session works with (``TurnContext``, built once by the session), and the user's words as
the model gets them (``asked``): the home's reading of them, and the constrained decode it sets up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from llm.settings import DecodeSettings
from voice.config import TTSConfig
from voice.dialog.actions import KEYWORD
from voice.dialog.home import Home, marker_choices
from voice.events import Event, State
from voice.latency import LatencyStats
from voice.ports import AudioSink, Chat, LocalChat, SpeechSynthesizer, Tool
from voice.speaking.chunker import Chunker


@dataclass
class TurnContext:
    """What every turn of one session speaks with; built once by the session."""

    conversation: Chat
    decode: DecodeSettings
    tts: SpeechSynthesizer
    tts_config: TTSConfig
    sink: AudioSink | None  # None: the audio goes nowhere but in ReplyAudio events
    emit: Callable[[Event], None]
    set_state: Callable[[State], None]
    generation_lock: asyncio.Lock  # one generation at a time across sessions, first come first served
    stats: LatencyStats
    turn_timeout_s: float
    stt_timeout_s: float
    allowed_actions: dict[str, list[str]]
    home: Home | None = None  # named devices: grounds the reply's actions, shows state when asked
    resolve_device: Callable[[str], str] | None = None  # actions as control_device calls (name -> topic); None: markers
    constrained: bool = False  # markers whose command is a constrained decode (mqtt.action_format = "constrained")
    local: LocalChat | None = None  # the conversation, when its prompt is built here (it can be constrained)
    session_id: str = ""
    warm: Callable[[], None] = lambda: None  # prefill the history while nobody waits (the session's warm-up)
    tools: list[Tool] | None = None  # functions the model may call (Session.set_tools): not spoken

    def chunker(self) -> Chunker:
        return Chunker.from_config(self.tts_config)


def asked(ctx: TurnContext, text: str, spoken: bool) -> str | None:
    """The user's words as the model gets them: with the state of the devices asked about, when they ask. In the
    constrained format, after "[ACTION" the reply can then only go on with a command the grounding would let
    through, and a command the words decide alone opens it (``marker_choices``); a remote model has no
    ``constrain`` (it is no ``LocalChat``)."""
    if ctx.constrained and ctx.allowed_actions and ctx.local is not None:
        ctx.local.constrain(f"[{KEYWORD}", *marker_choices(ctx.home, text, ctx.conversation.messages, spoken))
    return (ctx.home.annotate(text, ctx.conversation.messages, spoken) if ctx.home is not None else text) or None
