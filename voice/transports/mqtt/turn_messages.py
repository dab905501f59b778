"""What the bridge publishes when a turn is done: the reply, its latency, and the whole turn with its trace."""

from __future__ import annotations

import json

from voice.events import TurnDone
from voice.transports.mqtt.payloads import Outgoing, Priority, Topics


def _json(payload: dict) -> str:
    return json.dumps(payload, default=str)


def finished_turn(topics: Topics, session_id: str, done: TurnDone, *, retain: bool) -> list[Outgoing]:
    """``<p>/reply`` (retained when results are), ``<p>/latency`` of the turn's main stage (retained: a sensor),
    and ``<p>/turn`` with the full trace (telemetry: the first dropped when the broker is away)."""
    messages = [
        Outgoing(
            topics.reply,
            _json(
                {"text": done.reply, "session": session_id, "turn_id": done.turn_id, "interrupted": done.interrupted}
            ),
            retain,
        )
    ]
    stages = done.trace.get("stages_ms", {})
    stage = next((s for s in ("voice_to_voice", "text_to_voice") if s in stages), None)
    decoder = done.trace.get("decoder") or {}
    if stage is not None:
        acceptance = round(100 * decoder["accepted_per_drafted"], 1) if decoder.get("drafted") else None
        latency = {
            "ms": stages[stage],
            "stage": stage,
            "session": session_id,
            "turn_id": done.turn_id,
            "acceptance_pct": acceptance,
            "over_budget": done.trace.get("over_budget", []),
        }
        messages.append(Outgoing(topics.latency, _json(latency), True, Priority.TELEMETRY))
    turn = {
        "session": session_id,
        "turn_id": done.turn_id,
        "transcript": done.transcript,
        "reply": done.reply,
        "interrupted": done.interrupted,
        "trace": done.trace,
    }
    messages.append(Outgoing(topics.turn, _json(turn), priority=Priority.TELEMETRY))
    return messages
