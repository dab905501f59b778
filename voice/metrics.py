"""Prometheus metrics for ``specvoice serve``: per-stage latency histograms, speculative acceptance, sessions.

Why a private registry: tests run several servers in one process, and the library's global registry refuses a
second metric of the same name. Turn metrics come from ``Assistant.add_listener`` (so MQTT sessions count too);
the transports report their own sessions and protocol errors. ``render()`` is the Prometheus text format, served
at ``/metrics`` on the websocket port (and on ``server.metrics_port`` when set).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from voice.events import Event, TurnDone, TurnError

CONTENT_TYPE = CONTENT_TYPE_LATEST
# latency buckets in seconds: 25 ms (a fast stage) .. 30 s (a queued turn on a busy CPU)
_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0)
_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Metrics:
    """Every metric the server exports, in one registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.stage_seconds = Histogram(
            "specvoice_stage_seconds",
            "Latency of each turn stage (see the README's latency trace)",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.over_budget = Counter(
            "specvoice_stage_over_budget_total", "Turns in which a stage exceeded its budget", ["stage"], registry=r
        )
        self.turns = Counter("specvoice_turns_total", "Finished turns", ["outcome"], registry=r)
        self.turn_errors = Counter("specvoice_turn_errors_total", "Turns that failed, by stage", ["stage"], registry=r)
        self.sessions = Gauge("specvoice_sessions", "Open sessions", ["transport"], registry=r)
        self.sessions_opened = Counter("specvoice_sessions_opened_total", "Sessions opened", ["transport"], registry=r)
        self.rejected = Counter(
            "specvoice_connections_rejected_total",
            "Connections refused (token, limit, ...)",
            ["transport", "reason"],
            registry=r,
        )
        self.protocol_errors = Counter(
            "specvoice_protocol_errors_total", "Error events sent to clients", ["transport", "code"], registry=r
        )
        self.drafted = Counter("specvoice_spec_drafted_tokens_total", "Draft tokens proposed to the target", registry=r)
        self.accepted = Counter("specvoice_spec_accepted_tokens_total", "Draft tokens the target accepted", registry=r)
        self.generated = Counter("specvoice_generated_tokens_total", "Tokens emitted by the decoder", registry=r)
        self.acceptance = Histogram(
            "specvoice_spec_acceptance_ratio", "Accepted / drafted tokens per turn", buckets=_RATIO_BUCKETS, registry=r
        )
        self.tokens_per_call = Histogram(
            "specvoice_spec_tokens_per_target_call",
            "Mean tokens committed per verifying target pass, per turn",
            buckets=(1, 1.5, 2, 2.5, 3, 4, 5, 6, 8),
            registry=r,
        )
        # a remote LLM server's own speculative decoding (llm.backend = "openai"), next to ours: its cumulative
        # counters as last read from its /metrics (vLLM), and whether it reports them at all
        self.server_spec_reported = Gauge(
            "specvoice_server_spec_reported",
            "1 when the remote LLM server reports speculative-decoding counters, 0 when it does not",
            registry=r,
        )
        self.server_spec = Gauge(
            "specvoice_server_spec_tokens",
            "The remote LLM server's speculative-decoding counters as last read (server-wide)",
            ["kind"],
            registry=r,
        )

    # ---- feeding -----------------------------------------------------------------------------------------------

    def on_event(self, session_id: str, event: Event) -> None:
        """``Assistant.add_listener`` callback: every session's events."""
        if isinstance(event, TurnDone):
            self.observe_trace(event.trace, interrupted=event.interrupted)
        elif isinstance(event, TurnError):
            self.turn_errors.labels(event.stage).inc()

    def observe_trace(self, trace: dict[str, Any], *, interrupted: bool) -> None:
        self.turns.labels("interrupted" if interrupted else "completed").inc()
        for stage, ms in (trace.get("stages_ms") or {}).items():
            self.stage_seconds.labels(stage).observe(ms / 1000.0)
        for stage in trace.get("over_budget") or []:
            self.over_budget.labels(stage).inc()
        decoder = trace.get("decoder") or {}
        drafted, accepted = decoder.get("drafted"), decoder.get("accepted")
        if isinstance(drafted, (int, float)) and isinstance(accepted, (int, float)):
            self.drafted.inc(drafted)
            self.accepted.inc(accepted)
            if drafted > 0:
                self.acceptance.observe(accepted / drafted)
        tokens, per_call = decoder.get("new_tokens"), decoder.get("mean_accepted_length")
        if isinstance(tokens, (int, float)):
            self.generated.inc(tokens)
        if isinstance(per_call, (int, float)) and per_call > 0:
            self.tokens_per_call.observe(per_call)
        server = decoder.get("server_spec")
        if isinstance(server, dict):
            self.server_spec_reported.set(1 if server.get("reported") else 0)
            for kind in ("drafts", "draft_tokens", "accepted_tokens"):
                if isinstance(server.get(kind), (int, float)):
                    self.server_spec.labels(kind).set(server[kind])

    def session_opened(self, transport: str) -> None:
        self.sessions.labels(transport).inc()
        self.sessions_opened.labels(transport).inc()

    def session_closed(self, transport: str) -> None:
        self.sessions.labels(transport).dec()

    # ---- reading -----------------------------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry)
