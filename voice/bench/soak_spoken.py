"""The spoken part of `specvoice bench soak` (``--spoken N``): a home device's week, compressed.

N questions are spoken (piper, the assistant's own voice) into one long-lived session, as a microphone would
play them: the real listener, the real recogniser, the configured LLM, piper into a sink nobody hears. The
session's history grows and is trimmed as it would be on a shelf. Between the spoken turns the other users
come in as they do at home: every tenth turn is a spoken home command (the kitchen light, through the MQTT
bridge to a real mosquitto, counted where a light would receive it), and after some turns an MQTT client asks
a question and a Wyoming client has a recording transcribed.

Measured per decile of turns: time to first token and voice to voice (p50, p95), and this process's resident
memory; at the end, the memory at rest once every session is closed, the history trims, the errors, and each
command's deliveries (exactly one is right; none, or two, is a fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
import wave
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from audio.sinks import WavSink
from voice.assistant import Assistant
from voice.config import Config
from voice.config_servers import HomeDeviceConfig
from voice.events import Event, TurnDone
from voice.latency import percentiles
from voice.tasks import cancel_and_wait, start
from voice.wavturn import ends_into, play, synthesize_question, turn_ended

LIGHT = HomeDeviceConfig.model_validate(
    {"name": "kitchen light", "topic": "home/kitchen/light/set", "payloads": ["ON", "OFF"], "area": "kitchen"}
)
COMMANDS = (("Turn on the kitchen light.", "ON"), ("Turn off the kitchen light.", "OFF"))
COMMAND_EVERY = 10  # one turn in ten is a home command
MQTT_ASK_AFTER, WYOMING_AFTER = 4, 7  # within each ten turns, after which one the other clients come
DELIVERY_WAIT_S = 3.0  # a command's message has this long to reach the light after its turn ended


def with_the_light(config: Config) -> Config:
    """``config`` with the kitchen light among the home's devices (its topic joins the allow-list)."""
    config = config.model_copy(deep=True)
    if all(d.topic != LIGHT.topic for d in config.mqtt.devices):
        config.mqtt.devices = [*config.mqtt.devices, LIGHT]
    return config


class Light:
    """Where the kitchen light would be: a client subscribed to its topic, counting what arrives."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.received: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()  # subscribed on the broker now

    async def __aenter__(self) -> Light:
        self._task = start(self._listen(), name="soak light")
        async with asyncio.timeout(30):
            await self.connected.wait()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await cancel_and_wait(self._task)

    async def _listen(self) -> None:
        """As a light's firmware does: subscribe, and when the broker goes away, connect again until it is back."""
        import aiomqtt

        while True:
            try:
                async with aiomqtt.Client("127.0.0.1", self.port, identifier="specvoice-soak-light") as client:
                    await client.subscribe(LIGHT.topic, qos=1)
                    self.connected.set()
                    async for message in client.messages:
                        self.received.append(bytes(message.payload).decode(errors="replace"))
            except aiomqtt.MqttError:
                self.connected.clear()
                await asyncio.sleep(0.2)

    async def deliveries_after(self, before: int) -> list[str]:
        """What arrived since ``before`` messages, once ``DELIVERY_WAIT_S`` has passed (a duplicate would come
        late)."""
        await asyncio.sleep(DELIVERY_WAIT_S)
        return self.received[before:]


async def mqtt_ask(port: int, prefix: str, text: str, ident: str) -> dict[str, Any]:
    """Ask on ``<prefix>/ask`` as a home automation would and wait for the answer; how long it took."""
    import aiomqtt

    started = time.monotonic()
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"specvoice-soak-{ident}") as client:
        await client.subscribe([(f"{prefix}/answer", 1), (f"{prefix}/error", 1)])
        await client.publish(f"{prefix}/ask", json.dumps({"text": text, "id": ident, "speak": False}), qos=1)
        async with asyncio.timeout(120):
            async for message in client.messages:
                data = json.loads(bytes(message.payload))
                if data.get("id") == ident:
                    ok = message.topic.matches(f"{prefix}/answer") and bool(data.get("reply"))
                    return {"ok": ok, "ms": round(1000 * (time.monotonic() - started))}
    raise AssertionError("unreachable")


