"""The websocket API: a subset of the OpenAI Realtime API (GA event names), so stock clients connect.

One websocket connection is one assistant ``Session`` (its own conversation). Audio on the wire is what the
Realtime API calls ``audio/pcm``: 16-bit little-endian mono at 24 kHz, base64 in JSON text frames; the server
resamples to 16 kHz for the ears and from the voice's rate for the mouth. The README lists the exact subset.

Why a translation layer and not our own protocol: the event vocabulary (speech_started, transcription deltas,
output_audio deltas, response.done) already fits a voice turn, and existing SDKs and apps speak it. Where we
cannot honour a request (another audio format, a VAD that does not answer by itself) the client gets an
``error`` event that says so, never a silent difference. One event is ours: ``specvoice.latency`` carries the
turn's latency trace, right before its ``response.done``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import itertools
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, urlsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from audio.resample import resample
from voice.events import (ReplyAudio, ReplyTextDelta, SpeechStarted, SpeechStopped, TranscriptFinal,
                          TranscriptPartial, TurnDone, TurnError)
from voice.web import page_file

if TYPE_CHECKING:
    from voice.assistant import Assistant, Session
    from voice.config import Config
    from voice.metrics import Metrics
    from voice.serve import SessionSlots

log = logging.getLogger("specvoice.realtime")

WIRE_RATE = 24000          # the Realtime API's audio/pcm rate
MIC_RATE = 16000           # what Session.push_audio takes
PATHS = ("/v1/realtime", "/realtime")
METRICS_PATH = "/metrics"
SUBPROTOCOL = "realtime"                  # what a browser offers, and we select, for the Realtime API
KEY_SUBPROTOCOL = "openai-insecure-api-key."   # + the token: how a browser (no custom headers) sends it
MAX_PENDING_BYTES = 32 << 20   # a client that stops reading is closed before its queue grows past this
# close codes (RFC 6455): why a connection ended, readable by any websocket client
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TRY_AGAIN = 1000, 1001, 1008, 1013


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class ClientError(Exception):
    """A problem with what the client sent; becomes an ``error`` event, the session goes on."""

    def __init__(self, code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id


# ---- client events we accept (validated strictly: a number where a string belongs is an error) --------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _ClientEvent(_Strict):
    type: str
    event_id: str | None = None


class _Append(_ClientEvent):
    audio: str


class _TextPart(_Strict):
    type: Literal["input_text"]
    text: str


class _UserItem(_Strict):
    type: Literal["message"]
    role: Literal["user"]
    content: list[_TextPart]
    id: str | None = None


class _ItemCreate(_ClientEvent):
    item: _UserItem
    previous_item_id: str | None = None


class _ResponseParams(_Strict):
    output_modalities: list[Literal["text", "audio"]] | None = None
    conversation: Literal["auto"] | None = None
    input: None = None
    metadata: dict[str, str] | None = None


class _ResponseCreate(_ClientEvent):
    response: _ResponseParams | None = None


class _ResponseCancel(_ClientEvent):
    response_id: str | None = None


class _Format(_Strict):
    type: Literal["audio/pcm"]
    rate: Literal[24000] = 24000


class _TurnDetection(_Strict):
    type: Literal["server_vad", "semantic_vad"]
    create_response: Literal[True] = True      # our VAD always answers at end of speech
    interrupt_response: Literal[True] = True   # and speech during a reply is always a barge-in


class _AudioIn(_Strict):
    format: _Format | None = None
    turn_detection: _TurnDetection | None = None


class _AudioOut(_Strict):
    format: _Format | None = None


class _Audio(_Strict):
    input: _AudioIn | None = None
    output: _AudioOut | None = None


class _SessionParams(_Strict):
    type: Literal["realtime"] = "realtime"
    audio: _Audio | None = None
    output_modalities: list[Literal["text", "audio"]] | None = None


class _SessionUpdate(_ClientEvent):
    session: _SessionParams


_SCHEMAS: dict[str, type[_ClientEvent]] = {
    "session.update": _SessionUpdate,
    "input_audio_buffer.append": _Append,
    "input_audio_buffer.commit": _ClientEvent,
    "input_audio_buffer.clear": _ClientEvent,
    "conversation.item.create": _ItemCreate,
    "response.create": _ResponseCreate,
    "response.cancel": _ResponseCancel,
}


def parse_client_event(text: str | bytes) -> _ClientEvent:
    """JSON text -> a validated client event, or ClientError naming the problem and the fix."""
    if isinstance(text, bytes):
        raise ClientError("binary_not_supported", "binary frames are not part of this API; send JSON text frames "
                          "(audio goes base64 in input_audio_buffer.append)")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClientError("invalid_json", f"the message is not valid JSON ({exc}); send one JSON object per frame")
    if not isinstance(raw, dict):
        raise ClientError("invalid_json", "the message must be a JSON object with a 'type' field")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise ClientError("missing_type", "the event has no string 'type' field", param="type", event_id=event_id)
    schema = _SCHEMAS.get(kind)
    if schema is None:
        raise ClientError("unknown_event_type", f"unsupported event type {kind!r}; this server accepts: "
                          f"{', '.join(_SCHEMAS)}", param="type", event_id=event_id)
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"])
        got = err.get("input")
        got_text = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        raise ClientError("invalid_value", f"{kind}: {param}: {err['msg']}{got_text}", param=param,
                          event_id=event_id) from None


def decode_pcm16(b64: str) -> np.ndarray:
    """base64 pcm16 little-endian -> int16 samples, or ClientError saying what is wrong with the audio."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ClientError("invalid_audio", "audio is not valid base64; send base64 of 16-bit little-endian mono "
                          "PCM at 24 kHz", param="audio") from None
    if len(raw) % 2:
        raise ClientError("invalid_audio", f"audio has {len(raw)} bytes, an odd number: pcm16 needs 2 bytes per "
                          "sample; send 16-bit little-endian mono PCM at 24 kHz", param="audio")
    return np.frombuffer(raw, dtype="<i2").astype(np.int16)


