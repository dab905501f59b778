"""The per-turn latency trace: marks on one monotonic clock, stages as differences of marks, budgets.

Voice-to-voice is ``speech_end -> playback_start``: it includes the endpointing wait, as the user feels it.
Every mark is ``time.monotonic()`` seconds; audio marks (speech_start/speech_end) come from the audio
timestamps, not from when the code happened to look at them.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

MARKS = (
    "turn_start",  # a text turn arrived (text turns have no speech marks)
    "speech_start",
    "speech_end",  # last voiced sample
    "endpoint",  # the VAD decided the turn was over
    "stt_final",
    "llm_first_token",
    "first_fragment",  # first speakable fragment handed to TTS
    "tts_first_audio",
    "playback_start",  # first audible sample handed to the device (or to the transport)
    "turn_end",
)

# stage name -> (candidate start marks, first present wins; end mark)
STAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "endpointing": (("speech_end",), "endpoint"),
    "stt_final": (("endpoint",), "stt_final"),
    "llm_first_token": (("stt_final", "turn_start"), "llm_first_token"),
    "first_fragment": (("llm_first_token",), "first_fragment"),
    "tts_first_audio": (("first_fragment",), "tts_first_audio"),
    "playback_start": (("tts_first_audio",), "playback_start"),
    "voice_to_voice": (("speech_end",), "playback_start"),
    "text_to_voice": (("turn_start",), "playback_start"),
    "reply_total": (("stt_final", "turn_start"), "turn_end"),
}


@dataclass
class LatencyTrace:
    turn_id: int
    budget_ms: dict[str, float] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. decoder stats, interrupted flag

    def mark(self, name: str, t: float) -> None:
        """Record a mark once: the first time wins (later fragments do not move ``first_fragment``)."""
        if name not in MARKS:
            raise ValueError(f"unknown latency mark {name!r}; known: {', '.join(MARKS)}")
        self.marks.setdefault(name, t)

    def stages_ms(self) -> dict[str, float]:
        out = {}
        for stage, (starts, end) in STAGES.items():
            start = next((s for s in starts if s in self.marks), None)
            if start is not None and end in self.marks:
                # a reply started early (on the pause transcript) can have its first token before the final
                # transcript: that stage then cost no waiting at all, which is 0, not a negative time
                out[stage] = round(max(0.0, self.marks[end] - self.marks[start]) * 1000.0, 1)
        return out

    def over_budget(self) -> list[str]:
        stages = self.stages_ms()
        return [s for s, ms in stages.items() if s in self.budget_ms and ms > self.budget_ms[s]]

    def in_order(self) -> bool:
        """True when the marks that are present follow the pipeline order (a sanity check for tests and logs)."""
        early = self.extra.get("early_reply", False)  # its first token may come before endpoint and stt_final
        present = [
            self.marks[m]
            for m in MARKS
            if m in self.marks and m != "turn_start" and not (early and m == "llm_first_token")
        ]
        return all(a <= b + 1e-6 for a, b in zip(present, present[1:], strict=False))

    def to_dict(self) -> dict[str, Any]:
        origin = min(self.marks.values()) if self.marks else 0.0
        return {
            "turn_id": self.turn_id,
            "origin_t": origin,  # the marks' zero on the audio clock (monotonic s), to set them against a recording
            "marks_ms": {
                k: round((v - origin) * 1000.0, 1) for k, v in sorted(self.marks.items(), key=lambda kv: kv[1])
            },
            "stages_ms": self.stages_ms(),
            "over_budget": self.over_budget(),
            "budget_ms": dict(self.budget_ms),
            **self.extra,
        }


class LatencyStats:
    """Rolling p50/p95 per stage over the last ``window`` turns."""

    def __init__(self, window: int = 200) -> None:
        self._samples: dict[str, deque[float]] = {}
        self._window = window

    def add(self, trace: LatencyTrace) -> None:
        for stage, ms in trace.stages_ms().items():
            self._samples.setdefault(stage, deque(maxlen=self._window)).append(ms)

    def summary(self) -> dict[str, dict[str, float]]:
        return {stage: percentiles(list(values)) for stage, values in self._samples.items()}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        # nearest-rank percentile: honest for the small samples a voice benchmark has
        return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]

    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 1),
        "p95": round(pick(0.95), 1),
        "max": round(ordered[-1], 1),
    }


def format_table(traces: list[LatencyTrace]) -> str:
    """A per-stage table: one column per turn, then p50/p95 and the budget."""
    stages = [s for s in STAGES if any(s in t.stages_ms() for t in traces)]
    head = f"{'stage (ms)':18s}" + "".join(f"{'turn ' + str(t.turn_id):>10s}" for t in traces)
    head += f"{'p50':>9s}{'p95':>9s}{'budget':>9s}"
    lines = [head, "-" * len(head)]
    for stage in stages:
        values = [t.stages_ms().get(stage) for t in traces]
        cells = "".join(f"{'-' if v is None else f'{v:.0f}':>10s}" for v in values)
        stats = percentiles([v for v in values if v is not None])
        budget = traces[0].budget_ms.get(stage) if traces else None
        flag = " !" if budget is not None and stats.get("p50", 0) > budget else ""
        lines.append(
            f"{stage:18s}{cells}{stats.get('p50', 0):9.0f}{stats.get('p95', 0):9.0f}"
            f"{'-' if budget is None else f'{budget:.0f}':>9s}{flag}"
        )
    return "\n".join(lines)
