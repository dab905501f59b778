"""`specvoice bench pipeline` as a user runs it, on the small models: one spoken question per mode through the
real listener, LLM and piper; the JSON holds each turn's stages and its early-reply counts, and ``--busy``
keeps a core busy for the run and leaves no process behind."""

from __future__ import annotations

import json
import subprocess

from bench_cli import run_bench


def spinners() -> set[str]:
    found = subprocess.run(["pgrep", "-f", "while True: pass"], capture_output=True, text=True).stdout.split()
    return set(found)


def test_bench_pipeline_busy_writes_every_turn_and_stops_its_load(tmp_path):
    before = spinners()
    out = tmp_path / "pipeline.json"
    run = run_bench(tmp_path, "pipeline", "--questions", "1", "--busy", "--json", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "one core kept busy" in run.stdout and "early replies" in run.stdout, run.stdout
    data = json.loads(out.read_text())
    assert data["busy_core"] is True
    for mode in ("speculative", "target alone"):
        (turn,) = data["turns"][mode]
        assert turn["stages_ms"]["voice_to_voice"] > 0 and turn["reply"].strip()
        assert set(turn["early_replies"]) == {"started", "adopted"}
        assert turn["early_replies"]["adopted"] <= turn["early_replies"]["started"]
    assert spinners() <= before, "the busy process was left running"


def test_bench_pipeline_in_a_room_times_the_answer_from_the_true_end_of_the_question(tmp_path):
    """`--conditions`: the question is played in each listening condition; every turn names its condition and is
    timed from the end of the question as spoken, on the same clock as the trace (so in the quiet it agrees with
    the trace's own voice-to-voice within the VAD's hangover)."""
    out = tmp_path / "pipeline.json"
    run = run_bench(
        tmp_path, "pipeline", "--questions", "1", "--conditions", "clean,living-room-3m+fan@10", "--json", str(out)
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "end->voice p50" in run.stdout and "voiced" in run.stdout and "living-room-3m+fan@10" in run.stdout, (
        run.stdout
    )
    data = json.loads(out.read_text())
    assert data["conditions"] == ["clean", "living-room-3m+fan@10"]
    for mode in ("speculative", "target alone"):
        turns = data["turns"][mode]
        assert [t["condition"] for t in turns] == data["conditions"]
        clean = turns[0]
        timed, traced = clean["said_end_to_voice_ms"], clean["stages_ms"]["voice_to_voice"]
        assert timed > 0 and abs(timed - traced) < 1000, clean
        assert clean["wer"] < 0.5, clean["transcript"]


def test_bench_pipeline_refuses_an_unknown_condition_before_loading_a_model(tmp_path):
    run = run_bench(tmp_path, "pipeline", "--conditions", "attic+fan@10", timeout=120)
    assert run.returncode == 2 and "no room 'attic'" in run.stderr, run.stdout + run.stderr