# ---- one connection ------------------------------------------------------------------------------------------

@dataclass
class _Response:
    id: str
    item_id: str
    modalities: list[str]
    metadata: dict[str, str] | None = None
    text: list[str] = field(default_factory=list)
    cancel_reason: str = "turn_detected"   # unless the client asks (response.cancel)

    def item(self, status: str, text: str | None = None) -> dict[str, Any]:
        content = []
        if text is not None:
            content = [{"type": "output_audio", "transcript": text} if "audio" in self.modalities
                       else {"type": "output_text", "text": text}]
        return {"id": self.item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": status, "content": content}


class RealtimeConnection:
    """Translates one websocket's client events into Session calls, and Session events into server events."""

    def __init__(self, ws: ServerConnection, server: RealtimeServer) -> None:
        self.ws = ws
        self.server = server
        self.config = server.config
        self.assistant = server.assistant
        self.session: Session | None = None
        self.id = new_id("sess")
        self.conversation_id = new_id("conv")
        self.modalities = ["audio"]
        self.server_vad = True
        self._out: asyncio.Queue[str | None] = asyncio.Queue()
        self._pending_bytes = 0
        self._stalled = False
        self._event_ids = itertools.count(1)
        self._input_samples = 0              # 24 kHz samples received, for audio_*_ms
        self._last_item: str | None = None
        self._user_item: str | None = None    # the user item being spoken (server VAD)
        self._spoken_item: str | None = None  # the last user item the VAD committed
        self._partial_sent = ""
        self._speech_samples = 0             # 16 kHz samples of the utterance in progress
        self._too_long = False
        self._manual: list[np.ndarray] = []  # 16 kHz audio waiting for input_audio_buffer.commit
        self._manual_samples = 0
        self._inputs: list[asyncio.Task[str] | str] = []  # user inputs waiting for response.create
        self._response: _Response | None = None
        self._responding: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.last_activity = time.monotonic()

    # ---- wire out ------------------------------------------------------------------------------------------

    def send(self, kind: str, **fields: Any) -> None:
        message = json.dumps({"type": kind, "event_id": f"event_{self.id[5:13]}_{next(self._event_ids)}", **fields})
        if self._pending_bytes + len(message) > MAX_PENDING_BYTES:
            if not self._stalled:
                self._stalled = True
                log.warning("client does not read; closing", extra={"session": self.id})
                self._spawn(self.ws.close(CLOSE_POLICY, "client is not reading server events; closing"))
            return
        self._pending_bytes += len(message)
        self._out.put_nowait(message)

    def send_error(self, err: ClientError, kind: str = "invalid_request_error") -> None:
        self.server.metrics.protocol_errors.labels("websocket", err.code).inc()
        self.send("error", error={"type": kind, "code": err.code, "message": err.message, "param": err.param,
                                  "event_id": err.event_id})

    async def _writer(self) -> None:
        while (message := await self._out.get()) is not None:
            self._pending_bytes -= len(message)
            await self.ws.send(message)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- lifecycle ------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A response or transcription is in progress (idle timeout and shutdown wait for it)."""
        return bool(self._tasks) or self._response is not None or bool(self.session and self.session.replying)

    async def run(self) -> None:
        self.session = self.assistant.session(self._on_event, name=self.id)
        writer = asyncio.create_task(self._writer())
        self.send("session.created", session=self.session_object())
        try:
            await self._read_loop()
        except ConnectionClosed:
            pass
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.session.close()
            self._out.put_nowait(None)
            try:
                await asyncio.wait_for(writer, timeout=2.0)
            except (asyncio.TimeoutError, ConnectionClosed):
                writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _read_loop(self) -> None:
        idle = self.config.server.idle_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(self.ws.recv(), timeout=idle)
            except asyncio.TimeoutError:
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
        if self.busy and self.session is not None:
            if self._response is not None:
                self._response.cancel_reason = "client_cancelled"
            await self.session.cancel()
        await self.ws.close(CLOSE_GOING_AWAY, "server shutting down")

    # ---- client events --------------------------------------------------------------------------------------

    async def dispatch(self, event: _ClientEvent) -> None:
        assert self.session is not None
        eid = event.event_id
        if isinstance(event, _Append):
            await self._append(decode_pcm16(event.audio) if event.audio else np.zeros(0, np.int16), eid)
        elif isinstance(event, _SessionUpdate):
            self._update(event.session)
            self.send("session.updated", session=self.session_object())
        elif isinstance(event, _ItemCreate):
            self._create_item(event)
        elif isinstance(event, _ResponseCreate):
            self._create_response(event.response or _ResponseParams(), eid)
        elif isinstance(event, _ResponseCancel):
            await self._cancel(event.response_id, eid)
        elif event.type == "input_audio_buffer.commit":
            await self._commit(eid)
        elif event.type == "input_audio_buffer.clear":
            self._clear(eid)

    def _update(self, params: _SessionParams) -> None:
        audio_in = params.audio.input if params.audio else None
        if audio_in is not None and "turn_detection" in audio_in.model_fields_set:
            self.server_vad = audio_in.turn_detection is not None
            if self.session.vad_enabled != self.server_vad:
                self.session.vad_enabled = self.server_vad
                self._manual, self._manual_samples = [], 0
        if params.output_modalities is not None:
            self.modalities = _one_modality(params.output_modalities, "session.output_modalities")

    async def _append(self, samples24: np.ndarray, eid: str | None) -> None:
        if not len(samples24):
            return
        self._input_samples += len(samples24)
        samples = resample(samples24, WIRE_RATE, MIC_RATE)
        limit = int(self.config.server.max_turn_audio_s * MIC_RATE)
        if not self.server_vad:
            if self._manual_samples + len(samples) > limit:
                raise ClientError("input_audio_too_long", f"the input audio buffer would exceed "
                                  f"{self.config.server.max_turn_audio_s:g} s (server.max_turn_audio_s); commit or "
                                  "clear it first; this append was dropped", param="audio", event_id=eid)
            self._manual.append(samples)
            self._manual_samples += len(samples)
            return
        await self.session.push_audio(samples)
        if self._user_item is not None:
            self._speech_samples += len(samples)
            if self._speech_samples > limit and not self._too_long:
                self._too_long = True
                self.send_error(ClientError("input_audio_too_long", f"the utterance is longer than "
                                            f"{self.config.server.max_turn_audio_s:g} s (server.max_turn_audio_s); "
                                            "the turn was ended here", event_id=eid))
                await self.session.commit_audio()

    async def _commit(self, eid: str | None) -> None:
        if self.server_vad:
            if self._user_item is None:
                raise ClientError("input_audio_buffer_commit_empty", "no speech to commit: the server VAD has not "
                                  "heard speech (it commits turns by itself)", event_id=eid)
            await self.session.commit_audio()
            return
        if not self._manual:
            raise ClientError("input_audio_buffer_commit_empty", "the input audio buffer is empty; append audio "
                              "before committing", event_id=eid)
        audio = np.concatenate(self._manual)
        self._manual, self._manual_samples = [], 0
        item_id = new_id("item")
        self._commit_user_item(item_id)
        self._inputs.append(self._spawn(self._transcribe(item_id, audio)))

    def _clear(self, eid: str | None) -> None:
        if self.server_vad and self._user_item is not None:
            raise ClientError("cannot_clear_speech", "the server VAD is hearing speech right now and will commit "
                              "it; set turn_detection to null for a buffer you control", event_id=eid)
        self._manual, self._manual_samples = [], 0
        self.send("input_audio_buffer.cleared")

    def _create_item(self, event: _ItemCreate) -> None:
        text = "".join(part.text for part in event.item.content).strip()
        if not text:
            raise ClientError("invalid_value", "the user message has no text", param="item.content",
                              event_id=event.event_id)
        item = {"id": event.item.id or new_id("item"), "object": "realtime.item", "type": "message",
                "role": "user", "status": "completed", "content": [{"type": "input_text", "text": text}]}
        self.send("conversation.item.added", previous_item_id=self._last_item, item=item)
        self.send("conversation.item.done", previous_item_id=self._last_item, item=item)
        self._last_item = item["id"]
        self._inputs.append(text)

    def _create_response(self, params: _ResponseParams, eid: str | None) -> None:
        if self._response is not None:
            raise ClientError("conversation_already_has_active_response", "a response is in progress; wait for "
                              "its response.done or send response.cancel", event_id=eid)
        if not self._inputs:
            raise ClientError("no_input", "nothing to answer: send conversation.item.create with a user message, "
                              "or commit input audio, before response.create", event_id=eid)
        modalities = (_one_modality(params.output_modalities, "response.output_modalities")
                      if params.output_modalities is not None else list(self.modalities))
        inputs, self._inputs = self._inputs, []
        self._open_response(modalities, params.metadata)
        self._responding = self._spawn(self._respond(self._response, inputs))

    async def _respond(self, r: _Response, inputs: list[asyncio.Task[str] | str]) -> None:
        """Wait for the user's inputs (manual-mode transcriptions), then one text turn on the session."""
        texts = [(await x) if isinstance(x, asyncio.Task) else x for x in inputs]
        text = " ".join(t for t in texts if t).strip()
        if self._response is not r:
            return
        if not text:
            self._close_response("failed", error={"type": "invalid_request_error", "code": "no_input",
                                                  "message": "the committed audio transcribed to no words"})
            return
        try:
            await self.session.ask(text, speak="audio" in r.modalities)
        except Exception as exc:
            log.exception("text turn failed", extra={"session": self.id})
            if self._response is r:
                self._close_response("failed", error={"type": "server_error", "code": "turn_failed",
                                                      "message": f"{type(exc).__name__}: {exc}"})

    async def _cancel(self, response_id: str | None, eid: str | None) -> None:
        current = self._response
        if current is None or (response_id is not None and response_id != current.id):
            raise ClientError("response_cancel_not_active", "there is no response in progress to cancel",
                              param="response_id" if response_id else None, event_id=eid)
        current.cancel_reason = "client_cancelled"
        await self.session.cancel()     # the turn's TurnDone(interrupted) closes the response
        if self._response is current:   # the turn had not started (waiting for a transcription): close it here
            if self._responding is not None:
                self._responding.cancel()
            self._close_response("cancelled")

    async def _transcribe(self, item_id: str, audio: np.ndarray) -> str:
        try:
            text = (await self.session.transcribe(audio)).strip()
        except Exception as exc:
            log.warning("transcription failed", extra={"session": self.id, "error": str(exc)})
            self.send("conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                      error={"type": "transcription_error", "code": "stt_failed", "message": str(exc)})
            return ""
        self._transcribed(item_id, text, len(audio) / MIC_RATE)
        return text

    # ---- session events -------------------------------------------------------------------------------------

    def _on_event(self, event) -> None:
        """Session -> wire. Called on the event loop, in order, for this session only."""
        if isinstance(event, SpeechStarted):
            self._user_item, self._partial_sent, self._speech_samples, self._too_long = new_id("item"), "", 0, False
            self.send("input_audio_buffer.speech_started", audio_start_ms=self._input_ms(),
                      item_id=self._user_item)
        elif isinstance(event, SpeechStopped):
            item_id = self._user_item or new_id("item")
            self._user_item = None
            self._spoken_item = item_id
            self.send("input_audio_buffer.speech_stopped", audio_end_ms=self._input_ms(), item_id=item_id)
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
            self._transcribed(item_id, event.text, self._speech_samples / MIC_RATE)
            if event.text.strip() and self._response is None:
                self._open_response(list(self.modalities), None)
        elif isinstance(event, ReplyTextDelta):
            r = self._response
            if r is not None:
                r.text.append(event.text)
                kind = ("response.output_audio_transcript.delta" if "audio" in r.modalities
                        else "response.output_text.delta")
                self.send(kind, response_id=r.id, item_id=r.item_id, output_index=0, content_index=0,
                          delta=event.text)
        elif isinstance(event, ReplyAudio):
            r = self._response
            if r is not None and "audio" in r.modalities and len(event.samples):
                pcm = resample(event.samples, event.sample_rate, WIRE_RATE).astype("<i2").tobytes()
                self.send("response.output_audio.delta", response_id=r.id, item_id=r.item_id, output_index=0,
                          content_index=0, delta=base64.b64encode(pcm).decode("ascii"))
        elif isinstance(event, TurnError):
            self.send_error(ClientError(f"{event.stage}_failed", f"the turn failed in {event.stage}: "
                                        f"{event.message}"), kind="server_error")
            if self._response is not None:
                self._close_response("failed", error={"type": "server_error", "code": f"{event.stage}_failed",
                                                      "message": event.message})
        elif isinstance(event, TurnDone):
            if self._response is not None:
                status = "cancelled" if event.interrupted else "completed"
                self._close_response(status, reply=event.reply, trace=event.trace)

    def _input_ms(self) -> int:
        return int(self._input_samples * 1000 / WIRE_RATE)

    def _commit_user_item(self, item_id: str) -> None:
        self.send("input_audio_buffer.committed", previous_item_id=self._last_item, item_id=item_id)
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_audio", "transcript": None}]}
        self.send("conversation.item.added", previous_item_id=self._last_item, item=item)
        self._last_item = item_id

    def _transcribed(self, item_id: str, text: str, seconds: float) -> None:
        self.send("conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=0,
                  transcript=text, usage={"type": "duration", "seconds": round(seconds, 3)})
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_audio", "transcript": text}]}
        self.send("conversation.item.done", previous_item_id=None, item=item)

    def _open_response(self, modalities: list[str], metadata: dict | None) -> None:
        r = self._response = _Response(new_id("resp"), new_id("item"), modalities, metadata)
        self.send("response.created", response=self._response_object(r, "in_progress"))
        item = r.item("in_progress")
        self.send("response.output_item.added", response_id=r.id, output_index=0, item=item)
        self.send("conversation.item.added", previous_item_id=self._last_item, item=item)
        self._last_item = r.item_id
        part = {"type": "audio", "transcript": ""} if "audio" in modalities else {"type": "text", "text": ""}
        self.send("response.content_part.added", response_id=r.id, item_id=r.item_id, output_index=0,
                  content_index=0, part=part)

    def _close_response(self, status: str, *, reply: str | None = None, trace: dict | None = None,
                        error: dict | None = None) -> None:
        r, self._response = self._response, None
        if r is None:
            return
        text = reply if reply is not None else "".join(r.text)
        ids = {"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0}
        if "audio" in r.modalities:
            self.send("response.output_audio.done", **ids)
            self.send("response.output_audio_transcript.done", **ids, transcript=text)
            part = {"type": "audio", "transcript": text}
        else:
            self.send("response.output_text.done", **ids, text=text)
            part = {"type": "text", "text": text}
        self.send("response.content_part.done", **ids, part=part)
        item = r.item("completed" if status == "completed" else "incomplete", text)
        self.send("response.output_item.done", response_id=r.id, output_index=0, item=item)
        self.send("conversation.item.done", previous_item_id=None, item=item)
        if trace is not None:
            self.send("specvoice.latency", response_id=r.id, item_id=r.item_id, trace=trace)
        details = None
        if status == "cancelled":
            details = {"type": "cancelled", "reason": r.cancel_reason}
        elif status == "failed":
            details = {"type": "failed", "error": error}
        self.send("response.done", response=self._response_object(r, status, item, details))

    def _response_object(self, r: _Response, status: str, item: dict | None = None,
                         details: dict | None = None) -> dict[str, Any]:
        return {"id": r.id, "object": "realtime.response", "status": status, "status_details": details,
                "output": [item] if item else [], "conversation_id": self.conversation_id,
                "output_modalities": r.modalities, "metadata": r.metadata,
                "max_output_tokens": self.config.llm.max_new_tokens,
                "audio": {"output": {"format": {"type": "audio/pcm", "rate": WIRE_RATE},
                                     "voice": self.config.models.tts}},
                "usage": None}

    def session_object(self) -> dict[str, Any]:
        """The effective session configuration (what session.created / session.updated report)."""
        cfg = self.config
        vad = ({"type": "server_vad", "threshold": cfg.vad.threshold, "prefix_padding_ms": cfg.vad.preroll_ms,
                "silence_duration_ms": cfg.vad.end_silence_ms, "create_response": True, "interrupt_response": True,
                "idle_timeout_ms": None} if self.server_vad else None)
        pcm = {"type": "audio/pcm", "rate": WIRE_RATE}
        return {"type": "realtime", "object": "realtime.session", "id": self.id, "model": cfg.models.target,
                "output_modalities": list(self.modalities), "instructions": cfg.dialog.system_prompt,
                "max_output_tokens": cfg.llm.max_new_tokens, "tools": [], "tool_choice": "auto",
                "audio": {"input": {"format": pcm, "transcription": {"model": cfg.models.stt,
                                                                    "language": cfg.stt.language},
                                    "turn_detection": vad, "noise_reduction": None},
                          "output": {"format": pcm, "voice": cfg.models.tts, "speed": 1.0}}}


def _one_modality(values: list[str], param: str) -> list[str]:
    if len(set(values)) != 1:
        raise ClientError("invalid_value", f"{param} must be [\"audio\"] or [\"text\"] (audio always comes with "
                          f"its transcript); got {values!r}", param=param)
    return [values[0]]


# ---- the handshake: tokens, subprotocols, the page ---------------------------------------------------------------

def offered_subprotocols(request: Request) -> list[str]:
    """The subprotocols a client offered (Sec-WebSocket-Protocol, comma-separated, possibly repeated)."""
    return [p.strip() for value in request.headers.get_all("Sec-WebSocket-Protocol")
            for p in value.split(",") if p.strip()]


def offered_token(request: Request) -> str | None:
    """The client's token, from the first place that has one: ``Authorization: Bearer``, the subprotocol
    ``openai-insecure-api-key.<token>`` (the Realtime convention for browsers, which cannot set headers), or
    ``?token=``."""
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:]
    for protocol in offered_subprotocols(request):
        if protocol.startswith(KEY_SUBPROTOCOL):
            return protocol[len(KEY_SUBPROTOCOL):]
    values = parse_qs(urlsplit(request.path).query).get("token")
    return values[0] if values else None


def select_subprotocol(connection: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """Select ``realtime`` when offered, else none. A browser fails a handshake that offered subprotocols and
    got none back; the key subprotocol is never echoed (it carries the token)."""
    return Subprotocol(SUBPROTOCOL) if SUBPROTOCOL in offered else None


def page_response(request: Request) -> Response | None:
    """The browser page's files (``/``, ``/app.js``, ...) with their Content-Type and a same-origin CSP; None
    for any other path. The page holds no secret: the token is typed into it, never served."""
    page = page_file(urlsplit(request.path).path, request.headers.get("Host"))
    if page is None:
        return None
    headers = Headers(page.headers)
    headers["Content-Length"] = str(len(page.body))
    headers["Connection"] = "close"      # as websockets' own responses: one request per connection
    return Response(HTTPStatus.OK.value, HTTPStatus.OK.phrase, headers, page.body)


# ---- the server ------------------------------------------------------------------------------------------------

class RealtimeServer:
    """The websocket listener: handshake checks (path, token, session slots), then one RealtimeConnection each."""

    def __init__(self, config: Config, assistant: Assistant, metrics: Metrics, slots: SessionSlots) -> None:
        self.config = config
        self.assistant = assistant
        self.metrics = metrics
        self.slots = slots
        self.connections: set[RealtimeConnection] = set()
        self._server: Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        s = self.config.server
        self._server = await serve(self._handle, s.host, s.port, max_size=s.max_message_bytes,
                                   process_request=self._process_request, select_subprotocol=select_subprotocol,
                                   ping_interval=20, ping_timeout=20, close_timeout=3)

    def _authorized(self, request: Request) -> bool:
        token = self.config.server.token
        if token is None:
            return True
        offered = offered_token(request)
        return offered is not None and hmac.compare_digest(offered.encode(), token.encode())

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == METRICS_PATH:
            if not self._authorized(request):
                return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong token; send "
                                          "'Authorization: Bearer <server.token>'\n")
            from voice.metrics import CONTENT_TYPE

            response = connection.respond(HTTPStatus.OK, self.metrics.render().decode())
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = CONTENT_TYPE
            return response
        page = page_response(request)
        if page is not None:
            return page
        if path not in PATHS:
            return connection.respond(HTTPStatus.NOT_FOUND, f"no such path {path!r}; the websocket API is at "
                                      f"{PATHS[0]}, the page at / and metrics at {METRICS_PATH}\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        if not self._authorized(ws.request):
            self.metrics.rejected.labels("websocket", "token").inc()
            await ws.close(CLOSE_POLICY, "missing or wrong token: send 'Authorization: Bearer <t>', subprotocol "
                                         "openai-insecure-api-key.<t> or ?token=<t>")   # <= 123 bytes
            return
        if not self.slots.acquire():
            self.metrics.rejected.labels("websocket", "sessions").inc()
            await ws.close(CLOSE_TRY_AGAIN, f"server busy: {self.slots.limit} sessions open "
                                            "(server.max_sessions); try again later")
            return
        conn = RealtimeConnection(ws, self)
        self.connections.add(conn)
        self.metrics.session_opened("websocket")
        log.info("websocket session", extra={"session": conn.id, "peer": str(ws.remote_address)})
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            self.slots.release()
            self.metrics.session_closed("websocket")

    async def stop(self, grace: float) -> None:
        """Stop listening, let turns finish for up to ``grace`` s, close every connection with 1001."""
        if self._server is None:
            return
        self._server.close(close_connections=False)
        await asyncio.gather(*(c.finish(grace) for c in list(self.connections)), return_exceptions=True)
        self._server.close(close_connections=True)
        await self._server.wait_closed()
        self._server = None
