"""`specvoice bench backchannel`: does "mhm" leave the reply playing, and does "stop" stop it?

Each trial: a session speaks a long announcement (``Session.say``: no LLM, so every trial hears the same reply) into
a real-time WAV sink; the microphone side hears the reply's own echo from its start (so the echo canceller, the gate
and the VAD are as warm as a real device's), and once ``--after`` seconds of it have played, a clip is played into
it, mixed over that echo (the played audio, delayed and attenuated, as a room returns it; the exact played signal
goes to the echo canceller as its reference), followed by silence. The session's verdict is read from its counters:
``resumed`` (a backchannel: the reply goes on) or ``interrupted`` (a barge-in). Clips: acknowledgements and a laugh
in piper and espeak-ng voices, a synthetic cough (a shaped noise burst), and real interruptions ("stop", "wait",
"no, I meant ..."). Reported per clip kind: the share decided right, and the time from the end of the clip to the
verdict (how long the reply is quiet for a backchannel). Prints a table and writes JSON
(default bench-results/backchannel.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.sinks import WavSink
from voice import tasks
from voice.assistant import Assistant
from voice.bench import positive, seconds
from voice.speechset import voices

BACKCHANNELS = ("Mhm.", "Uh-huh.", "Yeah.", "Okay.", "Right.", "Yeah, okay.", "I see.", "Ha ha ha.")
INTERRUPTIONS = (
    "Stop.",
    "Wait.",
    "No, I meant the other one.",
    "Hold on a second.",
    "Stop, that's enough.",
    "Wait, what about Paris?",
    "Actually, tell me about dogs instead.",
)
VOICES = voices("piper-joe", "piper-joe-fast", "espeak-us", "espeak-scotland-f3", "espeak-nyc-f2")
ANNOUNCEMENT = (
    "Here is the weather for the coming week. Monday starts cloudy with a little rain in the afternoon, and "
    "Tuesday brings sunshine and a light breeze from the west. On Wednesday the clouds return, and Thursday "
    "looks wet all day, so keep an umbrella close. Friday and the weekend should be dry and warm."
)
BLOCK = SPEECH_RATE * 20 // 1000
ECHO_DELAY_S = 0.06  # a speaker and a microphone a little apart


def cough(seed: int) -> np.ndarray:
    """A cough-like sound: a 250 ms burst of low-passed noise with a fast attack and a decay (no words)."""
    rng = np.random.default_rng(seed)
    n = int(0.25 * SPEECH_RATE)
    noise = np.convolve(rng.standard_normal(n), np.ones(6) / 6, mode="same")
    envelope = np.minimum(1.0, np.arange(n) / (0.01 * SPEECH_RATE)) * np.exp(-np.arange(n) / (0.08 * SPEECH_RATE))
    return (noise * envelope / np.max(np.abs(noise)) * 12000).astype(np.int16)


def clips() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"kind": "backchannel", "say": text, "voice": v.name, "audio": v.speak(text)}
        for text in BACKCHANNELS
        for v in VOICES
    ]
    out += [{"kind": "backchannel", "say": "(cough)", "voice": f"noise-{i}", "audio": cough(i)} for i in range(5)]
    out += [
        {"kind": "interruption", "say": text, "voice": v.name, "audio": v.speak(text)}
        for text in INTERRUPTIONS
        for v in VOICES
    ]
    return out


async def trial(
    assistant: Assistant, clip: dict[str, Any], after_s: float, timeout_s: float, echo_gain: float
) -> dict[str, Any]:
    sink = WavSink(None, assistant.tts_sample_rate, realtime=True)
    session = assistant.session(lambda event: None, sink=sink)
    loop = asyncio.get_running_loop()
    speaking = tasks.start(session.say(ANNOUNCEMENT), name="announcement")
    delay = int(ECHO_DELAY_S * SPEECH_RATE)
    echo_tail = np.zeros(delay, np.int16)
    t = loop.time()
    silence = int(timeout_s * SPEECH_RATE) + (-len(clip["audio"])) % BLOCK  # whole blocks
    audio = np.concatenate([clip["audio"], np.zeros(silence, np.int16)])
    clip_start: float | None = None  # the microphone hears the echo from the start; the clip once after_s played
    i, verdict, decided_t = 0, None, None
    while i < len(audio):
        played = sink.played_reference(t, t + BLOCK / SPEECH_RATE)  # what the speaker plays in this block
        reference = resample(played, sink.sample_rate, SPEECH_RATE)[:BLOCK]
        reference = np.pad(reference, (0, BLOCK - len(reference)))
        echo_tail = np.concatenate([echo_tail, reference])
        if clip_start is None and (sink.played_samples >= after_s * sink.sample_rate or speaking.done()):
            clip_start = t
        user = np.zeros(BLOCK, np.float32)
        if clip_start is not None:
            user, i = audio[i : i + BLOCK].astype(np.float32), i + BLOCK
        mic = user + echo_tail[:BLOCK] * echo_gain
        echo_tail = echo_tail[BLOCK:]
        await session.push_audio(np.clip(mic, -32768, 32767).astype(np.int16), t, reference=reference)
        t += BLOCK / SPEECH_RATE
        counts = session.backchannels
        if counts["resumed"] or counts["interrupted"]:
            verdict = "backchannel" if counts["resumed"] else "interruption"
            decided_t = loop.time()
            break
        if clip_start is not None and speaking.done() and t > clip_start + len(clip["audio"]) / SPEECH_RATE + 1.0:
            break  # the reply ended and no hold was ever started or decided
        await asyncio.sleep(max(0.0, t - loop.time()))
    clip_end = (clip_start if clip_start is not None else t) + len(clip["audio"]) / SPEECH_RATE
    await session.close()
    await tasks.cancel_and_wait(speaking)
    sink.close()
    return {
        "kind": clip["kind"],
        "say": clip["say"],
        "voice": clip["voice"],
        "held": session.backchannels["held"],
        "verdict": verdict,
        "heard": [{"text": w, "voiced_s": v and round(v, 2), "backchannel": b} for w, v, b in session.held_words],
        # a verdict before the clip began came from our own echo: wrong whatever it was
        "right": clip_start is not None
        and (decided_t is None or decided_t >= clip_start)
        and (verdict == clip["kind"] if clip["kind"] == "interruption" else verdict != "interruption"),
        "decided_after_clip_ms": None if decided_t is None else round((decided_t - clip_end) * 1000),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for kind in ("backchannel", "interruption"):
        rs = [r for r in rows if r["kind"] == kind]
        waits = [r["decided_after_clip_ms"] for r in rs if r["decided_after_clip_ms"] is not None]
        heard = [r for r in rs if r["held"]]
        out[kind] = {
            "n": len(rs),
            "right": sum(r["right"] for r in rs),
            "right_pct": round(100 * sum(r["right"] for r in rs) / max(1, len(rs)), 1),
            "not_heard": len(rs) - len(heard),  # the VAD and echo gate never started speech: no hold at all
            "right_of_heard_pct": round(100 * sum(r["right"] for r in heard) / max(1, len(heard)), 1),
            "decided_after_clip_ms_p50": float(np.median(waits)) if waits else None,
            "wrong": [f"{r['say']} ({r['voice']}): {r['verdict']}" for r in rs if not r["right"]],
        }
    return out


async def bench(config: Any, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench backchannel", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default="bench-results/backchannel.json")
    p.add_argument("--limit", type=positive, help="only every k-th clip, so about this many in all")
    p.add_argument("--after", type=seconds, default=1.0, help="seconds of the reply played before the clip")
    p.add_argument("--timeout", type=seconds, default=4.0, help="seconds of silence after the clip, at most")
    p.add_argument(
        "--echo-gain", type=seconds, default=0.3, help="the reply's echo in the microphone (0: none; 0.3: a desk)"
    )
    args = p.parse_args(argv)
    assistant = await Assistant.load(config)
    chosen = clips()
    if args.limit:
        chosen = chosen[:: max(1, len(chosen) // args.limit)]
    rows = []
    started = time.monotonic()
    for clip in tqdm(chosen, desc="clips", unit="clip", disable=None):
        rows.append(await trial(assistant, clip, args.after, args.timeout, args.echo_gain))
    await assistant.close()
    summary = summarize(rows)
    print(
        f"\nbench backchannel: {len(rows)} clips over a spoken reply (echo gain {args.echo_gain}), "
        f"{time.monotonic() - started:.0f} s"
    )
    print(f"{'clip kind':<14}{'n':>4}{'right':>8}{'not heard':>11}{'right of heard':>16}{'verdict after clip p50':>24}")
    for kind, s in summary.items():
        wait = "-" if s["decided_after_clip_ms_p50"] is None else f"{s['decided_after_clip_ms_p50']:.0f} ms"
        print(
            f"{kind:<14}{s['n']:>4}{s['right_pct']:>7.1f}%{s['not_heard']:>11}{s['right_of_heard_pct']:>15.1f}%"
            f"{wait:>24}"
        )
    for kind, s in summary.items():
        for wrong in s["wrong"]:
            print(f"  wrong {kind}: {wrong}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"machine": platform.processor(), "echo_gain": args.echo_gain, "summary": summary, "trials": rows},
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0


def main(config: Any, args: Any, extra: list[str]) -> int:
    return asyncio.run(bench(config, extra))