async def wyoming_transcribe(port: int, wav_path: Path) -> dict[str, Any]:
    """A Wyoming client (the wyoming package's own) has a recording transcribed, as Home Assistant's does."""
    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioStart, AudioStop, wav_to_chunks
    from wyoming.client import AsyncTcpClient

    started = time.monotonic()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(language="en").event())
        with wave.open(str(wav_path), "rb") as wav:
            await client.write_event(AudioStart(rate=wav.getframerate(), width=2, channels=1).event())
            for chunk in wav_to_chunks(wav, samples_per_chunk=wav.getframerate() // 10):
                await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        async with asyncio.timeout(120):
            while (event := await client.read_event()) is not None:
                if Transcript.is_type(event.type):
                    text = Transcript.from_event(event).text
                    return {"ok": bool(text.strip()), "ms": round(1000 * (time.monotonic() - started))}
                if event.type == "error":
                    return {"ok": False, "ms": round(1000 * (time.monotonic() - started))}
    return {"ok": False, "ms": None}


async def spoken_phase(
    assistant: Assistant, config: Config, prompts: tuple[str, ...], turns: int, rss: Callable[[], tuple[float, float]]
) -> dict[str, Any]:
    """``turns`` spoken turns into one session, with the bridge and the Wyoming server of ``config`` (already
    serving, MQTT on a real broker) used between them. ``rss`` samples this process's memory."""
    from voice.transports.mqtt.bridge import MqttBridge  # only when MQTT is on

    finished: asyncio.Queue[Event | None] = asyncio.Queue()
    sink = WavSink(None, assistant.tts_sample_rate, realtime=False)
    session = assistant.session(ends_into(finished), sink=sink, name="soak device")
    bridge = MqttBridge(config, assistant)
    bridge.add_local(session)
    rows: list[dict[str, Any]] = []
    commands: list[dict[str, Any]] = []
    others: Counter[str] = Counter()
    other_ms: dict[str, list[float]] = {"mqtt ask": [], "wyoming transcribe": []}
    from voice.server import serve

    stop, ready = asyncio.Event(), asyncio.Event()
    server = start(serve(config, ready=ready, assistant=assistant, stop=stop, mqtt=bridge), name="serve")
    try:
        await asyncio.wait({server, start(ready.wait())}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # its startup error
        async with asyncio.timeout(30):
            await bridge.connected.wait()
        with tempfile.TemporaryDirectory() as tmp:
            wavs = {t: synthesize_question(assistant, t, Path(tmp) / f"q{i}.wav") for i, t in enumerate(prompts)}
            wavs |= {t: synthesize_question(assistant, t, Path(tmp) / f"c{i}.wav") for i, (t, _) in enumerate(COMMANDS)}
            async with Light(config.mqtt.port) as light:
                for i in range(turns):
                    command = COMMANDS[(i // COMMAND_EVERY) % 2] if i % COMMAND_EVERY == COMMAND_EVERY - 1 else None
                    text = command[0] if command else prompts[i % len(prompts)]
                    before = len(light.received)
                    await play(session, wavs[text])
                    done = await turn_ended(finished)
                    sink.played.clear()  # a sink nobody hears keeps nothing (else it would grow the RSS measured)
                    rows.append(_row(i, text, command is not None, done, session, rss()))
                    if command is not None:
                        got = await light.deliveries_after(before)
                        commands.append({"turn": i + 1, "said": text, "wanted": command[1], "arrived": got})
                    if i % COMMAND_EVERY == MQTT_ASK_AFTER:
                        result = await mqtt_ask(config.mqtt.port, config.mqtt.prefix, prompts[i % 7], f"soak-{i}")
                        others[f"mqtt ask {'answered' if result['ok'] else 'failed'}"] += 1
                        other_ms["mqtt ask"].append(result["ms"])
                    if i % COMMAND_EVERY == WYOMING_AFTER:
                        result = await wyoming_transcribe(config.wyoming.port, wavs[text])
                        others[f"wyoming transcribe {'answered' if result['ok'] else 'failed'}"] += 1
                        if result["ms"] is not None:
                            other_ms["wyoming transcribe"].append(result["ms"])
        trims = getattr(session.conversation, "trims", None)
    finally:
        await session.close()
        sink.close()
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server, 60)
    return {
        "turns": rows,
        "failed_turns": sum(r["failed"] for r in rows),
        "trims": trims,
        "deciles": _deciles(rows),
        "commands": commands,
        "commands_summary": _commands_summary(commands),
        "others": dict(others),
        "others_ms": {k: percentiles(v) for k, v in other_ms.items()},
    }


def _row(
    i: int, said: str, command: bool, done: TurnDone | None, session: Any, rss: tuple[float, float]
) -> dict[str, Any]:
    if done is None:
        return {"turn": i + 1, "said": said, "command": command, "failed": True, "rss_mb": round(rss[0], 1)}
    decoder = done.trace.get("decoder") or {}
    return {
        "turn": i + 1,
        "said": said,
        "heard": done.transcript,
        "reply": done.reply,
        "command": command,
        "failed": False,
        "ttft_ms": round(1000 * decoder["ttft_s"], 1) if decoder else None,  # None: answered without the LLM
        "voice_to_voice_ms": done.trace["stages_ms"].get("voice_to_voice"),
        "prompt_tokens": decoder.get("prompt_tokens"),
        "history_messages": len(session.history),
        "trims": getattr(session.conversation, "trims", None),  # so far: a slow first token after one is a trim
        "rss_mb": round(rss[0], 1),
    }


def _deciles(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    n = len(rows)
    for d in range(10):
        part = rows[d * n // 10 : (d + 1) * n // 10]
        if not part:
            continue
        out.append(
            {
                "decile": d + 1,
                "turns": f"{part[0]['turn']}-{part[-1]['turn']}",
                "ttft_ms": percentiles([r["ttft_ms"] for r in part if r.get("ttft_ms") is not None]),
                "voice_to_voice_ms": percentiles(
                    [r["voice_to_voice_ms"] for r in part if r.get("voice_to_voice_ms") is not None]
                ),
                "prompt_tokens_p50": percentiles([r["prompt_tokens"] for r in part if r.get("prompt_tokens")]).get(
                    "p50"
                ),
                "rss_mb_end": part[-1]["rss_mb"],
                "failed": sum(r["failed"] for r in part),
            }
        )
    return out


def _commands_summary(commands: list[dict[str, Any]]) -> dict[str, int]:
    """Each spoken command's deliveries to the light: once and right, never, twice or more, or the wrong payload
    (a mis-heard on/off)."""
    summary: Counter[str] = Counter()
    for c in commands:
        arrived = c["arrived"]
        if not arrived:
            summary["not delivered"] += 1
        elif len(arrived) > 1:
            summary["delivered more than once"] += 1
        elif arrived[0] != c["wanted"]:
            summary["wrong payload"] += 1
        else:
            summary["delivered once"] += 1
    return {"said": len(commands)} | dict(summary)


def ratio_of_p95(deciles: list[dict[str, Any]], key: str) -> float | None:
    """p95 of ``key`` in the last decile over the first (1.0: no slower at the end)."""
    if len(deciles) < 2 or not deciles[0][key].get("p95") or not deciles[-1][key].get("p95"):
        return None
    return round(deciles[-1][key]["p95"] / deciles[0][key]["p95"], 2)


def print_spoken(report: dict[str, Any]) -> None:
    deciles = report["deciles"]
    print(f"\nspoken turns into one home device session: {len(report['turns'])} ({report['failed_turns']} failed)")
    heads = ("decile", "turns", "ttft p50", "p95", "v2v p50", "p95", "prompt", "RSS MB")
    print("  " + " ".join(f"{h:>{w}s}" for h, w in zip(heads, (6, 8, 9, 6, 8, 6, 7, 7), strict=True)))
    for d in deciles:
        t, v = d["ttft_ms"], d["voice_to_voice_ms"]
        print(
            f"  {d['decile']:6d} {d['turns']:>8s} {t.get('p50', float('nan')):9.0f} {t.get('p95', float('nan')):6.0f} "
            f"{v.get('p50', float('nan')):8.0f} {v.get('p95', float('nan')):6.0f} "
            f"{d['prompt_tokens_p50'] or 0:7.0f} {d['rss_mb_end']:7.0f}"
        )
    print(
        f"  last decile / first, p95: time to first token {ratio_of_p95(deciles, 'ttft_ms')} (goal <= 1.3), "
        f"voice to voice {ratio_of_p95(deciles, 'voice_to_voice_ms')}; history trims {report['trims']}"
    )
    c = report["commands_summary"]
    print("  spoken commands to the light: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    ms = report["others_ms"]
    print(
        "  other clients between turns: "
        + ", ".join(f"{k} {v}" for k, v in sorted(report["others"].items()))
        + f" (mqtt ask p50 {ms['mqtt ask'].get('p50')} ms, wyoming transcribe p50 "
        f"{ms['wyoming transcribe'].get('p50')} ms)"
    )
