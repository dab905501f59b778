"""`specvoice bench rooms` as a user runs it, on the small config: one request in one room with a fan, both front
ends, through the real listener; `--echo` compares the two echo cancellers; a wrong condition name is a clear
error."""

from __future__ import annotations

import json

from bench_cli import run_bench


def test_bench_rooms_hears_a_request_over_a_fan_with_and_without_the_suppressor(tmp_path):
    out = tmp_path / "rooms.json"
    run = run_bench(
        tmp_path,
        "rooms",
        "--conditions",
        "living-room-3m+fan@10",
        "--voices",
        "1",
        "--per-voice",
        "1",
        "--json",
        str(out),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out.read_text())
    (condition,) = data["results"]
    assert condition == "living-room-3m+fan@10"
    for front_end in ("raw", "denoised"):
        summary = data["results"][condition][front_end]["summary"]
        assert summary["requests"] == 1 and summary["not_heard"] == 0, summary
        assert summary["wer"] <= 0.5, data["results"][condition][front_end]["rows"]
        assert front_end in run.stdout


def test_bench_rooms_compares_the_echo_cancellers(tmp_path):
    out = tmp_path / "echo.json"
    run = run_bench(tmp_path, "rooms", "--echo", "--json", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    echo = json.loads(out.read_text())["echo"]
    assert set(echo) == {"living-room", "kitchen"}
    for by_canceller in echo.values():
        for canceller in ("ours", "webrtc"):
            assert by_canceller[canceller]["erle_db"] > 15, by_canceller  # each takes most of the echo out


def test_bench_rooms_names_what_is_wrong_with_a_condition(tmp_path):
    run = run_bench(tmp_path, "rooms", "--conditions", "attic+fan@10")
    assert run.returncode == 2 and "no room 'attic'" in run.stdout, run.stdout + run.stderr
