"""`specvoice bench pipeline`: voice-to-voice latency, stage by stage, with speculative decoding and with the
target alone, interleaved in one run (so machine noise hits both alike). Questions are spoken by piper and
played into the pipeline in real time; answers play into a sink paced like a sound card. Table + JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from audio.sinks import WavSink
from voice.assistant import Assistant
from voice.bench import positive
from voice.events import Event, TurnDone, TurnError
from voice.latency import percentiles
from voice.wavturn import run_turn, synthesize_question

QUESTIONS = (
    "What is the capital of France?",
    "How far away is the moon?",
    "Give me a quick tip for sleeping better.",
    "What should I cook for dinner tonight?",
    "Why is the sky blue?",
    "Tell me a fun fact about octopuses.",
)
STAGES = (
    "endpointing",
    "stt_final",
    "llm_first_token",
    "first_fragment",
    "tts_first_audio",
    "playback_start",
    "voice_to_voice",
    "reply_total",
)


def _ends_into(finished: asyncio.Queue[Event | None]) -> Callable[[Event], None]:
    """An event handler that passes the end of each turn (done or failed) into ``finished``."""

    def handle(event: Event) -> None:
        if isinstance(event, (TurnDone, TurnError)):
            finished.put_nowait(event)

    return handle


async def bench(config, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench pipeline")
    p.add_argument("--questions", type=positive, default=len(QUESTIONS))
    p.add_argument("--rounds", type=positive, default=1)
    p.add_argument("--json", default="bench-results/pipeline.json")
    p.add_argument(
        "--busy",
        action="store_true",
        help="keep one CPU core busy with another process (a spinning Python) for the whole run",
    )
    args = p.parse_args(argv)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        return await _run(config, args)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


async def _run(config, args: argparse.Namespace) -> int:
    assistant = await Assistant.load(config)
    modes = {"speculative": assistant.decode_settings(), "target alone": assistant.decode_settings(mode="target")}
    import tempfile

    rows: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        wavs = [
            synthesize_question(assistant, q, Path(tmp) / f"q{i}.wav")
            for i, q in enumerate(QUESTIONS[: args.questions])
        ]
        plan = [(r, w, m) for r in range(args.rounds) for w in wavs for m in modes]
        for _, wav, mode in tqdm(plan, desc="turns", unit="turn", disable=None):
            finished: asyncio.Queue[Event | None] = asyncio.Queue()
            sink = WavSink(None, assistant.tts_sample_rate, realtime=True)
            session = assistant.session(_ends_into(finished), sink=sink)
            session.decode = modes[mode]
            done = await run_turn(session, wav, finished)
            await session.close()
            sink.close()
            if done is not None:
                decoder = done.trace.get("decoder") or {}
                rows[mode].append(
                    {
                        "stages_ms": done.trace["stages_ms"],
                        "marks_ms": done.trace["marks_ms"],
                        "transcript": done.transcript,
                        "reply": done.reply,
                        "early_reply": bool(done.trace.get("early_reply")),
                        "early_replies": dict(session.early_replies),  # started and adopted (the rest dropped)
                        "early_lead_ms": done.trace.get("early_lead_ms"),  # started this long before the end
                        "end_of_turn": done.trace.get("end_of_turn"),
                        "tokens_per_s": decoder.get("tokens_per_s"),
                        "ttft_s": decoder.get("ttft_s"),
                    }
                )
    summary = {
        mode: {s: percentiles([r["stages_ms"][s] for r in rs if s in r["stages_ms"]]) for s in STAGES}
        for mode, rs in rows.items()
    }
    print(
        f"\nvoice pipeline, {config.models.target} (+{config.models.draft or config.llm.mode}), "
        f"{len(rows['speculative'])} turns per mode{', one core kept busy' if args.busy else ''}; ms"
    )
    print(f"{'stage':18s}" + "".join(f"{m + ' p50':>20s}{'p95':>8s}" for m in modes))
    for stage in STAGES:
        cells = "".join(
            f"{summary[m][stage].get('p50', float('nan')):20.0f}{summary[m][stage].get('p95', float('nan')):8.0f}"
            for m in modes
        )
        print(f"{stage:18s}{cells}")
    for mode, rs in rows.items():
        started = sum(r["early_replies"]["started"] for r in rs)
        adopted = sum(r["early_replies"]["adopted"] for r in rs)
        leads = [r["early_lead_ms"] for r in rs if r["early_lead_ms"] is not None]
        print(
            f"{mode}: early replies (on the pause transcript, before the endpoint): {started} started, "
            f"{adopted} adopted, {started - adopted} dropped, in {len(rs)} turns; adopted ones began "
            f"{percentiles(leads).get('p50', float('nan')):.0f} ms (p50) before the end of the turn"
        )
        ends = [f"{(r['end_of_turn'] or {}).get('rule')}/{(r['end_of_turn'] or {}).get('reason')}" for r in rs]
        print(f"{mode}: turns ended by " + ", ".join(f"{e} x{ends.count(e)}" for e in sorted(set(ends))))
    spec, base = summary["speculative"], summary["target alone"]
    for stage in ("voice_to_voice", "reply_total"):
        if spec[stage].get("p50") and base[stage].get("p50"):
            print(f"{stage}: speculative / target alone = {spec[stage]['p50'] / base[stage]['p50']:.2f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "machine": platform.processor() or platform.machine(),
                "busy_core": args.busy,
                "config": {
                    "target": config.models.target,
                    "draft": config.models.draft,
                    "llm": config.llm.model_dump(),
                },
                "summary": summary,
                "turns": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {args.json}")
    return 0


def main(config, args, extra) -> int:
    return asyncio.run(bench(config, extra))
