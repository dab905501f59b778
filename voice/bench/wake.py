"""`specvoice bench wake`: the home device's wake word on a shelf, missed and falsely heard.

Both through the device's own Listener and wake word (voice/hearing/wake.py: openWakeWord listens, Whisper
confirms), and, for comparison, through the openWakeWord detector alone:
- **Misses per 100 wake words**: "Hey Jarvis, <request>" (a short pause after the wake phrase, as people say it) in
  each wake voice (the piper voice at three speeds, eight espeak-ng accents), heard in each listening condition
  (voice/roomset.py: a room, the talker's distance, a noise), each clip to a device just switched on. A clip is
  missed when no turn opens; the detector alone misses it when it does not fire between the start of the wake
  phrase and a second and a half after it.
- **The television**: a channel (``television_channel``: several voices saying sentences of every kind, requests
  for the home among them, over music) across the room for ``--tv-minutes``, with nobody addressing the device.
  Counted: the turns the Listener opens with its wake word (a turn is what the assistant replies to), its wakes,
  the detector's own fires, the recogniser's checks and their share of a core; and the speech starts of its VAD:
  each would open a turn on a device that listens without a wake word.
`--conditions holdout` (the default) reports the held-out conditions; `tuning` is the other room, for setting
the detector's threshold. Prints a table, writes JSON (`--json`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from audio.frames import SPEECH_RATE, AudioChunk
from voice.bench import positive, seconds
from voice.hearing.parts import wake_word
from voice.hearing.stt import SpeechToText
from voice.hearing.wake import WakePhrase
from voice.models import resolve
from voice.roomset import CONDITIONS_HELP, Condition, chosen, television_channel
from voice.speechset import Utterance
from voice.wakeset import BLOCK, WAKE_PHRASE, channel_lines, device_listener, fires, listen, wake_clips

HIT_AFTER_S = 1.5  # a fire this long after the wake phrase ends still answers it (the detector's own delay)
HOLDOUT = (
    Condition(),
    Condition("living-room", 3.0),
    Condition("living-room", 3.0, "babble", 10.0),
    Condition("living-room", 3.0, "tv", 10.0),
    Condition("living-room", 3.0, "fan", 10.0),
)
TUNING = (
    Condition("kitchen", 1.0),
    Condition("kitchen", 3.0, "babble", 10.0),
    Condition("kitchen", 3.0, "fan", 10.0),
)


async def misses(
    config: Any, stt: SpeechToText, wake: WakePhrase, condition: Condition, clips: list[Utterance]
) -> dict:
    """Per clip: a turn opened (the wake phrase was heard), and whether the detector alone fired."""
    rows = []
    for clip in tqdm(clips, desc=condition.name, disable=None, leave=False):
        start, end = clip.spans[0]
        audio = condition.hear(clip).audio
        listener = device_listener(config, stt, wake)  # each clip to a device just switched on
        heard = await listen(listener, wake, np.concatenate([audio, np.zeros(SPEECH_RATE, np.int16)]))
        await listener.close()
        at = fires(wake.detector, audio)
        rows.append(
            {
                "id": clip.id,
                "turn": any(t >= start for t in heard.turns),
                "detector": any(start <= t <= end + HIT_AFTER_S for t in at),
                "detector_other_fires": sum(not start <= t <= end + HIT_AFTER_S for t in at),
            }
        )
    by_voice: dict[str, int] = {}
    for r in rows:
        by_voice[r["id"].split("/")[0]] = by_voice.get(r["id"].split("/")[0], 0) + (not r["turn"])
    n = len(rows)
    return {
        "wake_words": n,
        "missed": sum(not r["turn"] for r in rows),
        "misses_per_100": round(100 * sum(not r["turn"] for r in rows) / n, 1),
        "detector_alone_misses_per_100": round(100 * sum(not r["detector"] for r in rows) / n, 1),
        "detector_other_fires": sum(r["detector_other_fires"] for r in rows),
        "missed_by_voice": by_voice,
    }


async def television(config: Any, stt: SpeechToText, wake: WakePhrase, audio: np.ndarray) -> dict[str, Any]:
    """On the channel's audio: the detector's own fires, the device's Listener with its wake word (turns opened,
    the recogniser's checks and their cost), and its VAD's speech starts (the turns a device without a wake word
    would open)."""
    from voice.hearing.parts import listener_parts

    alone = fires(wake.detector, audio)
    listener = device_listener(config, stt, wake)
    heard = await listen(listener, wake, audio)
    await listener.close()
    vad = listener_parts(config, turn_model=None).vad
    assert vad is not None
    starts = sum(
        e.kind == "speech_start"
        for i in range(0, len(audio), BLOCK)
        for e in vad.process(AudioChunk(audio[i : i + BLOCK], SPEECH_RATE, i / SPEECH_RATE))
    )
    minutes = len(audio) / SPEECH_RATE / 60
    return {
        "minutes": round(minutes, 1),
        "detector_fires": len(alone),
        "detector_fires_per_hour": round(len(alone) * 60 / minutes, 1),
        "woken": heard.woken,
        "woken_per_hour": round(heard.woken * 60 / minutes, 1),
        "turns_with_wake_word": len(heard.turns),
        "turn_times_s": [round(t, 1) for t in heard.turns],
        "turns_without_wake_word": starts,
        "checks": heard.checks,
        "check_share_of_a_core": round(heard.check_s / (minutes * 60), 3),
    }


def table(results: dict[str, Any]) -> str:
    head = f"{'condition':28s} {'wake words':>10s} {'missed':>6s} {'per 100':>7s} {'detector alone':>14s}"
    lines = [head]
    for name, r in results["misses"].items():
        alone = f"{r['detector_alone_misses_per_100']:.1f}"
        lines.append(f"{name:28s} {r['wake_words']:10d} {r['missed']:6d} {r['misses_per_100']:7.1f} {alone:>14s}")
    if (tv := results.get("television")) is not None:
        lines += [
            f"television, {tv['minutes']:g} min across the living room, nobody addressing the device:",
            f"  turns opened: {tv['turns_with_wake_word']} with the wake word, {tv['turns_without_wake_word']} without",
            f"  wakes {tv['woken']} ({tv['woken_per_hour']:g} per hour); the detector alone fired "
            f"{tv['detector_fires']} times ({tv['detector_fires_per_hour']:g} per hour)",
            f"  the recogniser's checks: {tv['checks']}, {100 * tv['check_share_of_a_core']:.1f}% of a core",
        ]
    return "\n".join(lines)


def main(config: Any, args: Any, extra: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench wake")
    p.add_argument("--conditions", default="holdout", help=CONDITIONS_HELP)
    p.add_argument("--requests", type=positive, default=12, help="requests after the wake phrase, per voice")
    p.add_argument("--tv-minutes", type=seconds, default=10.0, help="minutes of television (0: none)")
    p.add_argument("--tv-room", default="living-room", help="the room the television plays in")
    p.add_argument("--threshold", type=float, default=None, help="the detector's threshold (default: its own)")
    p.add_argument("--json", default="bench-results/wake.json", help="JSON results file")
    opts = p.parse_args(extra)
    if (config.models.wake_word or "hey_jarvis") != "hey_jarvis":
        print(f"specvoice bench wake: the clips say {WAKE_PHRASE!r}; fix: --set models.wake_word=hey_jarvis")
        return 2
    try:
        conditions = chosen(opts.conditions, HOLDOUT, TUNING)
    except ValueError as exc:
        print(f"specvoice bench wake: {exc}")
        return 2
    config = config.model_copy(update={"models": config.models.model_copy(update={"wake_word": "hey_jarvis"})})
    detector = wake_word(config)
    assert detector is not None
    if opts.threshold is not None:
        detector.threshold = opts.threshold
    stt = SpeechToText(resolve(config.models.stt, "stt", config.models.cache_dir), config.stt)
    wake = WakePhrase(detector, stt, config.stt.partial_beam_size)
    load = os.getloadavg()[0]
    started = time.time()
    clips = wake_clips(opts.requests)

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {"misses": {}}
        for condition in conditions:
            out["misses"][condition.name] = await misses(config, stt, wake, condition, clips)
        if opts.tv_minutes > 0:
            audio = television_channel(channel_lines(), opts.tv_minutes * 60, room=opts.tv_room)
            out["television"] = await television(config, stt, wake, audio)
        return out

    results = asyncio.run(run())
    print(f"machine: {os.cpu_count()} CPUs, 1-minute load average at start {load:.1f}")
    print(f"wake word hey_jarvis, detector threshold {detector.threshold:g}; {len(clips)} clips per condition")
    print(table(results))
    out = Path(opts.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": round(load, 2), "python": platform.python_version()},
        "wake_word": "hey_jarvis",
        "threshold": detector.threshold,
        "duration_s": round(time.time() - started, 1),
        "results": results,
    }
    out.write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0
