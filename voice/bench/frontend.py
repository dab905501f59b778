"""`specvoice bench frontend`: how many conversations one voice front-end holds when its LLM is remote.

A ``specvoice serve`` front-end runs in its own process (VAD, Whisper and piper here, ``llm.backend = "openai"``);
N websocket clients (the openai SDK's realtime client) talk to it at once, each speaking its questions in real
time (espeak, 24 kHz), for N = 1, 2, 4, ... Voice-to-voice is measured by the client, as a user hears it: the
last speech sample sent -> the first reply audio received (the server's endpointing wait included). Then one
client asks and cancels (``response.cancel`` after the first audio) a number of times: cancel -> the LLM request's
connection closed, as the LLM server sees it.

The LLM: with ``--stub`` a stand-in (voice/bench/stub_llm.py) streams a canned reply after ``--ttft-ms`` at
``--tokens-per-s``, costing nothing here, so the figures are the front-end's own with a GPU server's latency
added as stated (default 200 ms and 40 tokens/s per request: the GPU sizing in docs/serving.md assumes a server that
delivers at least that to every conversation); otherwise ``llm.base_url`` names a real server (one on this
machine takes CPU from the front-end: pin it, e.g. ``taskset -c 1``, and say so). Table on stdout, JSON under
bench-results/.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from voice.bench import count, positive, seconds
from voice.bench.stub_llm import StubLLM
from voice.config import config_to_toml
from voice.latency import percentiles
from voice.speechset import espeak_utterance
from voice.tasks import Tasks
from voice.transports.realtime.wire import WIRE_RATE

_drains = Tasks()  # the front-ends' stderr readers (a task nobody keeps can vanish mid-flight)
QUESTIONS = (
    "What is the capital of France?",
    "How far away is the moon?",
    "Give me a quick tip for sleeping better.",
    "Why is the sky blue?",
    "Tell me a fun fact about octopuses.",
    "What should I cook tonight?",
)


async def bench(config, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench frontend")
    p.add_argument("--sessions", default="1,2,4,6", help="concurrent conversations per round, comma-separated")
    p.add_argument("--turns", type=positive, default=3, help="spoken turns per conversation")
    p.add_argument("--stub", action="store_true", help="a stand-in LLM server (no compute) instead of llm.base_url")
    p.add_argument("--ttft-ms", type=seconds, default=200.0, help="--stub: first-token delay")
    p.add_argument("--tokens-per-s", type=seconds, default=40.0, help="--stub: streaming rate per request, in tokens")
    p.add_argument("--cancels", type=count, default=10, help="ask-and-cancel rounds for the cancel latency")
    p.add_argument("--json", default="bench-results/frontend.json")
    args = p.parse_args(argv)
    stub = await StubLLM(args.ttft_ms / 1000.0, args.tokens_per_s).start() if args.stub else None
    config = config.model_copy(deep=True)
    if stub is not None:
        config.llm.base_url, config.llm.metrics_url = stub.base_url, ""
        config.llm.backend = "openai"
    elif config.llm.backend != "openai":
        print("specvoice bench frontend: needs llm.backend = 'openai' and llm.base_url, or --stub", file=sys.stderr)
        return 2
    config.server.port, config.wyoming.enabled, config.mqtt.enabled = _free_port(), False, False
    config.dialog.turn_timeout_s = 300.0
    speech = [_voiced(espeak_utterance(q, rate=WIRE_RATE)) for q in QUESTIONS]
    with tempfile.TemporaryDirectory() as tmp:
        front = await _start_frontend(config, Path(tmp) / "frontend.toml")
        url = f"ws://127.0.0.1:{config.server.port}/v1"
        try:
            rounds = [await _round(url, front, int(n), args.turns, speech) for n in args.sessions.split(",")]
            cancels = await _cancels(url, stub, args.cancels) if stub is not None else []
        finally:
            front.terminate()
            await front.wait()
            if stub is not None:
                await stub.stop()
    llm = f"stub: ttft {args.ttft_ms:g} ms, {args.tokens_per_s:g} tokens/s" if stub else config.llm.base_url
    load = os.getloadavg()
    print(
        f"\nfront-end: {config.models.stt} + {config.models.tts} here, LLM remote ({llm}); {os.cpu_count()} CPUs, "
        f"load average at the end {load[0]:.1f} / {load[1]:.1f} (1 / 5 min)"
    )
    print(
        f"{'sessions':>8s} {'turns':>6s} {'failed':>6s} {'v2v p50 ms':>11s} {'p95':>7s} {'max':>7s} "
        f"{'server v2v p50':>15s} {'front-end CPU':>14s} {'CPU s/turn':>11s}"
    )
    for r in rounds:
        print(
            f"{r['sessions']:8d} {r['turns']:6d} {r['failed']:6d} {r['client_v2v_ms'].get('p50', 0):11.0f} "
            f"{r['client_v2v_ms'].get('p95', 0):7.0f} {r['client_v2v_ms'].get('max', 0):7.0f} "
            f"{r['server_v2v_ms'].get('p50', 0):15.0f} {r['frontend_cpu_cores']:12.2f} c "
            f"{r['frontend_cpu_s_per_turn']:11.2f}"
        )
    held = [r["sessions"] for r in rounds if r["failed"] == 0 and r["client_v2v_ms"].get("p95", 1e9) < 3000]
    print(f"held at p95 voice-to-voice < 3 s: {max(held) if held else 0} sessions (of those tried)")
    if cancels:
        c = percentiles(cancels)
        print(
            f"cancel -> LLM request closed (seen by the LLM server), {len(cancels)} cancels: p50 {c['p50']:.1f} ms, "
            f"p95 {c['p95']:.1f} ms"
        )
    out = {
        "llm": llm,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg": load},
        "config": {"stt": config.models.stt, "tts": config.models.tts},
        "rounds": rounds,
        "cancel_ms": cancels,
        "cancel_summary_ms": percentiles(cancels) if cancels else {},
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
    return 0


def _voiced(samples: np.ndarray) -> np.ndarray:
    """Up to the last voiced sample, so the client's speech end is the user's (espeak pads with silence)."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > 300)
    return samples[: loud[-1] + 1] if len(loud) else samples


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _start_frontend(config, path: Path) -> asyncio.subprocess.Process:
    """``specvoice serve`` on this config, in its own process; returns once it accepts connections."""
    path.write_text(config_to_toml(config))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "voice.app.cli", "-c", str(path), "serve", stderr=asyncio.subprocess.PIPE
    )
    assert proc.stderr is not None
    async with asyncio.timeout(300):
        while b"specvoice serve:" not in (line := await proc.stderr.readline()):
            if not line:
                raise RuntimeError(f"the front-end did not start (exit {await proc.wait()})")
    _drains.spawn(_drain(proc.stderr))  # kept until the front-end exits
    return proc


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


