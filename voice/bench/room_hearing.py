"""`specvoice bench rooms`: how well the ears hear requests in a room, with and without noise suppression.

Each request of a set of voices (voice.speechset's complete turns: lead silence, the request, a tail long enough
for any end-of-turn rule) is placed in each listening condition (voice/roomset.py: a simulated room, the
talker's distance, a noise at a signal-to-noise ratio, the noise over the silences too) and played in real time
through the product's Listener (VAD, streaming Whisper, end of turn), once as the microphone hears it and once
through WebRTC's noise suppressor (``audio.noise_suppression``). Per condition and front-end:
- word error rate of the final transcripts against the request;
- turns ended while the noise still ran (a noise that holds the turn open ends it only in the silence that
  follows the recording), turns cut in two or more, requests not heard at all;
- the final transcript's delay after the end of speech (p50).
`--conditions holdout` (the default) reports the held-out conditions; `tuning` is the other set, for setting
thresholds. Prints a table, writes JSON (`--json`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from audio.frames import SPEECH_RATE
from audio.wavfile import write_wav
from voice.bench import positive
from voice.bench.speech import hear_file
from voice.models import resolve
from voice.roomset import CONDITIONS_HELP, Condition, chosen
from voice.speechset import TURN_TAIL_S, Utterance, complete_turns, normalize_words, wer

FRONT_ENDS = {"raw": False, "denoised": True}  # name -> audio.noise_suppression


def requests(voices: int, per_voice: int) -> list[Utterance]:
    """The first ``per_voice`` complete turns of each of the first ``voices`` clean voices."""
    by_voice: dict[str, list[Utterance]] = {}
    for u in complete_turns():
        if u.voice.noise is None:
            by_voice.setdefault(u.voice.name, []).append(u)
    return [u for name in list(by_voice)[:voices] for u in by_voice[name][:per_voice]]


async def hear_condition(config: Any, stt: Any, condition: Condition, utterances: list[Utterance]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "u.wav"
        for u in tqdm(utterances, desc=condition.name, disable=None, leave=False):
            heard = condition.hear(u)
            write_wav(path, heard.audio, SPEECH_RATE)
            utterances_heard = await hear_file(config, stt, path)
            text = " ".join(h["text"] for h in utterances_heard if h["text"])
            last = utterances_heard[-1] if utterances_heard else None
            rows.append(
                {
                    "id": u.id,
                    "reference": u.text,
                    "heard": text,
                    "wer": round(wer(u.text, text), 3),
                    "words": len(normalize_words(u.text)),
                    "utterances": len(utterances_heard),
                    # the recording's tail is the condition's noise; after it the file source adds silence
                    "ended_in_noise": last is not None
                    and last["endpoint"] - last["file_start"] <= len(heard.audio) / SPEECH_RATE,
                    "final_after_speech_end_s": None
                    if last is None
                    else round(last["final_done"] - last["speech_end"], 3),
                }
            )
    return rows


def summarize(rows: list[dict]) -> dict:
    words = sum(r["words"] for r in rows)
    delays = [r["final_after_speech_end_s"] for r in rows if r["final_after_speech_end_s"] is not None]
    return {
        "requests": len(rows),
        "wer": round(sum(r["wer"] * r["words"] for r in rows) / max(1, words), 3),
        "ended_in_noise": sum(r["ended_in_noise"] for r in rows),
        "cut": sum(r["utterances"] > 1 for r in rows),
        "not_heard": sum(r["utterances"] == 0 for r in rows),
        "final_after_speech_end_p50_s": round(float(np.median(delays)), 3) if delays else None,
    }


async def run(config: Any, conditions: list[Condition], utterances: list[Utterance], front_ends: list[str]) -> dict:
    stt = _stt(config)
    await stt.transcribe(np.zeros(SPEECH_RATE // 2, np.int16))  # the first pass allocates: not part of the figures
    results: dict[str, dict[str, Any]] = {}
    for condition in conditions:
        for front_end in front_ends:
            audio = config.audio.model_copy(update={"noise_suppression": FRONT_ENDS[front_end]})
            rows = await hear_condition(config.model_copy(update={"audio": audio}), stt, condition, utterances)
            results.setdefault(condition.name, {})[front_end] = {"summary": summarize(rows), "rows": rows}
    return results


def table(results: dict, front_ends: list[str]) -> str:
    head = (
        f"{'condition':28s} {'front end':9s} {'WER':>6s} {'x clean':>7s} {'ended':>6s} {'cut':>4s} "
        f"{'unheard':>7s} {'final p50':>9s}"
    )
    lines = [head]
    clean = {fe: results.get("clean", {}).get(fe, {}).get("summary", {}).get("wer") for fe in front_ends}
    for name, by_front_end in results.items():
        for fe in front_ends:
            s = by_front_end[fe]["summary"]
            ratio = f"{s['wer'] / clean[fe]:.1f}" if clean.get(fe) else "-"
            final = (
                f"{s['final_after_speech_end_p50_s'] * 1000:.0f} ms"
                if s["final_after_speech_end_p50_s"] is not None
                else "-"
            )
            lines.append(
                f"{name:28s} {fe:9s} {s['wer']:6.3f} {ratio:>7s} {s['ended_in_noise']:>3d}/{s['requests']:<2d} "
                f"{s['cut']:4d} {s['not_heard']:7d} {final:>9s}"
            )
    return "\n".join(lines)


def _stt(config: Any) -> Any:
    from voice.hearing.stt import SpeechToText

    return SpeechToText.from_config(config)


def echo_main(config: Any, out: Path) -> int:
    from voice.bench import room_echo

    load = os.getloadavg()[0]
    vad_path = str(resolve(config.models.vad, "vad", config.models.cache_dir).path)
    results = room_echo.compare(_stt(config), vad_path)
    print(f"machine: {os.cpu_count()} CPUs, 1-minute load average at start {load:.1f}")
    print(room_echo.table(results))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stt": config.models.stt, "echo": results}, indent=1))
    print(f"wrote {out}")
    return 0


def main(config: Any, args: Any, extra: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench rooms")
    p.add_argument("--conditions", default="holdout", help=CONDITIONS_HELP)
    p.add_argument("--voices", type=positive, default=4, help="clean voices of the complete-turn set")
    p.add_argument("--per-voice", type=positive, default=5, help="requests per voice")
    p.add_argument("--front-end", choices=("both", *FRONT_ENDS), default="both")
    p.add_argument("--echo", action="store_true", help="compare the echo cancellers instead (voice/bench/room_echo.py)")
    p.add_argument("--json", default="bench-results/rooms.json", help="JSON results file")
    opts = p.parse_args(extra)
    if opts.echo:
        return echo_main(config, Path(opts.json))
    try:
        conditions = chosen(opts.conditions)
    except ValueError as exc:
        print(f"specvoice bench rooms: {exc}")
        return 2
    front_ends = list(FRONT_ENDS) if opts.front_end == "both" else [opts.front_end]
    utterances = requests(opts.voices, opts.per_voice)
    load = os.getloadavg()[0]
    started = time.time()
    results = asyncio.run(run(config, conditions, utterances, front_ends))
    print(f"machine: {os.cpu_count()} CPUs, 1-minute load average at start {load:.1f}; {len(utterances)} requests")
    print(f"(each request ends in {TURN_TAIL_S:g} s of the condition's noise; 'ended': turns ended inside it)")
    print(table(results, front_ends))
    out = Path(opts.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": round(load, 2), "python": platform.python_version()},
        "stt": config.models.stt,
        "duration_s": round(time.time() - started, 1),
        "requests": [u.id for u in utterances],
        "results": results,
    }
    out.write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0
