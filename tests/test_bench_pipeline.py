"""`specvoice bench pipeline` as a user runs it, on the small models: one spoken question per mode through the
real listener, LLM and piper; the JSON holds each turn's stages and its early-reply counts, and ``--busy``
keeps a core busy for the run and leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spinners() -> set[str]:
    found = subprocess.run(["pgrep", "-f", "while True: pass"], capture_output=True, text=True).stdout.split()
    return set(found)


def test_bench_pipeline_busy_writes_every_turn_and_stops_its_load(tmp_path):
    before = spinners()
    out = tmp_path / "pipeline.json"
    run = subprocess.run(
        [sys.executable, "-m", "voice.app.cli", "-c", "small", "bench", "pipeline", "--questions", "1", "--busy"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}},
    )
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
