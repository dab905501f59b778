"""One websocket connection of the Realtime API: client events in, Session calls out, Session events back.

One connection is one ``Session`` (its own conversation). Input audio (``audio/pcm`` at 24 kHz by default, or
G.711) goes through one stream resampler to the ears' 16 kHz; each response's audio through one of its own to
the wire. The reply's audio goes out through a ``RealtimeSink``, whose heard port tells the turn how much the
client played: ``conversation.item.truncate`` when the client sends it (stock clients do after a barge-in), else
what a client playing in real time can have played by now, never more than was sent.

Why this protocol and not our own: its events already fit a voice turn, and existing SDKs and apps speak it.
Real clients treat an ``error`` event as fatal (pipecat stops reading), so a setting we cannot honour is
reported in ``session.updated`` instead, and ``error`` is kept for what is truly invalid: one per bad message,
naming it, and the session goes on. One event is ours, ``specvoice.latency``, right before ``response.done``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from dataclasses import replace
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from voice.events import (
    ReplyTextDelta,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    TranscriptFinal,
    TranscriptPartial,
    TurnDone,
    TurnError,
)
from voice.logs import RateLimitedLog
from voice.tasks import Tasks, cancel_and_wait, start
from voice.transports.common import Shared
from voice.transports.realtime.events import (
    Append,
    ClientEvent,
    ItemCreate,
    ItemRef,
    Limits,
    ResponseCancel,
    ResponseCreate,
    ResponseParams,
    SessionParams,
    SessionUpdate,
    Truncate,
    parse_client_event,
)
from voice.transports.realtime.input import RealtimeInput
from voice.transports.realtime.items import Items, from_client
from voice.transports.realtime.responses import RealtimeSink, Response, Responses
from voice.transports.realtime.session import Settings, asks_for_unsupported, session_object
from voice.transports.realtime.wire import ClientError, new_id

log = logging.getLogger("specvoice.realtime")

MAX_PENDING_BYTES = 32 << 20  # a client that stops reading is closed before its queue grows past this
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TRY_AGAIN = 1000, 1001, 1008, 1013  # RFC 6455 close codes


class RealtimeConnection:
    """Translates one websocket's client events into Session calls, and Session events into server events."""

    def __init__(self, ws: ServerConnection, shared: Shared, peer: str = "") -> None:
        self.ws, self.shared, self.config = ws, shared, shared.config
        cfg = self.config
        self.id, self.conversation_id = new_id("sess"), new_id("conv")
        self.limits = Limits(cfg.server.max_text_chars)
        self.settings = Settings(cfg.dialog.system_prompt, cfg.llm.max_new_tokens, cfg.llm.temperature)
        voice_rate = shared.assistant.tts_sample_rate
        self.sink = RealtimeSink(voice_rate)
        self.session = shared.assistant.session(self._on_event, sink=self.sink, name=self.id)
        self._base_decode = self.session.decode
        self.items = Items(
            self.session.conversation,
            self._editing_blocked,
            max_items=cfg.server.max_items,
            max_chars=8 * cfg.dialog.history_tokens,
        )
        self.responses = self.sink.responses = Responses(self.send, self.items, self.conversation_id, voice_rate)
        self.warnings = RateLimitedLog(log, session=self.id, peer=peer)
        self._tasks = Tasks()
        self.input = RealtimeInput(
            self.session,
            self.items,
            self.send,
            self.warnings,
            self._tasks,
            self.settings.input_format,
            cfg.server.max_turn_audio_s,
        )
        self._out: asyncio.Queue[str | None] = asyncio.Queue()
        self._pending_bytes = 0
        self._stalled = False
        self._event_ids = itertools.count(1)
        self._responding: asyncio.Task[None] | None = None
        self.last_activity = time.monotonic()

    def _editing_blocked(self) -> bool:
        """A turn (or an early reply) is using the history: edits to it wait until it has committed."""
        return self.session.replying or self.session.conversation.uncommitted

    # ---- wire out ------------------------------------------------------------------------------------------

    def send(self, kind: str, **fields: Any) -> None:
        message = json.dumps({"type": kind, "event_id": f"event_{self.id[5:13]}_{next(self._event_ids)}", **fields})
        if self._pending_bytes + len(message) > MAX_PENDING_BYTES:
            if not self._stalled:
                self._stalled = True
                self.warnings.warning("client does not read; closing")
                self._tasks.spawn(self.ws.close(CLOSE_POLICY, "client is not reading server events; closing"))
            return
        self._pending_bytes += len(message)
        self._out.put_nowait(message)

    def send_error(self, err: ClientError, kind: str = "invalid_request_error") -> None:
        self.shared.metrics.protocol_errors.labels("websocket", err.code).inc()
        self.warnings.warning("client error", code=err.code, param=err.param, error=err.message[:200])
        self.send(
            "error",
            error={
                "type": kind,
                "code": err.code,
                "message": err.message,
                "param": err.param,
                "event_id": err.event_id,
            },
        )

    async def _writer(self) -> None:
        while (message := await self._out.get()) is not None:
            self._pending_bytes -= len(message)
            await self.ws.send(message)

    def _send_session(self, kind: str) -> None:
        self.send(kind, session=session_object(self.config, self.id, self.settings, self.input.server_vad))

    # ---- lifecycle ------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A response or transcription is in progress (idle timeout and shutdown wait for it)."""
        return bool(self._tasks) or self.responses.current is not None or self.session.replying

    async def run(self) -> None:
        writer = start(self._writer(), name="realtime writer")
        self._send_session("session.created")
        try:
            await self._read_loop()
        except ConnectionClosed:
            pass
        finally:
            await self._tasks.stop()
            await self.session.close()
            self._out.put_nowait(None)
            with contextlib.suppress(TimeoutError, ConnectionClosed):
                await asyncio.wait_for(writer, timeout=2.0)  # what is queued goes out first
            await cancel_and_wait(writer)

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
                await self.dispatch(parse_client_event(message, self.limits))
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
        try:
            if isinstance(event, Append):
                await self.input.append(event.audio)
            elif isinstance(event, SessionUpdate):
                self._update(event.session)
            elif isinstance(event, ItemCreate):
                self._create_item(event)
            elif isinstance(event, Truncate):
                self._truncate(event)
            elif isinstance(event, ItemRef):
                self._item_ref(event)
            elif isinstance(event, ResponseCreate):
                self._create_response(event.response or ResponseParams())
            elif isinstance(event, ResponseCancel):
                await self._cancel(event.response_id)
            elif event.type == "input_audio_buffer.commit":
                await self.input.commit()
            elif event.type == "input_audio_buffer.clear":
                self.input.clear()
        except ClientError as err:
            err.event_id = err.event_id or eid
            raise

    def _update(self, params: SessionParams) -> None:
        new = self.settings.updated(params, self.config.llm.max_new_tokens)
        audio_in = params.audio.input if params.audio else None
        if audio_in is not None and "turn_detection" in audio_in.model_fields_set:
            self.input.set_turn_detection(audio_in.turn_detection is not None)
        self.input.audio.set_format(new.input_format)
        if new.instructions != self.settings.instructions:
            self.session.set_instructions(new.instructions)
        self.settings = new
        self._apply(new)
        self._send_session("session.updated")

    def _apply(self, s: Settings) -> None:
        """Make ``s`` what the session's next turns use (tools, decoding, audio or text)."""
        self.session.tools = s.chat_tools()
        self.session.decode = replace(self._base_decode, temperature=s.temperature, max_new_tokens=s.max_output_tokens)
        self.session.speak_replies = "audio" in s.modalities

    def _create_item(self, event: ItemCreate) -> None:
        entry, message = from_client(event.item, event.item.id or new_id("item"), event.event_id)
        previous = self.items.add(entry, message, after=event.previous_item_id)
        self.send("conversation.item.added", previous_item_id=previous, item=entry.to_json())
        self.send("conversation.item.done", previous_item_id=previous, item=entry.to_json())

    def _item_ref(self, event: ItemRef) -> None:
        if event.type == "conversation.item.retrieve":
            if event.item_id not in self.items.entries:
                raise ClientError(
                    "item_retrieve_invalid_item_id",
                    f"no item {json.dumps(event.item_id[:64])} to retrieve; use an id from conversation.item.added",
                    param="item_id",
                )
            self.send("conversation.item.retrieved", item=self.items.entries[event.item_id].to_json())
            return
        if event.item_id not in self.items.entries:
            raise ClientError(
                "item_delete_invalid_item_id",
                f"no item {json.dumps(event.item_id[:64])} to delete; use an id from conversation.item.added",
                param="item_id",
            )
        self.items.delete(event.item_id)
        self.send("conversation.item.deleted", item_id=event.item_id)

    def _truncate(self, event: Truncate) -> None:
        """The client played only ``audio_end_ms`` of an assistant item: the history keeps what it heard."""
        if event.item_id not in self.responses.replied_items:
            raise ClientError(
                "item_truncate_invalid_item_id",
                f"no assistant audio item "
                f"{json.dumps(event.item_id[:64])} to truncate; send the item_id of an assistant "
                "message from response.output_item.added",
                param="item_id",
            )
        if event.item_id == self.responses.replied_items[-1]:  # only the latest reply can still be cut
            self.session.truncate(event.audio_end_ms)
        self.send(
            "conversation.item.truncated",
            item_id=event.item_id,
            content_index=event.content_index,
            audio_end_ms=event.audio_end_ms,
        )

    def _create_response(self, params: ResponseParams) -> None:
        if self.responses.current is not None:
            raise ClientError(
                "conversation_already_has_active_response",
                "a response is in progress; wait for its response.done or send response.cancel",
            )
        unsupported = asks_for_unsupported(params)
        if unsupported is not None:
            raise ClientError("unsupported_parameter", unsupported[1], param=unsupported[0])
        s = self.settings.updated(params, self.config.llm.max_new_tokens)
        r = self.responses.open(s.modalities, params.metadata, s.output_format, s.max_output_tokens)
        self._responding = self._tasks.spawn(self._respond(r, s))

    async def _respond(self, r: Response, s: Settings) -> None:
        """Wait for committed buffers' transcripts, then one turn that answers the conversation as it stands,
        with this response's settings (restored afterwards)."""
        await self.items.ready()
        if self.responses.current is not r:
            return
        self.items.settle()
        if s.instructions != self.settings.instructions:
            self.session.set_instructions(s.instructions)
        self._apply(s)
        try:
            await self.session.ask(None, speak=r.audio)
        except Exception as exc:
            self.warnings.warning("response failed", error=f"{type(exc).__name__}: {exc}"[:200])
            if self.responses.current is r:
                self.responses.close(
                    "failed",
                    error={"type": "server_error", "code": "turn_failed", "message": f"{type(exc).__name__}: {exc}"},
                )
        finally:
            if s.instructions != self.settings.instructions:
                self.session.set_instructions(self.settings.instructions)
            self._apply(self.settings)

    async def _cancel(self, response_id: str | None) -> None:
        current = self.responses.current
        if current is None or (response_id is not None and response_id != current.id):
            raise ClientError(
                "response_cancel_not_active",
                "there is no response in progress to cancel",
                param="response_id" if response_id else None,
            )
        current.cancel_reason = "client_cancelled"
        await self.session.cancel()  # the turn's TurnDone(interrupted) closes the response
        if self.responses.current is current:  # the turn had not started (waiting for a transcription)
            await cancel_and_wait(self._responding)
            self.responses.close("cancelled")

    # ---- session events -------------------------------------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        """Session -> wire. Called on the event loop, in order, for this session only."""
        if isinstance(event, SpeechStarted):
            self.input.speech_started()
        elif isinstance(event, SpeechStopped):
            self.input.speech_stopped(event.cut)
        elif isinstance(event, TranscriptPartial):
            self.input.partial(event.text)
        elif isinstance(event, TranscriptFinal):
            item_id = self.input.final(event.text)
            if event.text.strip() and self.responses.current is None:
                s = self.settings
                r = self.responses.open(list(s.modalities), None, s.output_format, s.max_output_tokens)
                r.user_item = item_id
        elif isinstance(event, ReplyTextDelta):
            self.responses.text_delta(event.text)
        elif isinstance(event, ToolCallRequested):
            self.responses.function_call(event.name, event.arguments)
        elif isinstance(event, TurnError):
            self.send_error(
                ClientError(f"{event.stage}_failed", f"the turn failed in {event.stage}: {event.message}"),
                kind="server_error",
            )
            if self.responses.current is not None:
                self.responses.close(
                    "failed", error={"type": "server_error", "code": f"{event.stage}_failed", "message": event.message}
                )
        elif isinstance(event, TurnDone):
            self._turn_done(event)

    def _turn_done(self, event: TurnDone) -> None:
        r = self.responses.current
        if r is not None:
            self.responses.close(
                "cancelled" if event.interrupted else "completed", reply=event.reply, trace=event.trace
            )
        # the turn has committed: its messages get their items, and the edits that waited are applied
        reply_item = (r.message or (r.outputs[0] if r.outputs else None)) if r is not None else None
        self.items.adopt(r.user_item if r is not None else None, reply_item.id if reply_item else None)
        self.items.settle(force=True)
