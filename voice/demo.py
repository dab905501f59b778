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

import numpy as np

from audio.resample import resample
from audio.sinks import WavSink
from audio.sources import WavSource
from audio.wavfile import write_wav
from voice.assistant import Assistant, Session
from voice.events import Event, TranscriptPartial, TurnDone, TurnError
from voice.latency import LatencyTrace, format_table

DEFAULT_QUESTIONS = ("What is the capital of France?", "And roughly how many people live there?")


def synthesize_question(assistant: Assistant, text: str, path: Path) -> Path:
    """Speak ``text`` with the assistant's own voice into a 16 kHz WAV (a stand-in for a recorded question)."""
    pcm = np.concatenate(list(assistant.tts.synthesize(text)))
    write_wav(path, resample(pcm, assistant.tts_sample_rate, 16000), 16000)
    return path


async def run_turn(session: Session, wav: Path, done: asyncio.Queue, *, realtime: bool = True,
                   block_ms: int = 20, tail_silence_ms: int = 1500, timeout_s: float = 300.0) -> TurnDone | None:
    """Play ``wav`` into the session like a microphone (then silence, so the VAD ends the turn) and wait for the
    turn to finish."""
    async for chunk in WavSource(wav, block_ms=block_ms, realtime=realtime, tail_silence_ms=tail_silence_ms):
        await session.push_audio(chunk.samples, chunk.t)
    async with asyncio.timeout(timeout_s):
        while True:
            event = await done.get()
            if isinstance(event, TurnDone):
                return event
            if isinstance(event, TurnError):
                print(f"  turn failed in {event.stage}: {event.message}", file=sys.stderr)
                return None
            if event is None:
                return None


def trace_from(done: TurnDone, budget: dict) -> LatencyTrace:
    """Rebuild a LatencyTrace (for the table) from the plain dict a TurnDone carries."""
    trace = LatencyTrace(done.turn_id, budget_ms=budget)
    trace.marks = {k: v / 1000.0 for k, v in done.trace["marks_ms"].items()}
    return trace


async def demo(config, inputs: list[str], out: str | None, json_out: str | None) -> int:
    print("specvoice demo: loading models (first run builds caches; see `specvoice models prepare`) ...", flush=True)
    started = time.monotonic()
    assistant = await Assistant.load(config)
    print(f"loaded in {time.monotonic() - started:.1f} s: target={config.models.target} "
          f"draft={config.models.draft if config.llm.mode == 'draft' else config.llm.mode} "
          f"stt={config.models.stt} tts={config.models.tts}", flush=True)
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
        wavs = [Path(p) for p in inputs] or [synthesize_question(assistant, q, Path(tmp) / f"q{i}.wav")
                                             for i, q in enumerate(DEFAULT_QUESTIONS)]
        traces, results = [], []
        for wav in wavs:
            print(f"\n> playing {wav.name if inputs else 'a spoken question'} in real time ...", flush=True)
            done = await run_turn(session, wav, finished)
            if done is None:
                continue
            decoder = done.trace.get("decoder") or {}
            print(f"  you:       {done.transcript}")
            print(f"  assistant: {done.reply}")
            if decoder:
                print(f"  decoder:   {decoder.get('new_tokens', '?')} tokens, {decoder.get('tokens_per_s', 0):.1f} tok/s, "
                      f"accepted/drafted {decoder.get('accepted', 0)}/{decoder.get('drafted', 0)}, "
                      f"mean accepted length {decoder.get('mean_accepted_length', 0):.2f}")
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
