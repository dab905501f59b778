"""One websocket connection of the Realtime API: client events in, Session calls out, Session events back.

One connection is one ``Session`` (its own conversation). Audio on the wire is ``audio/pcm``: 16-bit
little-endian mono at 24 kHz, base64 in JSON text frames; the connection converts it to the ears' 16 kHz and the
voice's audio to 24 kHz. The reply's audio goes out through a ``RealtimeSink``, whose heard port tells the turn
how much the client played: ``conversation.item.truncate`` when the client sends it (stock clients do after a
barge-in), else what a client playing in real time can have played by now, never more than was sent.

Why this protocol and not our own: its events already fit a voice turn, and existing SDKs and apps speak it.
Where we cannot honour a request the client gets one ``error`` event that says so; one event is ours,
``specvoice.latency``, with the turn's latency trace, right before its ``response.done``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from audio.frames import SPEECH_RATE
from audio.resample import resample
from voice.events import (ReplyTextDelta, SpeechStarted, SpeechStopped, TranscriptFinal, TranscriptPartial, TurnDone,
                          TurnError)
from voice.transports.common import Shared
from voice.transports.realtime_events import (WIRE_RATE, Append, ClientError, ClientEvent, ItemCreate,
                                              ResponseCancel, ResponseCreate, ResponseParams, SessionParams,
                                              SessionUpdate, Truncate, decode_pcm16, new_id, one_modality,
                                              parse_client_event)
from voice.transports.realtime_responses import Response, Responses, session_object
from voice.tasks import Tasks

log = logging.getLogger("specvoice.realtime")

MAX_PENDING_BYTES = 32 << 20  # a client that stops reading is closed before its queue grows past this
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TRY_AGAIN = 1000, 1001, 1008, 1013  # RFC 6455 close codes


class RealtimeSink:
    """The websocket as the session's speaker. ``write`` sends ``response.output_audio.delta`` events (at the
    wire rate) for the response in progress; ``heard_samples`` is what a client that plays the audio in real time
    from the first delta can have heard by now (the connection's truncate then caps it in the turn)."""

    def __init__(self, conn: RealtimeConnection, sample_rate: int) -> None:
        self.conn = conn
        self.sample_rate = sample_rate
        self.first_audible_t: float | None = None
        self.played_samples = 0

    def begin_utterance(self) -> None:
        self.first_audible_t, self.played_samples = None, 0

    async def write(self, samples: np.ndarray) -> None:
        if self.conn.responses.audio_delta(samples, self.sample_rate):
            if self.first_audible_t is None:
                self.first_audible_t = time.monotonic()
            self.played_samples += len(samples)

    def flush(self) -> None:
        """Nothing is queued here: what was sent is the client's (it stops playing on speech_started)."""

    async def drain(self) -> None:
        """The client plays at its own pace; the turn does not wait for it."""

    def heard_samples(self) -> int:
        if self.first_audible_t is None:
            return 0
        elapsed = int((time.monotonic() - self.first_audible_t) * self.sample_rate)
        return min(self.played_samples, elapsed)


class RealtimeConnection:
    """Translates one websocket's client events into Session calls, and Session events into server events."""

    def __init__(self, ws: ServerConnection, shared: Shared) -> None:
        self.ws = ws
        self.shared = shared
        self.config = shared.config
        self.id = new_id("sess")
        self.conversation_id = new_id("conv")
        self.modalities = ["audio"]
        self.sink = RealtimeSink(self, shared.assistant.tts_sample_rate)
        self.session = shared.assistant.session(self._on_event, sink=self.sink, name=self.id)
        self._out: asyncio.Queue[str | None] = asyncio.Queue()
        self._pending_bytes = 0
        self._stalled = False
        self._event_ids = itertools.count(1)
        self._input_samples = 0  # 24 kHz samples received, for audio_*_ms
        self._user_item: str | None = None  # the user item being spoken (server VAD)
        self._spoken_item: str | None = None  # the last user item the VAD committed
        self._partial_sent = ""
        self._speech_samples = 0  # 16 kHz samples of the utterance in progress
        self._manual_samples = 0  # 16 kHz samples waiting for input_audio_buffer.commit (no turn detection)
        self._inputs: list[asyncio.Task[str] | str] = []  # user inputs waiting for response.create
        self._responding: asyncio.Task[None] | None = None
        self._tasks = Tasks()
        self.responses = Responses(self.send, self.config, self.conversation_id)
        self.last_activity = time.monotonic()

    @property
    def server_vad(self) -> bool:
        return self.session.listener.endpointing

    # ---- wire out ------------------------------------------------------------------------------------------

    def send(self, kind: str, **fields: Any) -> None:
        message = json.dumps({"type": kind, "event_id": f"event_{self.id[5:13]}_{next(self._event_ids)}", **fields})
        if self._pending_bytes + len(message) > MAX_PENDING_BYTES:
            if not self._stalled:
                self._stalled = True
                log.warning("client does not read; closing", extra={"session": self.id})
                self._tasks.spawn(self.ws.close(CLOSE_POLICY, "client is not reading server events; closing"))
            return
        self._pending_bytes += len(message)
        self._out.put_nowait(message)

    def send_error(self, err: ClientError, kind: str = "invalid_request_error") -> None:
        self.shared.metrics.protocol_errors.labels("websocket", err.code).inc()
        self.send("error", error={"type": kind, "code": err.code, "message": err.message, "param": err.param,
                                  "event_id": err.event_id})

    async def _writer(self) -> None:
        while (message := await self._out.get()) is not None:
            self._pending_bytes -= len(message)
            await self.ws.send(message)

    # ---- lifecycle ------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A response or transcription is in progress (idle timeout and shutdown wait for it)."""
        return bool(self._tasks) or self.responses.current is not None or self.session.replying

    async def run(self) -> None:
        writer = asyncio.create_task(self._writer())
        self.send("session.created", session=session_object(self.config, self.id, self.modalities, self.server_vad))
        try:
            await self._read_loop()
        except ConnectionClosed:
            pass
        finally:
            await self._tasks.stop()
            await self.session.close()
            self._out.put_nowait(None)
            try:
                await asyncio.wait_for(writer, timeout=2.0)
            except (TimeoutError, ConnectionClosed):
                writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _read_loop(self) -> None:
        idle = self.config.server.idle_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(self.ws.recv(), timeout=idle)
            except TimeoutError:
                if self.busy or time.monotonic() - self.last_activity < idle:
                    continue
                await self.ws.close(CLOSE_NORMAL, f"idle for {idle:g} s (server.idle_timeout_s)")
                return
            self.last_activity = time.monotonic()
            try:
                await self.dispatch(parse_client_event(message))
            except ClientError as err:
                self.send_error(err)
            except Exception as exc:  # a bug must cost one event, not the session
                log.exception("event failed", extra={"session": self.id})
                self.send_error(ClientError("server_error", f"{type(exc).__name__}: {exc}"), kind="server_error")

    async def finish(self, grace: float) -> None:
        """Graceful shutdown: let the turn in progress end (up to ``grace`` s), then close with 1001."""
        deadline = time.monotonic() + grace
        while self.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.busy:
            if self.responses.current is not None:
                self.responses.current.cancel_reason = "client_cancelled"
            await self.session.cancel()
        await self.ws.close(CLOSE_GOING_AWAY, "server shutting down")

    # ---- client events --------------------------------------------------------------------------------------

    async def dispatch(self, event: ClientEvent) -> None:
        eid = event.event_id
        if isinstance(event, Append):
            await self._append(decode_pcm16(event.audio) if event.audio else np.zeros(0, np.int16), eid)
        elif isinstance(event, SessionUpdate):
            self._update(event.session)
            self.send("session.updated", session=session_object(self.config, self.id, self.modalities, self.server_vad))
        elif isinstance(event, ItemCreate):
            self._create_item(event)
        elif isinstance(event, Truncate):
            self._truncate(event)
        elif isinstance(event, ResponseCreate):
            self._create_response(event.response or ResponseParams(), eid)
        elif isinstance(event, ResponseCancel):
            await self._cancel(event.response_id, eid)
        elif event.type == "input_audio_buffer.commit":
            await self._commit(eid)
        elif event.type == "input_audio_buffer.clear":
            self._clear(eid)

    def _update(self, params: SessionParams) -> None:
        audio_in = params.audio.input if params.audio else None
        if audio_in is not None and "turn_detection" in audio_in.model_fields_set:
            on = audio_in.turn_detection is not None
            if on != self.server_vad:
                self.session.set_endpointing(on)
                self._manual_samples = 0
        if params.output_modalities is not None:
            self.modalities = one_modality(params.output_modalities, "session.output_modalities")
            self.session.speak_replies = "audio" in self.modalities

    async def _append(self, samples24: np.ndarray, eid: str | None) -> None:
        if not len(samples24):
            return
        self._input_samples += len(samples24)
        samples = resample(samples24, WIRE_RATE, SPEECH_RATE)
        limit_s = self.config.server.max_turn_audio_s
        if not self.server_vad:
            if (self._manual_samples + len(samples)) / SPEECH_RATE > limit_s:
                raise ClientError("input_audio_too_long", f"the input audio buffer would exceed {limit_s:g} s "
                                  "(server.max_turn_audio_s); commit or clear it first; this append was dropped",
                                  param="audio", event_id=eid)
            self._manual_samples += len(samples)
        elif self._user_item is not None:
            self._speech_samples += len(samples)
        await self.session.push_audio(samples)

    async def _commit(self, eid: str | None) -> None:
        if self.server_vad:
            if self._user_item is None or not await self.session.end_utterance():
                raise ClientError("input_audio_buffer_commit_empty", "no speech to commit: the server VAD has not "
                                  "heard speech (it commits turns by itself)", event_id=eid)
            return
        utterance = self.session.take_utterance()
        if utterance is None:
            raise ClientError("input_audio_buffer_commit_empty", "the input audio buffer is empty; append audio "
                              "before committing", event_id=eid)
        self._manual_samples = 0
        item_id = new_id("item")
        self._commit_user_item(item_id)

        async def transcribe() -> str:
            try:
                text = await utterance.final()
            except Exception as exc:
                log.warning("transcription failed", extra={"session": self.id, "error": str(exc)})
                self.send("conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                          error={"type": "transcription_error", "code": "stt_failed", "message": str(exc)})
                return ""
            self._transcribed(item_id, text, utterance.duration)
            return text

        task = self._tasks.spawn(transcribe())
        if task is not None:
            self._inputs.append(task)

    def _clear(self, eid: str | None) -> None:
        if self.server_vad and self._user_item is not None:
            raise ClientError("cannot_clear_speech", "the server VAD is hearing speech right now and will commit "
                              "it; set turn_detection to null for a buffer you control", event_id=eid)
        self.session.clear_audio()
        self._manual_samples = 0
        self.send("input_audio_buffer.cleared")

    def _create_item(self, event: ItemCreate) -> None:
        text = "".join(part.text for part in event.item.content).strip()
        if not text:
            raise ClientError("invalid_value", "the user message has no text", param="item.content",
                              event_id=event.event_id)
        item = {"id": event.item.id or new_id("item"), "object": "realtime.item", "type": "message",
                "role": "user", "status": "completed", "content": [{"type": "input_text", "text": text}]}
        self.send("conversation.item.added", previous_item_id=self.responses.last_item, item=item)
        self.send("conversation.item.done", previous_item_id=self.responses.last_item, item=item)
        self.responses.last_item = item["id"]
        self._inputs.append(text)

    def _truncate(self, event: Truncate) -> None:
        """The client played only ``audio_end_ms`` of an assistant item: the history keeps what it heard."""
        if event.item_id not in self.responses.replied_items:
            raise ClientError("item_not_found", f"no assistant item {event.item_id!r} to truncate; send the item_id "
                              "of an assistant message from response.output_item.added", param="item_id",
                              event_id=event.event_id)
        if event.audio_end_ms < 0:
            raise ClientError("invalid_value", "audio_end_ms must be >= 0", param="audio_end_ms",
                              event_id=event.event_id)
        if event.item_id == self.responses.replied_items[-1]:  # only the latest reply can still be cut
            self.session.truncate(event.audio_end_ms)
        self.send("conversation.item.truncated", item_id=event.item_id, content_index=event.content_index,
                  audio_end_ms=event.audio_end_ms)

    def _create_response(self, params: ResponseParams, eid: str | None) -> None:
        if self.responses.current is not None:
            raise ClientError("conversation_already_has_active_response", "a response is in progress; wait for "
                              "its response.done or send response.cancel", event_id=eid)
        if not self._inputs:
            raise ClientError("no_input", "nothing to answer: send conversation.item.create with a user message, "
                              "or commit input audio, before response.create", event_id=eid)
        modalities = (one_modality(params.output_modalities, "response.output_modalities")
                      if params.output_modalities is not None else list(self.modalities))
        inputs, self._inputs = self._inputs, []
        r = self.responses.open(modalities, params.metadata)
        self._responding = self._tasks.spawn(self._respond(r, inputs))

    async def _respond(self, r: Response, inputs: list[asyncio.Task[str] | str]) -> None:
        """Wait for the user's inputs (manual-mode transcriptions), then one text turn on the session."""
        texts = [(await x) if isinstance(x, asyncio.Task) else x for x in inputs]
        text = " ".join(t for t in texts if t).strip()
        if self.responses.current is not r:
            return
        if not text:
            self.responses.close("failed", error={"type": "invalid_request_error", "code": "no_input",
                                                  "message": "the committed audio transcribed to no words"})
            return
        try:
            await self.session.ask(text, speak="audio" in r.modalities)
        except Exception as exc:
            log.exception("text turn failed", extra={"session": self.id})
            if self.responses.current is r:
                self.responses.close("failed", error={"type": "server_error", "code": "turn_failed",
                                                      "message": f"{type(exc).__name__}: {exc}"})

    async def _cancel(self, response_id: str | None, eid: str | None) -> None:
        current = self.responses.current
        if current is None or (response_id is not None and response_id != current.id):
            raise ClientError("response_cancel_not_active", "there is no response in progress to cancel",
                              param="response_id" if response_id else None, event_id=eid)
        current.cancel_reason = "client_cancelled"
        await self.session.cancel()  # the turn's TurnDone(interrupted) closes the response
        if self.responses.current is current:  # the turn had not started (waiting for a transcription)
            if self._responding is not None:
                self._responding.cancel()
            self.responses.close("cancelled")

    # ---- session events -------------------------------------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        """Session -> wire. Called on the event loop, in order, for this session only."""
        if isinstance(event, SpeechStarted):
            self._user_item, self._partial_sent, self._speech_samples = new_id("item"), "", 0
            self.send("input_audio_buffer.speech_started", audio_start_ms=self._input_ms(),
                      item_id=self._user_item)
        elif isinstance(event, SpeechStopped):
            item_id = self._user_item or new_id("item")
            self._user_item = None
            self._spoken_item = item_id
            self.send("input_audio_buffer.speech_stopped", audio_end_ms=self._input_ms(), item_id=item_id)
            if event.cut:
                limit = self.config.server.max_turn_audio_s
                self.send_error(ClientError("input_audio_too_long", f"the utterance is longer than {limit:g} s "
                                            "(server.max_turn_audio_s); the turn was ended here"))
            self._commit_user_item(item_id)
        elif isinstance(event, TranscriptPartial):
            item_id = self._user_item or self._spoken_item
            # the Realtime API's deltas only append: send what extends the text already sent
            if item_id and event.text.startswith(self._partial_sent) and len(event.text) > len(self._partial_sent):
                delta, self._partial_sent = event.text[len(self._partial_sent):], event.text
                self.send("conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0,
                          delta=delta)
        elif isinstance(event, TranscriptFinal):
            item_id = self._spoken_item or new_id("item")
            self._transcribed(item_id, event.text, self._speech_samples / SPEECH_RATE)
            if event.text.strip() and self.responses.current is None:
                self.responses.open(list(self.modalities), None)
        elif isinstance(event, ReplyTextDelta):
            self.responses.text_delta(event.text)
        elif isinstance(event, TurnError):
            self.send_error(ClientError(f"{event.stage}_failed", f"the turn failed in {event.stage}: "
                                        f"{event.message}"), kind="server_error")
            if self.responses.current is not None:
                self.responses.close("failed", error={"type": "server_error", "code": f"{event.stage}_failed",
                                                      "message": event.message})
        elif isinstance(event, TurnDone):
            if self.responses.current is not None:
                status = "cancelled" if event.interrupted else "completed"
                self.responses.close(status, reply=event.reply, trace=event.trace)

    def _input_ms(self) -> int:
        return int(self._input_samples * 1000 / WIRE_RATE)

    def _commit_user_item(self, item_id: str) -> None:
        self.send("input_audio_buffer.committed", previous_item_id=self.responses.last_item, item_id=item_id)
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_audio", "transcript": None}]}
        self.send("conversation.item.added", previous_item_id=self.responses.last_item, item=item)
        self.responses.last_item = item_id

    def _transcribed(self, item_id: str, text: str, seconds: float) -> None:
        self.send("conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=0,
                  transcript=text, usage={"type": "duration", "seconds": round(seconds, 3)})
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_audio", "transcript": text}]}
        self.send("conversation.item.done", previous_item_id=None, item=item)
