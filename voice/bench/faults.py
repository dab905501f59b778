"""`specvoice bench faults`: the faults a home device meets on a shelf, injected while turns run. Table + JSON.

In this process: the assistant (the config's models) serving Wyoming and MQTT on a throwaway mosquitto, a home
device session that questions are spoken into (as in ``bench soak --spoken``), and a kitchen light that is a
client of the broker. Each fault is injected around a turn, then plain turns are tried until one works:

    broker away during a command     mosquitto stopped, "turn on the kitchen light" spoken, mosquitto started
    broker restarted during a turn   mosquitto stopped and started while a question is heard and answered
    engine fails mid-reply           the LLM engine raises after its first tokens, for one turn
    Wyoming client gone mid-stream   a client sends half a recording and drops its connection
    Wyoming client reconnecting      30 clients in a row leave halfway through a recording (Home Assistant
                                     reconnecting); the server's /metrics must count no session left open
    SIGTERM during a reply           a `specvoice serve` process streams a Wyoming answer and gets SIGTERM
    SIGKILL during a reply           the same with SIGKILL; started again, as systemd's Restart= would
    model cache disk full            `specvoice models prepare` into a 2 MB tmpfs (needs root), then into room

The last three run in processes of their own (faults_process.py).
For each: what the user heard (the home device's words) or the client saw, the light's deliveries (a command
arrives once, or is reported as not done; never twice, never late, never silently lost), whether anything
crashed (a traceback logged, the server stopped, a process that did not exit cleanly), and the seconds from the
fault's end to the end of the first turn that worked again (that turn's own length included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.sinks import WavSink
from audio.wavfile import read_wav
from voice.assistant import Assistant
from voice.bench import soak_hostile as hostile
from voice.bench import soak_spoken as spoken
from voice.bench.faults_process import RECOVERY_LIMIT_S, Outcome, disk_full, signalled
from voice.bench.soak import LogCounter, quiet_console, serving, with_broker
from voice.config import Config
from voice.events import Event, TurnDone, TurnError
from voice.tasks import start
from voice.wavturn import play, synthesize_question

QUESTION = "What is the capital of France?"
COMMAND = "Turn on the kitchen light."
SETTLE_S = 3.0  # after a turn, how long to keep listening for what the device says next (a command's fate)


@dataclass
class Seen:
    """What came of one spoken turn."""

    said: list[str] = field(default_factory=list)  # the device's replies, as text
    errors: list[str] = field(default_factory=list)  # "stage: message" of each TurnError
    heard: str = ""  # the device's sound, transcribed: what a person in the room heard

    @property
    def worked(self) -> bool:
        return bool(self.said) and not self.errors and all(self.said)


class Rig:
    """The running assistant, its servers, the broker, the light, and the home device's session."""

    def __init__(self, assistant: Assistant, config: Config, broker: hostile.Mosquitto, tmp: Path) -> None:
        from voice.transports.mqtt.bridge import MqttBridge  # only when MQTT is on

        self.assistant, self.config, self.broker = assistant, config, broker
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.sink = WavSink(None, assistant.tts_sample_rate, realtime=False)
        self.session = assistant.session(self.events.put_nowait, sink=self.sink, name="faults device")
        self.bridge = MqttBridge(config, assistant)
        self.bridge.add_local(self.session)
        self.light = spoken.Light(broker.port)
        self.wavs = {t: synthesize_question(assistant, t, tmp / f"q{i}.wav") for i, t in enumerate((QUESTION, COMMAND))}

    async def spoken_turn(self, text: str, settle_s: float = SETTLE_S) -> Seen:
        """Speak ``text`` into the device and keep listening until it has been quiet for ``settle_s``: its
        replies (an announcement after the turn too), its errors, and its sound as a person would hear it
        (transcribed)."""
        while not self.events.empty():
            self.events.get_nowait()
        self.sink.played.clear()  # nobody keeps what the device said before
        await play(self.session, self.wavs[text])
        seen = Seen()
        while True:
            try:
                async with asyncio.timeout(settle_s if seen.said or seen.errors else 120):
                    event = await self.events.get()
            except TimeoutError:
                break
            if isinstance(event, TurnDone):
                seen.said.append(event.reply)
            elif isinstance(event, TurnError):
                seen.errors.append(f"{event.stage}: {event.message}")
        sound = self.sink.audio
        if len(sound):
            rate = self.assistant.tts_sample_rate
            seen.heard = (await self.assistant.stt.transcribe(resample(sound, rate, SPEECH_RATE))).strip()
        return seen

    async def until_a_turn_works(self, since: float, text: str = QUESTION) -> float | None:
        """Seconds from ``since`` to the end of the first spoken turn that is answered without an error."""
        while time.monotonic() - since < RECOVERY_LIMIT_S:
            if (await self.spoken_turn(text, settle_s=0.5)).worked:
                return round(time.monotonic() - since, 2)
        return None

    async def bridge_connected(self, connected: bool, timeout_s: float = 30) -> None:
        async with asyncio.timeout(timeout_s):
            while self.bridge.connected.is_set() != connected:
                await asyncio.sleep(0.05)


