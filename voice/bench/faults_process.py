"""The faults of `specvoice bench faults` that happen to a whole process: a `specvoice serve` sent SIGTERM or
SIGKILL while it streams a Wyoming answer and started again, and `specvoice models prepare` on a full disk. Also
the row every fault fills in (``Outcome``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voice.bench.soak import free_port

ANSWERED = "Tell me a fun fact about octopuses."  # a voice reply's length: it fits in the shutdown grace
RECOVERY_LIMIT_S = 180.0  # a fault not recovered from within this long counts as not recovered


@dataclass
class Outcome:
    """One fault's row."""

    fault: str
    heard: list[str] = field(default_factory=list)  # the home device's words, or what the client saw
    deliveries: str = "-"  # a command's fate at the light
    crashed: bool = False
    recovery_s: float | None = None  # None: it never worked again within RECOVERY_LIMIT_S
    detail: dict[str, Any] = field(default_factory=dict)


class ServeProcess:
    """`specvoice serve` with Wyoming on a free port, as systemd runs it (same config flags as this bench)."""

    def __init__(self, cli_args: list[str], log: Path) -> None:
        self.port = free_port()
        self.cmd = [
            sys.executable,
            "-m",
            "voice.app.cli",
            *cli_args,
            *("--set", "wyoming.enabled=true", "--set", f"wyoming.port={self.port}"),
            *("--set", f"server.port={free_port()}", "--set", "mqtt.enabled=false"),
            "serve",
        ]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log.open("ab"), env=env)

    async def answered(self, timeout_s: float = RECOVERY_LIMIT_S) -> bool:
        """Whether a Wyoming `handle` gets an answer within ``timeout_s`` (the models load first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            events: list[tuple[str, float]] = []
            with contextlib.suppress(OSError, asyncio.IncompleteReadError, TimeoutError):
                await asyncio.wait_for(handle(self.port, "Say hi.", events), 60)
            if any(e == "handled" for e, _ in events):
                return True
            await asyncio.sleep(0.5)
        return False


async def handle(
    port: int, text: str, got: list[tuple[str, float]], on_first_chunk: Callable[[], None] | None = None
) -> None:
    """A Wyoming `handle` request (Home Assistant's conversation agent); the events it gets go into ``got``
    (type, when), until the stream's end or the connection's."""
    from wyoming.asr import Transcript
    from wyoming.client import AsyncTcpClient

    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcript(text).event())
        while (event := await client.read_event()) is not None:
            got.append((event.type, time.monotonic()))
            if event.type == "handled-chunk" and on_first_chunk is not None:
                on_first_chunk()
                on_first_chunk = None
            if event.type == "handled-stop":
                break


async def signalled(cli_args: list[str], sig: signal.Signals, tmp: Path) -> Outcome:
    name = signal.Signals(sig).name
    out = Outcome(f"{name} during a reply")
    serve = ServeProcess(cli_args, tmp / f"serve-{name}.log")
    serve.start()
    assert serve.proc is not None
    if not await serve.answered():
        out.crashed, out.heard = True, ["the server never answered before the fault"]
        serve.proc.kill()
        return out
    proc = serve.proc
    sent_at: list[float] = []

    def send() -> None:
        sent_at.append(time.monotonic())
        proc.send_signal(sig)

    events: list[tuple[str, float]] = []
    try:
        await asyncio.wait_for(handle(serve.port, ANSWERED, events, send), 120)
        closed = "the stream ended"
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        closed = f"the connection broke ({type(exc).__name__})"
    rc = await asyncio.to_thread(proc.wait, 60)
    exited = time.monotonic()
    chunks = sum(e == "handled-chunk" for e, _ in events)
    finished = next((t for e, t in events if e == "handled"), None)
    end = "no end of the answer"
    if finished is not None:
        end = f"the whole answer {finished - sent_at[0]:.1f} s after the signal" if sent_at else "the whole answer"
    out.heard = [
        f"{chunks} chunks, then {end}; {closed}",
        f"the process exited {rc} after {exited - sent_at[0]:.1f} s" if sent_at else "no chunk came",
    ]
    graceful = sig == signal.SIGTERM
    tracebacks = "Traceback" in serve.log.read_text(errors="replace")
    out.crashed = (graceful and (rc != 0 or finished is None)) or tracebacks
    serve.start()  # systemd's Restart= (on-failure for the kill; `systemctl restart` for a stop)
    assert serve.proc is not None
    works = await serve.answered()
    out.recovery_s = round(time.monotonic() - exited, 2) if works else None
    out.detail = {"rc": rc, "events": [e for e, _ in events], "log_tail": serve.log.read_text()[-1500:]}
    serve.proc.terminate()
    await asyncio.to_thread(serve.proc.wait, 60)
    return out


async def disk_full(cli_args: list[str], tmp: Path) -> Outcome:
    """`specvoice models prepare` with the model cache on a 2 MB tmpfs (mounting needs root, as CI runs), then
    into a folder with room: the first is one clear line and leaves nothing half-written; the second works."""
    out = Outcome("model cache disk full")
    tiny, roomy = tmp / "tiny", tmp / "roomy"
    tiny.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(tiny)], capture_output=True)
    if mounted.returncode != 0:
        out.crashed, out.heard = True, [f"not run: cannot mount a small tmpfs ({mounted.stderr.decode().strip()})"]
        return out
    try:
        full = await _prepare(cli_args, tiny)
        left = [p.name for p in tiny.iterdir() if not p.name.endswith(".lock")]
    finally:
        subprocess.run(["umount", str(tiny)], capture_output=True)
    cleared = time.monotonic()
    again = await _prepare(cli_args, roomy)
    error = full.stderr.strip().splitlines()[-1] if full.stderr.strip() else ""
    out.heard = [f"exit {full.returncode}: {error}", f"left in the full cache: {left or 'nothing'}"]
    out.crashed = full.returncode != 2 or "Traceback" in full.stderr or bool(left)
    out.recovery_s = round(time.monotonic() - cleared, 2) if again.returncode == 0 else None
    out.detail = {"full": full.stderr[-1500:], "roomy_rc": again.returncode, "roomy_stderr": again.stderr[-1500:]}
    return out


async def _prepare(cli_args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "voice.app.cli", *cli_args, "models", "prepare", "smart-turn-v3.2"]
    env = {**os.environ, "SPECVOICE_CACHE": str(cache), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=600, env=env)
