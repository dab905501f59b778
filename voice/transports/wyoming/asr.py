"""The Wyoming asr service for one connection: ``audio-start``, ``audio-chunk``... ``audio-stop`` through a
Listener (no endpointing: the client says when the audio stops), with ``transcript-chunk`` events as the words
become stable while the audio still arrives, and the final ``transcript``.

Any rate/width/channels a client declares (within reason) is converted to 16 kHz mono. What a client gets
wrong is raised as ``Refused`` (the handler answers it with an ``error`` event; the connection goes on).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from wyoming.asr import Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart
from wyoming.event import Event

from audio.frames import SPEECH_RATE
from voice.events import TranscriptPartial
from voice.hearing.listener import Listener
from voice.transports.wyoming.io import Refused


class AsrStream:
    """One connection's transcription requests, one at a time. ``write`` sends an event to the client."""

    def __init__(
        self, new_listener: Callable[[], Listener], max_audio_s: float, write: Callable[[Event], Awaitable[None]]
    ) -> None:
        self._new_listener, self.max_audio_s, self._write = new_listener, max_audio_s, write
        self._listener: Listener | None = None
        self._converter: AudioChunkConverter | None = None
        self._seconds = 0.0
        self._sent = ""  # transcript text already sent as chunks
        self._started = False  # transcript-start sent
        self.language: str | None = None  # from ``transcribe``, echoed in the transcript

    async def start(self, start: AudioStart) -> None:
        check_format(start.rate, start.width, start.channels)
        await self.close()
        self._converter = AudioChunkConverter(rate=SPEECH_RATE, width=2, channels=1)
        self._listener = self._new_listener()
        self._seconds, self._sent, self._started = 0.0, "", False

    async def chunk(self, chunk: AudioChunk) -> None:
        if self._listener is None or self._converter is None:
            raise Refused(
                "audio-chunk before audio-start; send audio-start with rate, width and channels first", "no_audio_start"
            )
        check_format(chunk.rate, chunk.width, chunk.channels)
        if len(chunk.audio) % (chunk.width * chunk.channels):
            raise Refused(
                f"audio-chunk of {len(chunk.audio)} bytes is not a whole number of "
                f"{chunk.width * chunk.channels}-byte frames",
                "bad_audio_format",
            )
        self._seconds += chunk.seconds
        if self._seconds > self.max_audio_s:
            await self.close()
            raise Refused(
                f"more than {self.max_audio_s:g} s of audio in one request (server.max_turn_audio_s); "
                "the request was dropped",
                "audio_too_long",
            )
        converted = self._converter.convert(chunk)
        try:
            events = await self._listener.accept_chunk(np.frombuffer(converted.audio, dtype="<i2").astype(np.int16))
        except Exception as exc:
            await self.close()
            raise Refused(f"speech recognition failed: {type(exc).__name__}: {exc}", "stt_failed") from None
        for event in events:
            if isinstance(event, TranscriptPartial):
                await self._send_chunk(event.committed)

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            raise Refused("audio-stop without audio-start", "no_audio_start")
        try:
            text = await listener.finish()
        except Exception as exc:
            await listener.close()
            raise Refused(f"speech recognition failed: {type(exc).__name__}: {exc}", "stt_failed") from None
        await self._send_chunk(text)
        await self._write(Transcript(text, language=self.language).event())
        await self._write(TranscriptStop().event())

    async def _send_chunk(self, text: str) -> None:
        if not self._started:
            self._started = True
            await self._write(TranscriptStart(language=self.language).event())
        if text.startswith(self._sent) and len(text) > len(self._sent):
            piece, self._sent = text[len(self._sent) :], text
            await self._write(TranscriptChunk(piece).event())

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()


def check_format(rate: Any, width: Any, channels: Any) -> None:
    """Refuse audio we cannot convert (JSON ``true`` is not a width)."""
    if type(rate) is not int or not 8000 <= rate <= 96000:
        raise Refused(
            f"unsupported sample rate {rate!r:.40}; send 8000..96000 Hz (16000 is native)", "bad_audio_format"
        )
    if type(width) is not int or width not in (1, 2, 4):
        raise Refused(f"unsupported sample width {width!r:.40} bytes; send 2 (16-bit PCM)", "bad_audio_format")
    if type(channels) is not int or channels not in (1, 2):
        raise Refused(f"unsupported channel count {channels!r:.40}; send mono (1) or stereo (2)", "bad_audio_format")
