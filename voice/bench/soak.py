"""`specvoice bench soak`: hostile inputs against the three running servers, then a long conversation.

1. `serve()` in this process (websocket API, Wyoming, and the MQTT bridge on a throwaway mosquitto when one is
   installed), a seeded batch of hostile inputs fired at all three at once (soak_hostile.py), then the slowloris
   scenario. Counted: inputs tried, error answers, internal errors (Wyoming `server_error`, websocket 1011),
   hangs, probes not answered, tracebacks in the captured logs, whether `serve()` died.
2. A conversation of `--turns` text turns through one Session (short replies): time to first token per decile
   of turns, p50 and p95, with the prompt and prefill sizes; the goal is p95 of the last decile within 1.5x of
   the first (a history trim that keeps the KV cache).
3. With ``--spoken N``: N spoken turns into one home device session, with home commands, MQTT asks and a
   Wyoming client among them (soak_spoken.py): time to first token, voice to voice and RSS per decile, each
   command's deliveries to the light, and the errors logged.
4. RSS all along; the goal is under 200 MB of growth over the run.

`--inputs` and `--turns` can be small for a quick run; the same seed gives the same inputs. Prints a table and
writes JSON (`--json`). Run it under `flock /tmp/bigmodel.lock` with the default (embedded) models.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import platform
import random
import secrets
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

from voice.assistant import Assistant
from voice.bench import count, positive, seconds
from voice.bench import soak_hostile as hostile
from voice.bench import soak_spoken as spoken
from voice.latency import percentiles
from voice.memory import settle_after_load
from voice.server import serve
from voice.tasks import start

PROMPTS = (
    "What is a good name for a cat?",
    "How do I boil an egg?",
    "Give me one tip for sleeping better.",
    "What is the capital of Japan?",
    "Why is the sky blue?",
    "Suggest a quick dinner.",
    "How far away is the moon?",
    "Tell me a fun fact about octopuses.",
    "What should I read next?",
    "How do I keep basil alive?",
    "What is a haiku?",
    "Name a board game for four people.",
    "How long should I steep green tea?",
    "What is the tallest mountain?",
    "How do magnets work?",
    "Give me a word that rhymes with light.",
    "What is compound interest?",
    "How do bees make honey?",
    "What is a good stretch for my back?",
    "Why do cats purr?",
)


class LogCounter(logging.Handler):
    """Counts what the servers log while under fire: tracebacks (records with exc_info, asyncio errors such as
    an exception nobody retrieved), warnings and errors, and dead background tasks."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()
        self.samples: list[str] = []
        self._seen: set[int] = set()
        self._loggers = [logging.getLogger(n) for n in ("", "specvoice", "asyncio", "websockets")]

    def emit(self, record: logging.LogRecord) -> None:
        if id(record) in self._seen:
            return
        self._seen.add(id(record))
        traceback = bool(record.exc_info) or (record.name == "asyncio" and record.levelno >= logging.ERROR)
        if traceback:
            self.counts["tracebacks"] += 1
            if len(self.samples) < 5:
                self.samples.append(f"{record.name}: {record.getMessage()}\n{self.format(record)}")
        if record.levelno >= logging.WARNING:
            self.counts[record.levelname.lower()] += 1
        if "background task failed" in record.getMessage():
            self.counts["background tasks died"] += 1

    def __enter__(self) -> LogCounter:
        for logger in self._loggers:
            logger.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for logger in self._loggers:
            logger.removeHandler(self)


def rss_mb() -> tuple[float, float]:
    """This process's resident set and its peak, in MB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def quiet_console(level: int = logging.CRITICAL) -> Any:
    """The servers' own console logging is silenced while they are under fire (LogCounter still sees all)."""
    handlers = [h for h in logging.getLogger("specvoice").handlers if not isinstance(h, LogCounter)]
    saved = [h.level for h in handlers]
    for h in handlers:
        h.setLevel(level)
    try:
        yield
    finally:
        for h, lvl in zip(handlers, saved, strict=True):
            h.setLevel(lvl)