async def broker_away_during_command(rig: Rig) -> Outcome:
    out = Outcome("broker away during a command")
    rig.broker.stop()
    await rig.bridge_connected(False)
    before = len(rig.light.received)
    seen = await rig.spoken_turn(COMMAND, settle_s=rig.config.mqtt.command_timeout_s + SETTLE_S)
    rig.broker.start()
    cleared = time.monotonic()
    await rig.bridge_connected(True)
    async with asyncio.timeout(30):
        await rig.light.connected.wait()
    late = await rig.light.deliveries_after(before)  # waits a while: a command sent late would arrive now
    told = any("not switched" in said or "may not have been switched" in said for said in seen.said)
    out.deliveries = f"sent late ({late})" if late else "not done, and the user was told" if told else "LOST SILENTLY"
    before = len(rig.light.received)  # the next command, the broker back: delivered once
    again = await rig.spoken_turn(COMMAND)
    arrived = await rig.light.deliveries_after(before)
    out.recovery_s = round(time.monotonic() - cleared, 2) if arrived == ["ON"] else None
    out.deliveries += f"; the next command: {arrived or 'not delivered'}"
    out.heard = [seen.heard]
    out.detail = {"said": seen.said, "errors": seen.errors + again.errors, "next_said": again.said}
    return out


async def broker_restarted_during_turn(rig: Rig) -> Outcome:
    out = Outcome("broker restarted during a turn")
    turn = start(rig.spoken_turn(QUESTION), name="faults turn")
    await asyncio.sleep(1.0)  # the question is being heard: state updates are on their way to the broker
    rig.broker.stop()
    await asyncio.sleep(1.0)
    rig.broker.start()
    cleared = time.monotonic()
    seen = await turn
    await rig.bridge_connected(True)
    ask = await spoken.mqtt_ask(rig.broker.port, rig.config.mqtt.prefix, "Say hi.", f"faults-{secrets.token_hex(4)}")
    out.recovery_s = round(time.monotonic() - cleared, 2) if ask["ok"] and seen.worked else None
    out.heard = [seen.heard]
    out.detail = {"said": seen.said, "errors": seen.errors, "mqtt_ask_after": ask}
    return out


class FailingGeneration:
    """Injected fault: an engine's generation that raises at its ``fail_at``-th step, as an engine whose kernels
    fail in the middle of a reply would. Everything else is the real generation's."""

    def __init__(self, inner: Any, fail_at: int) -> None:
        self._inner, self._fail_at, self._steps = inner, fail_at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def step(self) -> Any:
        self._steps += 1
        if self._steps >= self._fail_at:
            raise RuntimeError("injected fault: the engine failed in the middle of a reply")
        return self._inner.step()


@contextlib.contextmanager
def failing_engine(engine: Any, fail_at: int = 3) -> Iterator[None]:
    """Every generation the engine starts inside the block fails at its ``fail_at``-th step."""
    real = engine.generation
    engine.generation = lambda *args, **kwargs: FailingGeneration(real(*args, **kwargs), fail_at)
    try:
        yield
    finally:
        del engine.generation  # the class's own method again


async def engine_fails_mid_reply(rig: Rig) -> Outcome:
    out = Outcome("engine fails mid-reply")
    with failing_engine(rig.assistant.engine):
        seen = await rig.spoken_turn(QUESTION)
    out.recovery_s = await rig.until_a_turn_works(time.monotonic())
    out.heard = [seen.heard]
    out.detail = {"said": seen.said, "errors": seen.errors}
    return out


