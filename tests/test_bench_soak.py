"""`specvoice bench soak --spoken` as a user runs it, on the small models: spoken turns through the real
listener, recogniser, LLM and piper into one session, a spoken home command delivered through a real mosquitto
to the light's topic, an MQTT ask and a Wyoming transcription between the turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench_cli import ROOT, run_bench


def test_spoken_soak_runs_every_kind_of_user_and_counts_each_command_once(tmp_path):
    out = tmp_path / "soak.json"
    run = run_bench(tmp_path, "soak", "--inputs", "0", "--turns", "0", "--spoken", "10", "--json", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "spoken turns into one home device session: 10 (0 failed)" in run.stdout, run.stdout
    spoken = json.loads(out.read_text())["spoken"]
    assert len(spoken["turns"]) == 10 and spoken["failed_turns"] == 0
    questions = [t for t in spoken["turns"] if not t["command"]]
    assert all(t["reply"].strip() and t["ttft_ms"] > 0 and t["voice_to_voice_ms"] > 0 for t in questions), questions
    (command,) = spoken["commands"]
    assert command["wanted"] == "ON" and command["arrived"] == ["ON"], command
    assert spoken["commands_summary"] == {"said": 1, "delivered once": 1}
    assert spoken["others"] == {"mqtt ask answered": 1, "wyoming transcribe answered": 1}
    assert spoken["logs"].get("tracebacks", 0) == 0, spoken["traceback_samples"]
    assert len(spoken["deciles"]) == 10 and spoken["deciles"][-1]["rss_mb_end"] > 0


def test_spoken_soak_without_mosquitto_is_a_usage_error(tmp_path):
    """No broker installed (its path pointed elsewhere): the flag is refused at once, naming the fix, before
    any model loads."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; import voice.bench.soak_hostile as h; h.MOSQUITTO = '/nonexistent/mosquitto'; "
            "from voice.app.cli import main; sys.argv[0] = 'specvoice'; sys.exit(main())",
            "-c",
            "small",
            "bench",
            "soak",
            "--spoken",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}},
    )
    assert run.returncode == 2 and "apt install mosquitto" in run.stderr, run.stderr[-2000:]