def serving(config: Any) -> Any:
    """``config`` for serving in this process: free loopback ports, Wyoming on, no shutdown grace."""
    cfg = config.model_copy(deep=True)
    cfg.server.port, cfg.wyoming.port, cfg.server.shutdown_grace_s = free_port(), free_port(), 0.0
    cfg.wyoming.enabled = True
    return cfg


def with_broker(cfg: Any, mosquitto: hostile.Mosquitto) -> None:
    cfg.mqtt.enabled, cfg.mqtt.host, cfg.mqtt.port = True, "127.0.0.1", mosquitto.port


async def hostile_phase(
    config: Any, assistant: Assistant, args: argparse.Namespace, rss: dict[str, Any]
) -> dict[str, Any]:
    cfg = serving(config)
    use_mqtt = not args.no_mqtt and Path(hostile.MOSQUITTO).exists()
    broker = hostile.Mosquitto() if use_mqtt else contextlib.nullcontext()
    counts: Counter[str] = Counter()
    rng = random.Random(args.seed)
    shares = (0.4, 0.4, 0.2) if use_mqtt else (0.5, 0.5, 0.0)
    n_wy, n_ws = int(args.inputs * shares[0]), int(args.inputs * shares[1])
    n_mqtt = args.inputs - n_wy - n_ws if use_mqtt else 0
    wy_inputs = [hostile.wyoming_input(rng) for _ in range(n_wy)]
    ws_inputs = hostile.websocket_inputs(rng, n_ws)
    url = f"ws://127.0.0.1:{cfg.server.port}/v1/realtime"
    with broker as mosquitto, LogCounter() as logs, quiet_console():
        if mosquitto is not None:
            with_broker(cfg, mosquitto)
        mqtt_inputs = hostile.mqtt_inputs(rng, cfg.mqtt.prefix, n_mqtt)
        stop, ready = asyncio.Event(), asyncio.Event()
        server = start(serve(cfg, ready=ready, assistant=assistant, stop=stop), name="serve")
        await asyncio.wait({server, start(ready.wait())}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # its startup error
        # one honest use of every service first (each model's first work allocates its arenas), then the baseline
        for data in hostile.wyoming_warmup():
            await hostile.wyoming_exchange(cfg.wyoming.port, data, Counter())
        await hostile.websocket_session(url, hostile.websocket_warmup(), Counter())
        if n_mqtt:
            await hostile.mqtt_publish("127.0.0.1", cfg.mqtt.port, [], cfg.mqtt.prefix, Counter())
        rss["serving, warmed"] = rss_mb()
        started = time.monotonic()
        limit = asyncio.Semaphore(4)

        async def bounded(coro: Any) -> None:
            async with limit:
                await coro

        for n in range(1, args.passes + 1):  # pass 2 on: new inputs (a leak grows with every pass, a plateau does not)
            if n > 1:
                wy_inputs = [hostile.wyoming_input(rng) for _ in range(n_wy)]
                ws_inputs = hostile.websocket_inputs(rng, n_ws)
                mqtt_inputs = hostile.mqtt_inputs(rng, cfg.mqtt.prefix, n_mqtt)
            jobs = [bounded(hostile.wyoming_exchange(cfg.wyoming.port, data, counts)) for data in wy_inputs]
            jobs += [bounded(hostile.websocket_session(url, ws_inputs[i : i + 5], counts)) for i in range(0, n_ws, 5)]
            if n_mqtt:
                jobs.append(hostile.mqtt_publish("127.0.0.1", cfg.mqtt.port, mqtt_inputs, cfg.mqtt.prefix, counts))
            await asyncio.gather(*jobs)
            rss["after hostile inputs" + (f", pass {n}" if n > 1 else "")] = rss_mb()
        fired_s = time.monotonic() - started
        slow = await hostile.slowloris(cfg.wyoming.port, url, cfg.server.max_sessions + 2)
        rss["after slowloris"] = rss_mb()
        probe: Counter[str] = Counter()  # the servers still answer an honest client
        await hostile.wyoming_exchange(cfg.wyoming.port, b"", probe)
        await hostile.websocket_session(url, [], probe)
        alive = not server.done() and probe["wyoming connections closed"] == 0 and not probe["hangs"]
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server, 60)
    return {
        "inputs": {k: args.passes * v for k, v in (("wyoming", n_wy), ("websocket", n_ws), ("mqtt", n_mqtt))}
        | {"total": args.passes * (n_wy + n_ws + n_mqtt)},
        "passes": args.passes,
        "seed": args.seed,
        "mqtt": use_mqtt,
        "seconds": round(fired_s, 1),
        "counts": dict(counts),
        "logs": dict(logs.counts),
        "traceback_samples": logs.samples,
        "servers_alive_after": alive,
        "slowloris": slow,
    }