async def half_a_recording(port: int, wav: Path, *, goodbye: bool) -> None:
    """A Wyoming client that sends half of ``wav`` for transcription and leaves: with ``goodbye`` it ends the
    audio and closes its side, without it the connection is just dropped."""
    from wyoming.asr import Transcribe
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.event import async_write_event

    samples, rate = read_wav(wav)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    await async_write_event(Transcribe(language="en").event(), writer)
    await async_write_event(AudioStart(rate=rate, width=2, channels=1).event(), writer)
    half = samples[: len(samples) // 2]
    for i in range(0, len(half), rate // 10):
        await async_write_event(AudioChunk(rate, 2, 1, half[i : i + rate // 10].tobytes()).event(), writer)
    if goodbye:
        await async_write_event(AudioStop().event(), writer)
        writer.close()
        await writer.wait_closed()
    else:
        writer.transport.abort()  # gone: no audio-stop, no goodbye


def open_sessions(config: Config, transport: str) -> float:
    """The server's own count of open sessions of ``transport``, read from /metrics as an operator would."""
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{config.server.port}/metrics", headers={"Authorization": f"Bearer {config.server.token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'specvoice_sessions{{transport="{transport}"}}'):
                return float(line.split()[-1])
    return 0.0


async def wyoming_client_gone_mid_stream(rig: Rig) -> Outcome:
    out = Outcome("Wyoming client gone mid-stream")
    await half_a_recording(rig.config.wyoming.port, rig.wavs[QUESTION], goodbye=False)
    cleared = time.monotonic()
    other = await spoken.wyoming_transcribe(rig.config.wyoming.port, rig.wavs[QUESTION])
    seen = await rig.spoken_turn(QUESTION, settle_s=0.5)
    out.recovery_s = round(time.monotonic() - cleared, 2) if other["ok"] and seen.worked else None
    out.heard = ["(the client left; the next Wyoming client and the home device were answered)"]
    out.detail = {"next_wyoming_client": other, "home_device_meanwhile": seen.said}
    return out


async def wyoming_reconnecting(rig: Rig, times: int = 30) -> Outcome:
    """A Home Assistant that keeps reconnecting: ``times`` connections in a row, each leaving halfway through a
    recording (every other one without a goodbye). Until the server has worked through what they sent, their
    sessions hold slots (``server.max_sessions``) and a new client may be told ``busy``: recovered is when one
    is answered again. Then every session they opened must be closed (the server's own /metrics count)."""
    out = Outcome(f"Wyoming client reconnecting {times} times")
    port = rig.config.wyoming.port
    before = await asyncio.to_thread(open_sessions, rig.config, "wyoming")
    for n in range(times):
        await half_a_recording(port, rig.wavs[QUESTION], goodbye=n % 2 == 0)
    cleared = time.monotonic()
    refused = 0
    while time.monotonic() - cleared < RECOVERY_LIMIT_S:
        other = await spoken.wyoming_transcribe(port, rig.wavs[QUESTION])
        if other["ok"]:
            out.recovery_s = round(time.monotonic() - cleared, 2)
            break
        refused += 1
        await asyncio.sleep(0.5)
    after = await asyncio.to_thread(open_sessions, rig.config, "wyoming")
    out.crashed = after != before  # a session left open by a client that is gone: a leak
    out.heard = [
        f"a new client refused {refused} times first; open Wyoming sessions before {before:.0f}, after {after:.0f}"
    ]
    out.detail = {"refused_first": refused, "open_sessions": [before, after]}
    return out


async def in_process(config: Config, faults: list[str]) -> tuple[list[Outcome], dict[str, int]]:
    config = spoken.with_the_light(config)
    assistant = await Assistant.load(config)
    chosen = [f for f in IN_PROCESS if f in faults]
    outcomes: list[Outcome] = []
    from voice.server import serve

    with hostile.Mosquitto() as broker, LogCounter() as logs, quiet_console(), tempfile.TemporaryDirectory() as tmp:
        cfg = serving(config)
        with_broker(cfg, broker)
        cfg.server.token = secrets.token_hex(16)  # the home can be switched: no open websocket API
        cfg.mqtt.reconnect_min_s, cfg.mqtt.reconnect_max_s = 0.2, 1.0  # as a broker on the same host allows
        rig = Rig(assistant, cfg, broker, Path(tmp))
        stop, ready = asyncio.Event(), asyncio.Event()
        server = start(serve(cfg, ready=ready, assistant=assistant, stop=stop, mqtt=rig.bridge), name="serve")
        try:
            await asyncio.wait({server, start(ready.wait())}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if server.done():
                server.result()  # its startup error
            await rig.bridge_connected(True)
            async with rig.light:
                await rig.spoken_turn(QUESTION, settle_s=0.5)  # every model's first work, before any fault
                for name in chosen:
                    seen = logs.counts["tracebacks"]
                    outcome = await IN_PROCESS[name](rig)
                    outcome.crashed |= server.done() or logs.counts["tracebacks"] > seen
                    outcomes.append(outcome)
                    print(f"  {outcome.fault}: recovered in {outcome.recovery_s} s", file=sys.stderr)
        finally:
            await rig.session.close()
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server, 60)
            await assistant.close()
    return outcomes, dict(logs.counts)


IN_PROCESS: dict[str, Callable[[Rig], Awaitable[Outcome]]] = {
    "broker-command": broker_away_during_command,
    "broker-turn": broker_restarted_during_turn,
    "engine": engine_fails_mid_reply,
    "wyoming-client": wyoming_client_gone_mid_stream,
    "wyoming-reconnects": wyoming_reconnecting,
}


SIGNALS = {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
ALL = [*IN_PROCESS, *SIGNALS, "disk-full"]


def print_table(outcomes: list[Outcome], logs: dict[str, int]) -> None:
    print(f"\n{'fault':32s} {'crashed':>7s} {'recovered in':>12s}  what the user heard or the client saw")
    for o in outcomes:
        rec = "never" if o.recovery_s is None else f"{o.recovery_s:.1f} s"
        print(f"{o.fault:32s} {'YES' if o.crashed else 'no':>7s} {rec:>12s}  {' / '.join(o.heard) or '(nothing)'}")
        if o.deliveries != "-":
            print(f"{'':54s}light: {o.deliveries}")
    print(
        f"logged in this process: {logs.get('tracebacks', 0)} tracebacks, {logs.get('error', 0)} errors, "
        f"{logs.get('warning', 0)} warnings"
    )


async def bench(config: Config, args: Any, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench faults", description=__doc__.split("\n")[0])
    p.add_argument("--only", default=",".join(ALL), help=f"faults to inject, comma-separated (of {','.join(ALL)})")
    p.add_argument("--json", default="bench-results/faults.json")
    opts = p.parse_args(argv)
    faults = [f.strip() for f in opts.only.split(",") if f.strip()]
    if unknown := sorted(set(faults) - set(ALL)):
        p.error(f"unknown faults {unknown}; fix: choose from {','.join(ALL)}")
    if not Path(hostile.MOSQUITTO).exists() and set(faults) & set(IN_PROCESS):
        p.error(f"these faults need mosquitto ({hostile.MOSQUITTO}); fix: apt install mosquitto")
    cli_args = [*(["-c", args.config] if args.config else []), *(x for s in args.set for x in ("--set", s))]
    outcomes, logs = await in_process(config, faults) if set(faults) & set(IN_PROCESS) else ([], {})
    with tempfile.TemporaryDirectory() as tmp:
        for name in (f for f in faults if f in SIGNALS):
            outcome = await signalled(cli_args, SIGNALS[name], Path(tmp))
            outcomes.append(outcome)
            print(f"  {outcome.fault}: recovered in {outcome.recovery_s} s", file=sys.stderr)
        if "disk-full" in faults:
            outcomes.append(await disk_full(cli_args, Path(tmp)))
    print_table(outcomes, logs)
    Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.json).write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "machine": platform.machine(),
                "config": {"target": config.models.target, "draft": config.models.draft},
                "faults": [asdict(o) for o in outcomes],
                "logs": logs,
            },
            indent=1,
        )
    )
    print(f"wrote {opts.json}")
    return 0 if not any(o.crashed or o.recovery_s is None for o in outcomes) else 1


def main(config: Config, args: Any, extra: list[str]) -> int:
    return asyncio.run(bench(config, args, extra))
