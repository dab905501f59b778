"""`specvoice demo`: spoken turns from WAV files, paced in real time, answered out loud into a WAV file, with the
per-stage latency table. With no ``--in`` it speaks two questions itself (piper), so a fresh install can show
the whole loop (and the second turn reusing the first turn's KV cache) with nothing but the embedded models."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from audio.sinks import WavSink
from voice.assistant import Assistant
from voice.events import Event, TranscriptPartial, TurnDone, TurnError
from voice.latency import format_table
from voice.wavturn import run_turn, synthesize_question, trace_from

DEFAULT_QUESTIONS = ("What is the capital of France?", "And roughly how many people live there?")


async def demo(config, inputs: list[str], out: str | None, json_out: str | None) -> int:
    print("specvoice demo: loading models (first run builds caches; see `specvoice models prepare`) ...", flush=True)
    started = time.monotonic()
    assistant = await Assistant.load(config)
    print(
        f"loaded in {time.monotonic() - started:.1f} s: target={config.models.target} "
        f"draft={config.models.draft if config.llm.mode == 'draft' else config.llm.mode} "
        f"stt={config.models.stt} tts={config.models.tts}",
        flush=True,
    )
    out_path = Path(out or "out/answer.wav")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    sink = WavSink(out_path, assistant.tts_sample_rate, realtime=True)
    finished: asyncio.Queue[Event | None] = asyncio.Queue()

    def on_event(event: Event) -> None:
        if isinstance(event, TranscriptPartial):
            print(f"  ... {event.text}", flush=True)
        if isinstance(event, (TurnDone, TurnError)):
            finished.put_nowait(event)

    session = assistant.session(on_event, sink=sink, name="demo")
    with tempfile.TemporaryDirectory() as tmp:
        wavs = [Path(p) for p in inputs] or [
            synthesize_question(assistant, q, Path(tmp) / f"q{i}.wav") for i, q in enumerate(DEFAULT_QUESTIONS)
        ]
        traces, results = [], []
        for wav in wavs:
            print(f"\n> playing {wav.name if inputs else 'a spoken question'} in real time ...", flush=True)
            done = await run_turn(session, wav, finished)
            if done is None:
                continue
            decoder = done.trace.get("decoder") or {}
            print(f"  you:       {done.transcript}")
            print(f"  assistant: {done.reply}")
            if decoder.get("backend") == "openai":  # the server speculates: its counters, or "not reported"
                spec = decoder.get("server_spec") or {}
                served = (
                    f"server acceptance {spec['window_acceptance']:.2f}, mean accepted length "
                    f"{spec['window_mean_accepted_length']:.2f}"
                    if spec.get("window_acceptance") is not None
                    else "server speculative decoding: not reported"
                )
                print(
                    f"  decoder:   remote {decoder.get('new_tokens', '?')} tokens, "
                    f"{decoder.get('tokens_per_s', 0):.1f} tok/s, {served}"
                )
            elif decoder:
                print(
                    f"  decoder:   {decoder.get('new_tokens', '?')} tokens, "
                    f"{decoder.get('tokens_per_s', 0):.1f} tok/s, "
                    f"accepted/drafted {decoder.get('accepted', 0)}/{decoder.get('drafted', 0)}, "
                    f"mean accepted length {decoder.get('mean_accepted_length', 0):.2f}"
                )
            traces.append(trace_from(done, config.budget.model_dump()))
            results.append({"transcript": done.transcript, "reply": done.reply, "trace": done.trace})
    await session.close()
    sink.close()
    if not traces:
        print("no turn completed", file=sys.stderr)
        return 1
    print("\nlatency per stage (ms), voice_to_voice = speech_end -> playback_start:")
    print(format_table(traces))
    over = sorted({s for t in traces for s in t.over_budget()})
    print(f"\nover budget: {', '.join(over) if over else 'none'}")
    print(f"spoken answer written to {out_path}")
    if json_out:
        Path(json_out).write_text(json.dumps({"turns": results}, indent=1, default=float))
    return 0


def main(config, args, extra) -> int:
    return asyncio.run(demo(config, args.inputs, args.out, args.json))
