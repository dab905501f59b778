"""The latency trace: stages from marks, budgets, order checks, and replies that started early."""

from __future__ import annotations

import pytest

from voice.latency import LatencyStats, LatencyTrace, percentiles


def trace(marks: dict[str, float], **extra) -> LatencyTrace:
    t = LatencyTrace(1, budget_ms={"voice_to_voice": 1200, "stt_final": 100})
    for name, seconds in marks.items():
        t.mark(name, seconds)
    t.extra.update(extra)
    return t


VOICE = {
    "speech_start": 10.0,
    "speech_end": 12.0,
    "endpoint": 12.5,
    "stt_final": 12.7,
    "llm_first_token": 13.1,
    "first_fragment": 13.6,
    "tts_first_audio": 13.75,
    "playback_start": 13.76,
    "turn_end": 16.0,
}


def test_stages_are_differences_of_marks_and_budgets_flag_the_slow_ones():
    t = trace(VOICE)
    stages = t.stages_ms()
    assert stages["endpointing"] == 500.0 and stages["stt_final"] == 200.0
    assert stages["voice_to_voice"] == pytest.approx(1760.0)
    assert stages["reply_total"] == pytest.approx(3300.0)
    assert t.over_budget() == ["stt_final", "voice_to_voice"]
    assert t.in_order()
    assert t.to_dict()["marks_ms"]["speech_start"] == 0.0


def test_the_first_mark_wins():
    t = trace(VOICE)
    t.mark("first_fragment", 15.0)  # a later fragment does not move it
    assert t.marks["first_fragment"] == 13.6
    with pytest.raises(ValueError, match="unknown latency mark"):
        t.mark("tts_done", 1.0)


def test_a_reply_started_early_waits_zero_for_its_first_token():
    # the early reply's first token came before the endpoint: that stage cost no waiting, not a negative time
    marks = {**VOICE, "llm_first_token": 12.3}
    early = trace(marks, early_reply=True)
    assert early.stages_ms()["llm_first_token"] == 0.0
    assert early.in_order()
    assert not trace(marks).in_order(), "without the early flag, a first token before the endpoint is a bug"


def test_rolling_percentiles():
    stats = LatencyStats(window=3)
    for v2v in (1.0, 2.0, 3.0, 4.0):
        stats.add(trace({"speech_end": 0.0, "playback_start": v2v}))
    summary = stats.summary()["voice_to_voice"]
    assert summary["n"] == 3 and summary["p50"] == 3000.0 and summary["max"] == 4000.0
    assert percentiles([]) == {"n": 0}