async def conversation_phase(assistant: Assistant, turns: int, gap_s: float, rss: dict[str, Any]) -> dict[str, Any]:
    """``turns`` text turns through one Session, as a long conversation would go: ``gap_s`` from a reply's end
    to the next question stands for the reply's playback and the user's next words (a voice turn has both),
    the time the session uses to trim ahead and prefill. How long that took is recorded per turn."""
    session = assistant.session(name="soak")
    rows: list[dict[str, Any]] = []
    try:
        for i in range(turns):
            done = await session.ask(PROMPTS[i % len(PROMPTS)], speak=False)
            start = time.monotonic()
            warm_ms: float | None = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(gap_s):
                    await session.warmed()
                    warm_ms = round(1000 * (time.monotonic() - start), 1)
            await asyncio.sleep(max(0.0, gap_s - (time.monotonic() - start)))
            decoder = done.trace.get("decoder") or {}
            rows.append(
                {
                    "turn": i + 1,
                    "ttft_ms": round(1000 * decoder["ttft_s"], 1) if decoder else None,
                    "prompt_tokens": decoder.get("prompt_tokens"),
                    "prefill_tokens": decoder.get("prefill_tokens"),
                    "new_tokens": decoder.get("new_tokens"),
                    "history_messages": len(session.history),
                    "warm_ms": warm_ms,  # None: the warm-up was still running when the next question came
                    "trims": getattr(session.conversation, "trims", None),  # the local conversation counts them
                }
            )
    finally:
        rss["conversation, still open"] = rss_mb()  # its history's KV caches (and the next trim's) are live
        await session.close()
    deciles: list[dict[str, Any]] = []
    for d in range(10):
        part = [r for r in rows[d * turns // 10 : (d + 1) * turns // 10] if r["ttft_ms"] is not None]
        if part:
            deciles.append(
                {
                    "decile": d + 1,
                    "turns": f"{part[0]['turn']}-{part[-1]['turn']}",
                    "ttft_ms": percentiles([r["ttft_ms"] for r in part]),
                    "prefill_tokens_p50": percentiles([r["prefill_tokens"] for r in part]).get("p50"),
                    "prompt_tokens_p50": percentiles([r["prompt_tokens"] for r in part]).get("p50"),
                }
            )
    ratio = None
    if len(deciles) >= 2 and deciles[0]["ttft_ms"].get("p95"):
        ratio = round(deciles[-1]["ttft_ms"]["p95"] / deciles[0]["ttft_ms"]["p95"], 2)
    warm = [r["warm_ms"] for r in rows if r["warm_ms"] is not None]
    return {
        "gap_s": gap_s,
        "turns": rows,
        "failed_turns": sum(r["ttft_ms"] is None for r in rows),
        "warm_ms": percentiles(warm) | {"max": max(warm, default=None), "unfinished": len(rows) - len(warm)},
        "trims": rows[-1]["trims"] if rows else 0,
        "deciles": deciles,
        "last_over_first_p95": ratio,
    }


def print_report(config: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    print(
        f"\nsoak: {config.models.target} (+{config.models.draft or config.llm.mode}), "
        f"max_new_tokens {args.max_new_tokens}"
    )
    if "hostile" in report:
        h = report["hostile"]
        c, logs, n, slow = Counter(h["counts"]), Counter(h["logs"]), h["inputs"], h["slowloris"]
        print(f"hostile inputs (seed {h['seed']}, fired in {h['seconds']} s; MQTT {'on' if h['mqtt'] else 'off'}):")
        rows = [
            ("inputs tried", f"{n['wyoming']} wyoming + {n['websocket']} websocket + {n['mqtt']} mqtt = {n['total']}"),
            (
                "error answers",
                f"{c['wyoming error events']} wyoming, {c['websocket error events']} websocket, "
                f"{c['mqtt error messages']} mqtt",
            ),
            (
                "connections closed by server",
                f"{c['wyoming connections closed']} of {c['wyoming connections']} "
                f"wyoming, {c['websocket connections closed']} of "
                f"{c['websocket connections']} websocket",
            ),
            (
                "crashes",
                f"{c['internal errors']} internal errors, {c['hangs']} hangs, {c['probes unanswered']} "
                f"probes unanswered, {logs['background tasks died']} background tasks died, servers "
                f"{'alive' if h['servers_alive_after'] else 'NOT ANSWERING'} after",
            ),
            (
                "tracebacks logged",
                f"{logs['tracebacks']} ({logs['warning']} warnings, {logs['error']} errors "
                "logged; counted, not printed)",
            ),
            (
                "slowloris",
                f"{slow['stalled']} stalled connections; served after: wyoming "
                f"{slow['wyoming_served_s']} s, websocket {slow['websocket_served_s']} s",
            ),
        ]
        for name, value in rows:
            print(f"  {name:30s} {value}")
    rss = report["rss_mb"]
    peak = max(v[1] for v in rss.values())
    print("RSS MB: " + ", ".join(f"{k} {v[0]:.0f}" for k, v in rss.items()) + f"; peak {peak:.0f}")
    print(
        f"RSS growth over the run, at rest at the end: {report['rss_growth_mb']:.0f} MB after one honest use of "
        f"each service (goal < 200); {report['rss_growth_from_load_mb']:.0f} MB since the models were loaded; "
        f"highest while sessions were open: +{report['rss_highest_growth_mb']:.0f} MB"
    )
    mem = report["memory"]
    print(
        f"memory: {mem['frozen_objects']} objects frozen after loading; {mem['trims']} collections + trims after "
        f"sessions closed (the slowest held the event loop {mem['slowest_ms']} ms)"
    )
    if "spoken" in report:
        sp = report["spoken"]
        spoken.print_spoken(sp)
        logs = Counter(sp["logs"])
        print(
            f"  RSS at rest after them, over the end of their first tenth: {sp['rss_growth_mb']:+.0f} MB (goal <= "
            f"100); logged: {logs['tracebacks']} tracebacks, {logs['error']} errors, {logs['warning']} warnings"
        )
    conv = report["conversation"]
    if conv["deciles"]:
        print(f"time to first token by decile of {len(conv['turns'])} turns ({conv['failed_turns']} failed), ms:")
        print(f"  {'decile':>6s} {'turns':>8s} {'p50':>8s} {'p95':>8s} {'prompt':>8s} {'prefill':>8s}")
        for d in conv["deciles"]:
            print(
                f"  {d['decile']:6d} {d['turns']:>8s} {d['ttft_ms']['p50']:8.0f} {d['ttft_ms']['p95']:8.0f} "
                f"{d['prompt_tokens_p50']:8.0f} {d['prefill_tokens_p50']:8.0f}"
            )
        print(f"p95 last decile / first decile: {conv['last_over_first_p95']} (goal <= 1.5)")
        w = conv["warm_ms"]
        print(
            f"history trims: {conv['trims']}; warm-up between turns (gap {conv['gap_s']} s): p50 {w.get('p50')} ms, "
            f"max {w.get('max')} ms, unfinished when the next question came: {w['unfinished']}"
        )


async def bench(config: Any, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench soak", description=__doc__.split("\n")[0])
    p.add_argument("--inputs", type=count, default=600, help="hostile inputs in all (0: skip that phase)")
    p.add_argument("--passes", type=positive, default=1, help="batches of hostile inputs (RSS after each)")
    p.add_argument("--turns", type=count, default=100, help="turns of the long conversation (0: skip it)")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--max-new-tokens", type=positive, default=32, help="reply length (short, as a voice reply is)")
    p.add_argument(
        "--gap-s", type=seconds, default=2.0, help="from a reply's end to the next question (its playback + the words)"
    )
    p.add_argument(
        "--spoken",
        type=count,
        default=0,
        help="spoken turns into one home device session, with MQTT and Wyoming clients between them (needs "
        "mosquitto; 0: skip them)",
    )
    p.add_argument("--no-mqtt", action="store_true", help="leave the MQTT bridge out of the hostile inputs")
    p.add_argument("--json", default="bench-results/soak.json")
    args = p.parse_args(argv)
    if args.spoken and not Path(hostile.MOSQUITTO).exists():
        p.error(f"--spoken needs mosquitto ({hostile.MOSQUITTO}); fix: apt install mosquitto")
    config = spoken.with_the_light(config) if args.spoken else config.model_copy(deep=True)
    config.llm.max_new_tokens = args.max_new_tokens
    rss: dict[str, Any] = {}
    assistant = await Assistant.load(config)
    settle_after_load()  # as `specvoice serve` does once its models are loaded (voice/memory.py)
    rss["loaded"] = rss_mb()
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": platform.machine(),
        "config": {
            "target": config.models.target,
            "draft": config.models.draft,
            "mode": config.llm.mode,
            "max_new_tokens": args.max_new_tokens,
            "history_tokens": config.dialog.history_tokens,
        },
    }
    try:
        if args.inputs:
            report["hostile"] = await hostile_phase(config, assistant, args, rss)
        report["conversation"] = await conversation_phase(assistant, args.turns, args.gap_s, rss)
        if args.spoken:
            rss["before the spoken turns"] = rss_mb()
            with hostile.Mosquitto() as mosquitto, LogCounter() as logs, quiet_console():
                cfg = serving(config)
                with_broker(cfg, mosquitto)
                cfg.server.token = secrets.token_hex(16)  # the home can be switched: no open websocket API
                report["spoken"] = await spoken.spoken_phase(assistant, cfg, PROMPTS, args.spoken, rss_mb)
            report["spoken"]["logs"] = dict(logs.counts)
            report["spoken"]["traceback_samples"] = logs.samples
        memory = assistant.memory  # give the closed sessions back as a server at rest would (voice/memory.py)
        await asyncio.sleep(memory.delay_s + memory.interval_s)
        rss["at rest, every session closed"] = rss_mb()
    finally:
        await assistant.close()
    start = rss.get("serving, warmed", rss["loaded"])[0]
    report["rss_mb"] = {k: [round(v[0], 1), round(v[1], 1)] for k, v in rss.items()}
    end = rss["at rest, every session closed"][0]
    report["rss_growth_mb"] = round(end - start, 1)  # what the run left behind, from the warmed baseline
    report["rss_growth_from_load_mb"] = round(end - rss["loaded"][0], 1)
    report["rss_highest_growth_mb"] = round(max(v[0] for v in rss.values()) - start, 1)  # while sessions were open
    trimmer = assistant.memory  # closed sessions collected and their memory trimmed (voice/memory.py)
    report["memory"] = {
        "frozen_objects": gc.get_freeze_count(),
        "trims": trimmer.runs,
        "slowest_ms": trimmer.slowest_ms,
    }
    if args.spoken:
        sp = report["spoken"]
        first = sp["deciles"][0]["rss_mb_end"] if sp["deciles"] else rss["before the spoken turns"][0]
        sp["rss_growth_mb"] = round(end - first, 1)  # at rest, from the end of the first tenth of the turns
    print_report(config, args, report)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")
    return 0


def main(config: Any, args: Any, extra: list[str]) -> int:
    return asyncio.run(bench(config, extra))
