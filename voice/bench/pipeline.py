"""`specvoice bench pipeline`: voice-to-voice latency, stage by stage, with speculative decoding and with the
target alone, interleaved in one run (so machine noise hits both alike). Questions are spoken by piper and
played into the pipeline in real time; answers play into a sink paced like a sound card. Table + JSON.

``--conditions`` plays each question in listening conditions (voice/roomset.py: a simulated room, a distance, a
noise that runs on after the question) and adds, per condition, what the user would notice: the words heard,
how the turn ended, and the time from the true end of the question (known from the clean recording) to the first
sound of the answer, which the stage table (timed from the VAD's end of speech) does not see when noise keeps
the VAD hearing speech after the question."""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.sinks import WavSink
from audio.wavfile import write_wav
from voice.assistant import Assistant
from voice.bench import positive
from voice.events import Event
from voice.latency import percentiles
from voice.roomset import CONDITIONS_HELP, Condition, chosen
from voice.speechset import Utterance, Voice, framed, wer
from voice.wavturn import ends_into, play, turn_ended

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


async def bench(config, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench pipeline")
    p.add_argument("--questions", type=positive, default=len(QUESTIONS))
    p.add_argument("--rounds", type=positive, default=1)
    p.add_argument("--json", default="bench-results/pipeline.json")
    p.add_argument("--conditions", default="clean", help=CONDITIONS_HELP)
    p.add_argument(
        "--busy",
        action="store_true",
        help="keep one CPU core busy with another process (a spinning Python) for the whole run",
    )
    args = p.parse_args(argv)
    try:
        args.conditions = chosen(args.conditions)
    except ValueError as exc:
        p.error(str(exc))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        return await _run(config, args)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def spoken(assistant: Assistant, questions: tuple[str, ...]) -> list[Utterance]:
    """Each question in the assistant's own voice, as a turn with silence around it (``framed``)."""
    voice = Voice("assistant", "piper")
    out = []
    for i, text in enumerate(questions):
        pcm = np.concatenate(list(assistant.tts.synthesize(text)))
        out.append(framed(f"pipeline/q{i}", voice, text, resample(pcm, assistant.tts_sample_rate, SPEECH_RATE)))
    return out


async def _run(config, args: argparse.Namespace) -> int:
    assistant = await Assistant.load(config)
    modes = {"speculative": assistant.decode_settings(), "target alone": assistant.decode_settings(mode="target")}
    conditions: list[Condition] = args.conditions
    questions = spoken(assistant, QUESTIONS[: args.questions])
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        plan = [(c, q, m) for _ in range(args.rounds) for c in conditions for q in questions for m in modes]
        for condition, question, mode in tqdm(plan, desc="turns", unit="turn", disable=None):
            wav = Path(tmp) / "question.wav"
            write_wav(wav, condition.hear(question).audio, SPEECH_RATE)
            finished: asyncio.Queue[Event | None] = asyncio.Queue()
            sink = WavSink(None, assistant.tts_sample_rate, realtime=True)
            session = assistant.session(ends_into(finished), sink=sink)
            session.decode = modes[mode]
            file_start = await play(session, wav)
            done = await turn_ended(finished)
            await session.close()
            sink.close()
            if done is not None:
                decoder = done.trace.get("decoder") or {}
                marks = done.trace["marks_ms"]
                said_end = file_start + question.speech_end
                heard_to_voice = (
                    None
                    if "playback_start" not in marks
                    else round((done.trace["origin_t"] + marks["playback_start"] / 1000 - said_end) * 1000, 1)
                )
                rows[mode].append(
                    {
                        "condition": condition.name,
                        "question": question.text,
                        "wer": round(wer(question.text, done.transcript), 3),
                        "said_end_to_voice_ms": heard_to_voice,  # from the true end of the question
                        "stages_ms": done.trace["stages_ms"],
                        "marks_ms": marks,
                        "transcript": done.transcript,
                        "reply": done.reply,
                        "interrupted": done.interrupted,  # in a room, often by the room's own voices
                        "early_reply": bool(done.trace.get("early_reply")),
                        "early_replies": dict(session.early_replies),  # started and adopted (the rest dropped)
                        "early_lead_ms": done.trace.get("early_lead_ms"),  # started this long before the end
                        "end_of_turn": done.trace.get("end_of_turn"),
                        "tokens_per_s": decoder.get("tokens_per_s"),
                        "ttft_s": decoder.get("ttft_s"),
                        # prompt tokens the reply still had to prefill (the rest was cached while the user spoke)
                        "prefill_tokens": decoder.get("prefill_tokens"),
                        "prompt_tokens": decoder.get("prompt_tokens"),
                    }
                )
    if len(conditions) > 1 or conditions[0].name != "clean":
        print(by_condition(rows, conditions, len(questions) * args.rounds))
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
                "conditions": [c.name for c in conditions],
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


def by_condition(rows: dict[str, list[dict]], conditions: list[Condition], per_mode: int) -> str:
    """Per condition and mode: turns whose answer began to sound (others were cut off before it, mostly by the
    room's voices taken as a barge-in), word error rate of the transcripts, turns the end-of-turn model ended,
    and the time from the end of the question to the answer's first sound (p50)."""
    lines = [f"{'condition':28s} {'mode':13s} {'voiced':>7s} {'WER':>6s} {'model ended':>11s} {'end->voice p50':>14s}"]
    for condition in conditions:
        for mode, rs in rows.items():
            mine = [r for r in rs if r["condition"] == condition.name]
            delays = [r["said_end_to_voice_ms"] for r in mine if r["said_end_to_voice_ms"] is not None]
            by_model = sum((r["end_of_turn"] or {}).get("reason") == "complete" for r in mine)
            mean_wer = sum(r["wer"] for r in mine) / len(mine) if mine else float("nan")
            p50 = f"{percentiles(delays).get('p50', float('nan')):.0f} ms"
            lines.append(
                f"{condition.name:28s} {mode:13s} {len(delays):>3d}/{per_mode:<3d} {mean_wer:6.3f} "
                f"{by_model:>11d} {p50:>14s}"
            )
    return "\n".join(lines)


def main(config, args, extra) -> int:
    return asyncio.run(bench(config, extra))
