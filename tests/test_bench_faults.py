"""`specvoice bench faults` as a user runs it, on the small models: every fault injected for real (a mosquitto
stopped and started, an engine that raises, Wyoming clients that drop their sockets, a `specvoice serve` process
sent SIGTERM and SIGKILL and started again, a model cache on a full disk), and the device recovers from each by
itself."""

from __future__ import annotations

import json

from bench_cli import run_bench


def test_every_fault_is_survived_and_each_command_is_delivered_once_or_reported(tmp_path):
    out = tmp_path / "faults.json"
    run = run_bench(tmp_path, "faults", "--json", str(out), timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    faults = {f["fault"]: f for f in json.loads(out.read_text())["faults"]}
    assert len(faults) == 8, list(faults)
    for fault in faults.values():
        assert not fault["crashed"] and fault["recovery_s"] is not None, fault
    command = faults["broker away during a command"]
    assert command["deliveries"] == "not done, and the user was told; the next command: ['ON']", command
    assert "I lost the connection to the home: the kitchen light was not switched." in command["detail"]["said"]
    assert "not switched" in command["heard"][0], command  # what the device's sound says, transcribed
    engine = faults["engine fails mid-reply"]
    assert "something went wrong" in engine["heard"][0].lower(), engine
    assert any("injected fault" in e for e in engine["detail"]["errors"]), engine
    term = faults["SIGTERM during a reply"]
    assert term["detail"]["rc"] == 0 and "handled" in term["detail"]["events"], term  # the reply finished first
    kill = faults["SIGKILL during a reply"]
    assert kill["detail"]["rc"] == -9 and "handled" not in kill["detail"]["events"], kill
    full = faults["model cache disk full"]
    assert full["heard"][0].startswith("exit 2: specvoice: no space left in the model cache"), full
    assert full["heard"][1] == "left in the full cache: nothing" and full["detail"]["roomy_rc"] == 0, full
    storm = faults["Wyoming client reconnecting 30 times"]
    assert storm["detail"]["open_sessions"][1] == storm["detail"]["open_sessions"][0], storm  # none left open