def _client(url: str):
    from openai import AsyncOpenAI

    return AsyncOpenAI(api_key="unused", websocket_base_url=url, base_url=url.replace("ws://", "http://"))


async def _round(url: str, front: asyncio.subprocess.Process, n: int, turns: int, speech: list[np.ndarray]) -> dict:
    cpu = psutil.Process(front.pid)
    before, started = sum(cpu.cpu_times()[:2]), time.monotonic()
    results: list[dict] = []
    order = [[speech[(s + t) % len(speech)] for t in range(turns)] for s in range(n)]
    await asyncio.gather(*(_converse(url, order[s], results) for s in range(n)))
    spent, wall = sum(cpu.cpu_times()[:2]) - before, time.monotonic() - started
    ok = [r for r in results if r.get("status") == "completed" and r.get("client_v2v_ms") is not None]
    return {
        "sessions": n,
        "turns": len(results),
        "failed": len(results) - len(ok),
        "client_v2v_ms": percentiles([r["client_v2v_ms"] for r in ok]),
        "server_v2v_ms": percentiles([r["server_v2v_ms"] for r in ok if r.get("server_v2v_ms") is not None]),
        "frontend_cpu_cores": round(spent / wall, 2),
        "wall_s": round(wall, 1),
        # what a turn costs the front-end whatever else runs on the machine: the load-independent part
        "frontend_cpu_s_per_turn": round(spent / max(1, len(results)), 2),
        "results": results,
    }


async def _converse(url: str, questions: list[np.ndarray], results: list[dict]) -> None:
    """Speak each question in real time (100 ms blocks, then 1.2 s of silence) and time the reply's first audio."""
    async with _client(url).realtime.connect(model="specvoice") as conn:
        await conn.recv_bytes()  # session.created
        for samples in questions:
            audio = np.concatenate([samples, np.zeros(int(1.2 * WIRE_RATE), np.int16)])
            step, speech_end, first_audio = WIRE_RATE // 10, None, None
            result: dict = {}
            for i in range(0, len(audio), step):
                await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + step].tobytes()).decode())
                if speech_end is None and i + step >= len(samples):
                    speech_end = time.monotonic()
                await asyncio.sleep(0.1)
            async with asyncio.timeout(300):
                while True:
                    event = json.loads(await conn.recv_bytes())
                    if event["type"] == "response.output_audio.delta" and first_audio is None:
                        first_audio = time.monotonic()
                    elif event["type"] == "specvoice.latency":
                        result["server_v2v_ms"] = event["trace"]["stages_ms"].get("voice_to_voice")
                    elif event["type"] == "response.done":
                        result["status"] = event["response"]["status"]
                        break
            result["client_v2v_ms"] = (first_audio - speech_end) * 1000 if first_audio and speech_end else None
            results.append(result)


async def _cancels(url: str, stub: StubLLM, count: int) -> list[float]:
    """Ask by text, cancel at the first audio: ms from sending response.cancel to the LLM connection closing."""
    out: list[float] = []
    stub.tokens_per_s, stub.cycle = 10.0, True  # a reply that lasts (~16 s): the cancel always lands mid-stream
    async with _client(url).realtime.connect(model="specvoice") as conn:
        await conn.recv_bytes()
        for _ in range(count):
            closed = len(stub.closed)
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Tell me about Paris."}],
                }
            )
            await conn.response.create()
            try:
                async with asyncio.timeout(60):
                    while json.loads(await conn.recv_bytes())["type"] != "response.output_audio.delta":
                        pass
                    sent = time.monotonic()
                    await conn.response.cancel()
                    while (event := json.loads(await conn.recv_bytes()))["type"] != "response.done":
                        pass
                    if event["response"]["status"] != "cancelled":
                        continue  # it ended before the cancel arrived: nothing to time
                    while len(stub.closed) == closed:
                        await asyncio.sleep(0.005)
            except TimeoutError:
                # a round that never reached audio or response.done: reported, not a crash that loses the rounds
                print(
                    f"cancel round {len(out) + 1}: no reply audio or response.done within 60 s; stopping the "
                    "cancel rounds",
                    file=sys.stderr,
                )
                break
            out.append(round((stub.closed[closed] - sent) * 1000, 2))
    return out


def main(config, args, extra: list[str]) -> int:
    return asyncio.run(bench(config, extra))
