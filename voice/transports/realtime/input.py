"""The input side of a Realtime connection: audio appends to the session's ears, and the user items they make.

With turn detection on (``server_vad``), the session's VAD decides: ``speech_started``, transcript deltas while
the user speaks, ``speech_stopped`` and the committed user item, then its transcript; the session answers by
itself. With it off, the client decides: appends fill a buffer (capped at ``server.max_turn_audio_s``),
``input_audio_buffer.commit`` makes it a user item whose transcript arrives when Whisper is done (at most
``MAX_TRANSCRIPTIONS`` at a time), and ``response.create`` answers. Audio comes in the session's input format
through one stream resampler (``AudioIn``), flushed at each manual commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from audio.frames import SPEECH_RATE
from voice.logs import RateLimitedLog
from voice.tasks import Tasks
from voice.transports.realtime.items import Entry, Items
from voice.transports.realtime.wire import AudioIn, ClientError, WireFormat, new_id

MAX_TRANSCRIPTIONS = 4  # committed buffers (manual turns) being transcribed at once, per connection
MIN_COMMIT_MS = 100  # a commit needs at least this much audio (as with OpenAI's)


class RealtimeInput:
    """Appends, commits and clears; and the user items of spoken turns (server VAD)."""

    def __init__(
        self,
        session: Any,
        items: Items,
        send: Callable[..., None],
        warnings: RateLimitedLog,
        tasks: Tasks,
        fmt: WireFormat,
        max_turn_audio_s: float,
    ) -> None:
        self.session, self.items, self.send, self.warnings, self.tasks = session, items, send, warnings, tasks
        self.audio = AudioIn(fmt)
        self.max_turn_audio_s = max_turn_audio_s
        self.user_item: str | None = None  # the user item being spoken (server VAD)
        self.spoken_item: str | None = None  # the last user item the VAD committed
        self._partial_sent = ""
        self._speech_samples = 0  # 16 kHz samples of the utterance in progress
        self._manual_samples = 0  # 16 kHz samples waiting for input_audio_buffer.commit (no turn detection)
        self._transcribing = 0

    @property
    def server_vad(self) -> bool:
        return bool(self.session.listener.endpointing)

    def set_turn_detection(self, on: bool) -> None:
        if on != self.server_vad:
            self.session.set_endpointing(on)  # drops the audio in progress
            self.audio.flush()
            self._manual_samples = 0

    async def append(self, audio: str) -> None:
        samples = self.audio.decode(audio)
        if not len(samples):
            return
        if not self.server_vad:
            limit_s = self.max_turn_audio_s
            if (self._manual_samples + len(samples)) / SPEECH_RATE > limit_s:
                raise ClientError(
                    "input_audio_too_long",
                    f"the input audio buffer would exceed {limit_s:g} s "
                    "(server.max_turn_audio_s); commit or clear it first; this append was dropped",
                    param="audio",
                )
            self._manual_samples += len(samples)
        elif self.user_item is not None:
            self._speech_samples += len(samples)
        await self.session.push_audio(samples)

    async def commit(self) -> None:
        if self.server_vad:
            if self.user_item is None or not await self.session.end_utterance():
                raise ClientError(
                    "input_audio_buffer_commit_empty",
                    "no speech to commit: the server VAD has not heard speech (it commits turns by itself)",
                )
            return
        tail = self.audio.flush()
        if len(tail):
            await self.session.push_audio(tail)
            self._manual_samples += len(tail)
        if self._manual_samples < SPEECH_RATE * MIN_COMMIT_MS // 1000:
            raise ClientError(
                "input_audio_buffer_commit_empty",
                f"the input audio buffer holds less than {MIN_COMMIT_MS} ms of audio; append audio before committing",
            )
        if self._transcribing >= MAX_TRANSCRIPTIONS:
            raise ClientError(
                "too_many_commits",
                f"{MAX_TRANSCRIPTIONS} committed buffers are still being "
                "transcribed; wait for their transcription events before committing more",
            )
        utterance = self.session.take_utterance()
        self._manual_samples = 0
        if utterance is None:
            raise ClientError(
                "input_audio_buffer_commit_empty", "the input audio buffer is empty; append audio before committing"
            )
        item_id = new_id("item")

        async def transcribe() -> str:
            try:
                text = await utterance.final()
            except Exception as exc:
                self.warnings.warning("transcription failed", error=str(exc)[:200])
                self.send(
                    "conversation.item.input_audio_transcription.failed",
                    item_id=item_id,
                    content_index=0,
                    error={"type": "transcription_error", "code": "stt_failed", "message": str(exc)},
                )
                return ""
            finally:
                self._transcribing -= 1
            self.transcribed(item_id, text, utterance.duration)
            return text

        task = self.tasks.spawn(transcribe())
        if task is not None:
            self._transcribing += 1
            task.add_done_callback(lambda _: self.items.settle())
        self.commit_user_item(item_id, task)

    def clear(self) -> None:
        if self.server_vad and self.user_item is not None:
            raise ClientError(
                "cannot_clear_speech",
                "the server VAD is hearing speech right now and will commit "
                "it; set turn_detection to null for a buffer you control",
            )
        self.audio.flush()
        self.session.clear_audio()
        self._manual_samples = 0
        self.send("input_audio_buffer.cleared")

    # ---- the VAD's events ------------------------------------------------------------------------------------

    def speech_started(self) -> None:
        self.user_item, self._partial_sent, self._speech_samples = new_id("item"), "", 0
        self.send("input_audio_buffer.speech_started", audio_start_ms=self.audio.received_ms, item_id=self.user_item)

    def speech_stopped(self, cut: bool) -> None:
        item_id = self.user_item or new_id("item")
        self.user_item, self.spoken_item = None, item_id
        self.send("input_audio_buffer.speech_stopped", audio_end_ms=self.audio.received_ms, item_id=item_id)
        if cut:
            self.warnings.warning("utterance cut at server.max_turn_audio_s")
        self.commit_user_item(item_id)

    def partial(self, text: str) -> None:
        item_id = self.user_item or self.spoken_item
        # the Realtime API's deltas only append: send what extends the text already sent
        if item_id and text.startswith(self._partial_sent) and len(text) > len(self._partial_sent):
            delta, self._partial_sent = text[len(self._partial_sent) :], text
            self.send(
                "conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0, delta=delta
            )

    def final(self, text: str) -> str:
        """The spoken turn's transcript; returns its item id."""
        item_id = self.spoken_item or new_id("item")
        self.transcribed(item_id, text, self._speech_samples / SPEECH_RATE)
        return item_id

    # ---- user items -----------------------------------------------------------------------------------------

    def commit_user_item(self, item_id: str, transcript: asyncio.Task[str] | None = None) -> None:
        entry = Entry(item_id, "message", "user", "input_audio", text=None)
        previous = self.items.add(entry, transcript=transcript)
        self.send("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id)
        self.send("conversation.item.added", previous_item_id=previous, item=entry.to_json())

    def transcribed(self, item_id: str, text: str, seconds: float) -> None:
        self.send(
            "conversation.item.input_audio_transcription.completed",
            item_id=item_id,
            content_index=0,
            transcript=text,
            usage={"type": "duration", "seconds": round(seconds, 3)},
        )
        entry = self.items.entries.get(item_id)
        if entry is not None:
            if entry.message is None:
                entry.text = text
            self.send("conversation.item.done", previous_item_id=None, item=entry.to_json())
