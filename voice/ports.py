"""The ports: what sessions and turns ask of the models and the speaker, written as types.

Each port is a ``Protocol``: an implementation conforms by its shape, never by inheriting, so llm/ and audio/
never import voice/. mypy checks every implementation where the assistant takes it (voice/assistant.py,
voice/remote/llm.py), so a session or a turn can only use what all of them have.

    port               implementations
    ChatEngine, Chat   llm/engine.py + llm/conversation.py (torch), llm/llamacpp_engine.py (llama.cpp, same
                       Conversation), llm/remote.py (an OpenAI-compatible server)
    SpeechRecognizer   voice/hearing/stt.py (faster-whisper), voice/remote/speech.py (a Wyoming asr server)
    SpeechSynthesizer  voice/speaking/tts.py (piper), voice/remote/speech.py (a Wyoming tts server)
    AudioSink          audio/sinks.py (speaker, WAV file), audio/shared_speaker.py, the transports' sinks

How one reply is decoded is plain data, the same for every engine: ``llm.settings.DecodeSettings``, not a port.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from audio.sinks import AudioSink
from llm.settings import HISTORY_TOKENS, DecodeSettings, DecodeStats, Emission

__all__ = [
    "AudioSink",
    "Chat",
    "ChatEngine",
    "LocalChat",
    "SpeechRecognizer",
    "SpeechSynthesizer",
    "Tool",
    "Transcription",
]

Tool = dict[str, Any]  # a function the model may call, in the chat template's form: {"type": "function", ...}


class Chat(Protocol):
    """One conversation's history and its replies (llm/history.py has the commit rules they share).

    A voice turn streams ``reply(..., commit=False)`` and then writes the exchange once: ``commit`` with the words
    the user heard, or ``discard`` (a reply started early on a guess). Every ``reply`` is an async generator: a
    turn closes it the moment it stops listening (``voice.dialog.turn.close_reply``), so the chat is free
    at once. Nothing else writes the history: a new system prompt, a message in the template's form (a tool
    call), a client's edits and a fresh start each have their method."""

    @property
    def messages(self) -> Sequence[dict[str, Any]]: ...  # read here; written only by the methods below
    @property
    def uncommitted(self) -> bool: ...
    @property
    def last_stats(self) -> DecodeStats | None: ...

    def reply(
        self, user_text: str | None, settings: DecodeSettings | None = None, *, commit: bool = True
    ) -> AsyncIterator[Emission]: ...
    def commit(self, heard_text: str) -> None: ...
    def discard(self) -> None: ...
    def trim_last_reply(self, spoken_text: str) -> None: ...
    def set_system(self, prompt: str) -> None: ...
    def add(self, message: dict[str, Any]) -> None: ...
    def insert(self, message: dict[str, Any], after: dict[str, Any] | None = None) -> None: ...
    def remove(self, message: dict[str, Any]) -> bool: ...
    def forget(self) -> None: ...
    async def warm(self, user_start: str = "", yield_to: Callable[[], Awaitable[None]] | None = None) -> int: ...


@runtime_checkable
class LocalChat(Chat, Protocol):
    """A chat whose prompt this process builds from its chat template (the local engines, not a server): it can
    be given ``tools`` in the template's form, and its next reply can be ``constrain``-ed to choices after a
    trigger (llm/constrain.py). A session checks for it once, where it builds its chat."""

    tools: list[Tool] | None

    def constrain(self, trigger: str, choices: list[str], opening: Sequence[str] = ()) -> object: ...


class ChatEngine(Protocol):
    """An LLM that holds conversations: loaded once by the assistant, one ``Chat`` per session. ``concurrent``:
    it schedules many sessions' replies itself (a server), so the assistant does not queue them."""

    concurrent: bool

    def conversation(self, system_prompt: str, history_tokens: int = HISTORY_TOKENS) -> Chat: ...


class Transcription(Protocol):
    """One utterance being transcribed: ``add`` audio (int16, 16 kHz) as it arrives, ``partial`` now and then
    while the user speaks, ``final`` once at the end of the turn."""

    final_decoded: bool | None  # did final() need its own pass (None: not asked yet); for benchmarks

    @property
    def duration(self) -> float: ...
    @property
    def elapsed(self) -> float: ...
    @property
    def committed(self) -> str: ...
    @property
    def text(self) -> str: ...

    def add(self, samples: np.ndarray) -> None: ...
    def text_before(self, t: float) -> str: ...
    def nothing_new(self) -> bool: ...
    async def partial(
        self, *, style: str | None = None, final_beam: bool = False, min_new_s: float = ...
    ) -> str | None: ...
    async def final(self) -> str: ...
    async def fits(self, texts: Sequence[str]) -> list[float] | None: ...


class SpeechRecognizer(Protocol):
    """Speech to text: a ``Transcription`` per utterance, or a whole clip at once."""

    def stream(self) -> Transcription: ...
    async def transcribe(self, samples: np.ndarray) -> str: ...


@runtime_checkable
class SpeechSynthesizer(Protocol):
    """Text to speech. Why a port: piper-tts is GPL-3.0 while specvoice is Apache-2.0, so a permissively licensed
    engine must be able to take its place by implementing these four members, with no change to sessions, turns
    or transports.

    ``stream`` yields int16 mono PCM chunks at ``sample_rate`` as they are ready and stops at its next chunk
    when closed or cancelled (barge-in); ``synthesize`` is the blocking whole-text form (WAV demos, benchmarks);
    ``language`` is what Wyoming and Home Assistant are told (e.g. "en_US", "und" when unknown)."""

    sample_rate: int
    language: str

    def stream(self, fragment: str) -> AsyncIterator[np.ndarray]: ...

    def synthesize(self, text: str, stop: threading.Event | None = None) -> Iterable[np.ndarray]: ...
