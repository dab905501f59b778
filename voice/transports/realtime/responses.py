"""The server's side of a Realtime response: its output items, in the order the API defines, and its usage.

A response's output is made as it comes: the assistant message (one content part, audio with its transcript or
text) opens at its first text or audio, and a function call the model makes becomes a ``function_call`` item
(``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done``,
``response.output_item.done``). A response that only calls a tool has no message, as with OpenAI's.
``response.done`` carries real ``usage`` (prompt and reply tokens; the prompt tokens the KV cache already held
count as cached) and, for clients that drop unknown events, our latency trace in ``metadata``; the full trace
also goes out as ``specvoice.latency`` right before it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice.transports.realtime.items import Entry, Items
from voice.transports.realtime.wire import AudioOut, WireFormat, new_id

LATENCY_KEY = "specvoice_latency"  # response.metadata key of the latency trace (JSON text)


@dataclass
class Response:
    id: str
    modalities: list[str]
    format: WireFormat
    max_output_tokens: int
    metadata: dict[str, str] | None = None
    audio_out: AudioOut | None = None
    message: Entry | None = None  # the assistant message, once it has content
    outputs: list[Entry] = field(default_factory=list)  # output items in order
    text: list[str] = field(default_factory=list)
    cancel_reason: str = "turn_detected"  # unless the client asks (response.cancel)
    user_item: str | None = None  # a spoken turn's user item (its message is written by the turn)

    @property
    def audio(self) -> bool:
        return "audio" in self.modalities


class Responses:
    """Opens, feeds and closes responses on one connection (one at a time)."""

    def __init__(self, send: Callable[..., None], items: Items, conversation_id: str, voice_rate: int) -> None:
        self.send, self.items, self.conversation_id, self.voice_rate = send, items, conversation_id, voice_rate
        self.current: Response | None = None
        self.replied_items: list[str] = []  # assistant messages, oldest first (truncate names one of them)

    def open(
        self, modalities: list[str], metadata: dict[str, str] | None, fmt: WireFormat, max_output_tokens: int
    ) -> Response:
        audio_out = AudioOut(fmt, self.voice_rate) if "audio" in modalities else None
        r = self.current = Response(new_id("resp"), modalities, fmt, max_output_tokens, metadata, audio_out)
        self.send("response.created", response=self.response_object(r, "in_progress"))
        return r

    def _ids(self, r: Response, entry: Entry) -> dict[str, Any]:
        return {"response_id": r.id, "item_id": entry.id, "output_index": r.outputs.index(entry)}

    def _add_output(self, r: Response, entry: Entry) -> None:
        r.outputs.append(entry)
        previous = self.items.add(entry)
        item = entry.to_json()
        self.send("response.output_item.added", response_id=r.id, output_index=len(r.outputs) - 1, item=item)
        self.send("conversation.item.added", previous_item_id=previous, item=item)

    def _message(self, r: Response) -> Entry:
        """The response's assistant message, opened at its first content."""
        if r.message is None:
            r.message = Entry(
                new_id("item"),
                "message",
                "assistant",
                "output_audio" if r.audio else "output_text",
                text="",
                status="in_progress",
            )
            self._add_output(r, r.message)
            self.replied_items = (self.replied_items + [r.message.id])[-16:]
            part = {"type": "audio", "transcript": ""} if r.audio else {"type": "text", "text": ""}
            self.send("response.content_part.added", **self._ids(r, r.message), content_index=0, part=part)
        return r.message

    def text_delta(self, text: str) -> None:
        r = self.current
        if r is None or not text:
            return
        entry = self._message(r)
        r.text.append(text)
        kind = "response.output_audio_transcript.delta" if r.audio else "response.output_text.delta"
        self.send(kind, **self._ids(r, entry), content_index=0, delta=text)

    def audio_delta(self, samples: np.ndarray) -> bool:
        """Audio of the response in progress (at the voice's rate); False when no audio response is open."""
        r = self.current
        if r is None or r.audio_out is None or not len(samples):
            return False
        entry = self._message(r)
        data = r.audio_out.encode(samples)
        if data is not None:
            self.send("response.output_audio.delta", **self._ids(r, entry), content_index=0, delta=data)
        return True

    def function_call(self, name: str, arguments: str) -> Entry | None:
        """The model called a tool: a function_call item, its arguments, done (the client runs it)."""
        r = self.current
        if r is None:
            return None
        entry = Entry(
            new_id("item"), "function_call", call_id=new_id("call"), name=name, arguments="", status="in_progress"
        )
        self._add_output(r, entry)
        ids = {**self._ids(r, entry), "call_id": entry.call_id}
        self.send("response.function_call_arguments.delta", **ids, delta=arguments)
        self.send("response.function_call_arguments.done", **ids, name=entry.name, arguments=arguments)
        entry.arguments, entry.status = arguments, "completed"
        self.send("response.output_item.done", response_id=r.id, output_index=ids["output_index"], item=entry.to_json())
        self.send("conversation.item.done", previous_item_id=None, item=entry.to_json())
        return entry

    def close(
        self,
        status: str,
        *,
        reply: str | None = None,
        trace: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> Response | None:
        r, self.current = self.current, None
        if r is None:
            return None
        entry = r.message
        if entry is not None:
            text = reply if reply is not None else "".join(r.text)
            ids = {**self._ids(r, entry), "content_index": 0}
            if r.audio:
                tail = r.audio_out.flush() if r.audio_out is not None and status == "completed" else None
                if tail is not None:  # the resampler's last few ms belong to a reply that played to its end
                    self.send("response.output_audio.delta", **ids, delta=tail)
                self.send("response.output_audio.done", **ids)
                self.send("response.output_audio_transcript.done", **ids, transcript=text)
                part = {"type": "audio", "transcript": text}
            else:
                self.send("response.output_text.done", **ids, text=text)
                part = {"type": "text", "text": text}
            self.send("response.content_part.done", **ids, part=part)
            entry.status = "completed" if status == "completed" else "incomplete"
            if entry.message is None:
                entry.text = text
            self.send(
                "response.output_item.done", response_id=r.id, output_index=ids["output_index"], item=entry.to_json()
            )
            self.send("conversation.item.done", previous_item_id=None, item=entry.to_json())
        metadata = dict(r.metadata or {})
        if trace is not None:
            self.send("specvoice.latency", response_id=r.id, item_id=entry.id if entry else None, trace=trace)
            metadata[LATENCY_KEY] = json.dumps(
                {k: trace.get(k) for k in ("turn_id", "stages_ms", "marks_ms", "over_budget", "interrupted")},
                separators=(",", ":"),
            )
        details: dict[str, Any] | None = None
        if status == "cancelled":
            details = {"type": "cancelled", "reason": r.cancel_reason}
        elif status == "failed":
            details = {"type": "failed", "error": error}
        body = self.response_object(r, status, details)
        body["metadata"] = metadata or None
        body["usage"] = usage((trace or {}).get("decoder"))
        self.send("response.done", response=body)
        return r

    def response_object(self, r: Response, status: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "id": r.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": [e.to_json() for e in r.outputs],
            "conversation_id": self.conversation_id,
            "output_modalities": r.modalities,
            "metadata": r.metadata,
            "max_output_tokens": r.max_output_tokens,
            "audio": {"output": {"format": r.format.to_json()}},
            "usage": None,
        }


class RealtimeSink:
    """The websocket as the session's speaker. ``write`` sends ``response.output_audio.delta`` events for the
    response in progress; ``heard_samples`` is what a client that plays the audio in real time from the first
    delta can have heard by now (the connection's truncate then caps it in the turn)."""

    def __init__(self, sample_rate: int) -> None:
        self.responses: Responses | None = None  # set once the connection has built its responses
        self.sample_rate = sample_rate
        self.first_audible_t: float | None = None
        self.played_samples = 0

    def begin_utterance(self) -> None:
        self.first_audible_t, self.played_samples = None, 0

    async def write(self, samples: np.ndarray) -> None:
        if self.responses is not None and self.responses.audio_delta(samples):
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


def usage(decoder: dict[str, Any] | None) -> dict[str, Any]:
    """Realtime ``usage`` from the turn's decoder stats: all text tokens (speech is transcribed before the model
    reads it, and the reply is spoken after it writes it); cached = prompt tokens the KV cache already held."""
    prompt = int(decoder.get("prompt_tokens", 0)) if decoder else 0
    cached = max(0, prompt - int(decoder.get("prefill_tokens", 0))) if decoder else 0
    reply = int(decoder.get("new_tokens", 0)) if decoder else 0
    return {
        "total_tokens": prompt + reply,
        "input_tokens": prompt,
        "output_tokens": reply,
        "input_token_details": {
            "text_tokens": prompt,
            "audio_tokens": 0,
            "image_tokens": 0,
            "cached_tokens": cached,
            "cached_tokens_details": {"text_tokens": cached, "audio_tokens": 0, "image_tokens": 0},
        },
        "output_token_details": {"text_tokens": reply, "audio_tokens": 0},
    }
