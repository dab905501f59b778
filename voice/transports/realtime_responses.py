"""The server's side of the Realtime conversation: responses (one in progress at a time) and the session object.

A response is one assistant item with one content part; its events go out in the order the Realtime API
defines (created, output_item.added, content_part.added, deltas, ... done), and our latency trace rides along as
``specvoice.latency`` right before ``response.done``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from audio.resample import resample
from voice.transports.realtime_events import WIRE_RATE, encode_pcm16, new_id


@dataclass
class Response:
    id: str
    item_id: str
    modalities: list[str]
    metadata: dict[str, str] | None = None
    text: list[str] = field(default_factory=list)
    cancel_reason: str = "turn_detected"  # unless the client asks (response.cancel)

    def item(self, status: str, text: str | None = None) -> dict[str, Any]:
        content = []
        if text is not None:
            content = [{"type": "output_audio", "transcript": text} if "audio" in self.modalities
                       else {"type": "output_text", "text": text}]
        return {"id": self.item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": status, "content": content}


class Responses:
    """Opens, feeds and closes responses on one connection; ``last_item`` is the conversation's newest item."""

    def __init__(self, send: Callable[..., None], config: Any, conversation_id: str) -> None:
        self.send, self.config, self.conversation_id = send, config, conversation_id
        self.current: Response | None = None
        self.last_item: str | None = None
        self.replied_items: list[str] = []  # assistant items, oldest first (truncate names one of them)

    def open(self, modalities: list[str], metadata: dict[str, str] | None) -> Response:
        r = self.current = Response(new_id("resp"), new_id("item"), modalities, metadata)
        self.replied_items = (self.replied_items + [r.item_id])[-16:]
        self.send("response.created", response=self.response_object(r, "in_progress"))
        item = r.item("in_progress")
        self.send("response.output_item.added", response_id=r.id, output_index=0, item=item)
        self.send("conversation.item.added", previous_item_id=self.last_item, item=item)
        self.last_item = r.item_id
        part = {"type": "audio", "transcript": ""} if "audio" in modalities else {"type": "text", "text": ""}
        self.send("response.content_part.added", response_id=r.id, item_id=r.item_id, output_index=0,
                  content_index=0, part=part)
        return r

    def text_delta(self, text: str) -> None:
        r = self.current
        if r is not None:
            r.text.append(text)
            kind = "response.output_audio_transcript.delta" if "audio" in r.modalities else "response.output_text.delta"
            self.send(kind, response_id=r.id, item_id=r.item_id, output_index=0, content_index=0, delta=text)

    def audio_delta(self, samples: np.ndarray, rate: int) -> bool:
        """Audio of the response in progress; False when no audio response is open."""
        r = self.current
        if r is None or "audio" not in r.modalities or not len(samples):
            return False
        self.send("response.output_audio.delta", response_id=r.id, item_id=r.item_id, output_index=0,
                  content_index=0, delta=encode_pcm16(resample(samples, rate, WIRE_RATE)))
        return True

    def close(self, status: str, *, reply: str | None = None, trace: dict[str, Any] | None = None,
              error: dict[str, Any] | None = None) -> None:
        r, self.current = self.current, None
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
        self.send("response.done", response=self.response_object(r, status, item, details))

    def response_object(self, r: Response, status: str, item: dict[str, Any] | None = None,
                        details: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"id": r.id, "object": "realtime.response", "status": status, "status_details": details,
                "output": [item] if item else [], "conversation_id": self.conversation_id,
                "output_modalities": r.modalities, "metadata": r.metadata,
                "max_output_tokens": self.config.llm.max_new_tokens,
                "audio": {"output": {"format": {"type": "audio/pcm", "rate": WIRE_RATE},
                                     "voice": self.config.models.tts}},
                "usage": None}


def session_object(config: Any, session_id: str, modalities: list[str], server_vad: bool) -> dict[str, Any]:
    """The effective session configuration (what session.created / session.updated report)."""
    cfg = config
    vad = ({"type": "server_vad", "threshold": cfg.vad.threshold, "prefix_padding_ms": cfg.vad.preroll_ms,
            "silence_duration_ms": cfg.vad.end_silence_ms, "create_response": True, "interrupt_response": True,
            "idle_timeout_ms": None} if server_vad else None)
    pcm = {"type": "audio/pcm", "rate": WIRE_RATE}
    return {"type": "realtime", "object": "realtime.session", "id": session_id, "model": cfg.models.target,
            "output_modalities": list(modalities), "instructions": cfg.dialog.system_prompt,
            "max_output_tokens": cfg.llm.max_new_tokens, "tools": [], "tool_choice": "auto",
            "audio": {"input": {"format": pcm, "transcription": {"model": cfg.models.stt,
                                                                "language": cfg.stt.language},
                                "turn_detection": vad, "noise_reduction": None},
                      "output": {"format": pcm, "voice": cfg.models.tts, "speed": 1.0}}}
