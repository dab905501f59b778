"""`specvoice bench speech`: how fast and how well the ears and the mouth work on this machine.

STT: a set of utterances is generated with two synthesizers (espeak-ng and piper), each played in real time
with silence around it through the ears (VAD -> streaming STT with partials), exactly as a microphone would
deliver it. Reported: real-time factor of one whole-utterance Whisper pass, final-transcript latency after
the endpoint and after the end of speech (which includes the endpointing wait), and word error rate.
TTS: time to first audio for a short and a long fragment, and real-time factor, over a few repeats.
Prints a table; writes JSON (default bench-results/speech.json).
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
from voice.events import TranscriptPartial
from voice.models import resolve
from voice.speechset import SENTENCES, espeak_utterance, normalize_words, piper_utterance, wer

SHORT_FRAGMENT = "Sure, the light is on."
LONG_FRAGMENT = (
    "The kitchen light is on now, and the heating in the living room is set to a comfortable "
    "temperature for the rest of the evening, so you can relax and enjoy your dinner."
)


# ---- the benchmark ------------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def hear_file(config: Any, stt: Any, path: Path) -> list[dict[str, Any]]:
    """Play a WAV through the product's Listener (real-time paced blocks, as a microphone delivers them) and
    return each utterance it heard, with its times on the audio clock and when its final transcript was ready."""
    from audio.sources import WavSource
    from voice.hearing.listener import Listener
    from voice.hearing.utterance import UtteranceEnded

    listener = Listener.from_config(config, stt)
    source = WavSource(path, block_ms=config.audio.block_ms, tail_silence_ms=config.vad.end_silence_ms + 300)
    heard, partials = [], 0
    async for chunk in source:
        for event in await listener.accept_chunk(chunk.samples, chunk.t):
            partials += isinstance(event, TranscriptPartial)
            if isinstance(event, UtteranceEnded):
                u = event.utterance
                text = await u.final()
                heard.append(
                    {
                        "text": text,
                        "speech_start": u.speech_start,
                        "speech_end": u.speech_end,
                        "endpoint": u.endpoint,
                        "final_done": time.monotonic(),
                        "partials": partials,
                        "final_decoded": bool(u.stream.final_decoded),
                        "file_start": source.start_t,  # the audio clock of the file's first sample
                    }
                )
                partials = 0
    await listener.close()
    return heard


async def bench_stt(config, sentences: list[str], lead_ms: int = 500) -> dict:
    from voice.hearing.stt import SpeechToText

    stt = SpeechToText.from_config(config)
    await stt.transcribe(espeak_utterance("warm up"))  # first pass allocates; not part of the figures
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        items = [(g.__name__.split("_")[0], s, g(s)) for s in sentences for g in (espeak_utterance, piper_utterance)]
        for voice, text, speech in tqdm(items, desc="stt", disable=None, leave=False):
            t = time.perf_counter()
            whole = await stt.transcribe(speech)
            rtf = (time.perf_counter() - t) / (len(speech) / SPEECH_RATE)
            path = Path(tmp) / "u.wav"
            write_wav(path, np.concatenate([np.zeros(SPEECH_RATE * lead_ms // 1000, np.int16), speech]), SPEECH_RATE)
            heard = await hear_file(config, stt, path)
            text_out = " ".join(h["text"] for h in heard)
            last = heard[-1] if heard else None
            rows.append(
                {
                    "voice": voice,
                    "reference": text,
                    "audio_s": round(len(speech) / SPEECH_RATE, 3),
                    "rtf": round(rtf, 3),
                    "whole_pass_text": whole,
                    "streamed_text": text_out,
                    "wer": round(wer(text, text_out), 3),
                    "utterances_heard": len(heard),
                    "partials": sum(h["partials"] for h in heard),
                    "final_needed_a_pass": any(h["final_decoded"] for h in heard),
                    "final_after_endpoint_s": round(last["final_done"] - last["endpoint"], 3) if last else None,
                    "final_after_speech_end_s": round(last["final_done"] - last["speech_end"], 3) if last else None,
                }
            )
    after_endpoint = [r["final_after_endpoint_s"] for r in rows if r["final_after_endpoint_s"] is not None]
    after_end = [r["final_after_speech_end_s"] for r in rows if r["final_after_speech_end_s"] is not None]
    refs = sum(len(normalize_words(r["reference"])) for r in rows)
    return {
        "model": config.models.stt,
        "compute_type": config.stt.compute_type,
        "threads": config.stt.threads,
        "utterances": len(rows),
        "rtf_mean": round(float(np.mean([r["rtf"] for r in rows])), 3),
        "final_after_endpoint_p50_s": round(_pct(after_endpoint, 50), 3),
        "final_after_endpoint_p95_s": round(_pct(after_endpoint, 95), 3),
        "final_after_speech_end_p50_s": round(_pct(after_end, 50), 3),
        "final_after_speech_end_p95_s": round(_pct(after_end, 95), 3),
        "wer": round(sum(r["wer"] * len(normalize_words(r["reference"])) for r in rows) / refs, 3),
        "finals_without_a_new_pass": sum(not r["final_needed_a_pass"] for r in rows),
        "endpoint_silence_ms": config.vad.end_silence_ms,
        "rows": rows,
    }


async def bench_tts(config, repeats: int) -> dict:
    from voice.speaking.tts import TextToSpeech

    tts = TextToSpeech(resolve(config.models.tts, "tts", config.models.cache_dir), config.tts)
    async for _ in tts.stream("Warm up."):
        pass
    out = {"voice": config.models.tts, "sample_rate": tts.sample_rate}
    for label, text in (("short", SHORT_FRAGMENT), ("long", LONG_FRAGMENT)):
        firsts: list[float] = []
        rtfs: list[float] = []
        for _ in tqdm(range(repeats), desc=f"tts {label}", disable=None, leave=False):
            t0 = time.perf_counter()
            first, samples = None, 0
            async for pcm in tts.stream(text):
                first = first if first is not None else time.perf_counter() - t0
                samples += len(pcm)
            firsts.append(first if first is not None else float("nan"))
            rtfs.append((time.perf_counter() - t0) / (samples / tts.sample_rate))
        out[label] = {
            "chars": len(text),
            "first_audio_p50_s": round(_pct(firsts, 50), 3),
            "first_audio_max_s": round(max(firsts), 3),
            "rtf_p50": round(_pct(rtfs, 50), 3),
        }
    return out


def _table(stt: dict, tts: dict) -> str:
    lines = [
        f"STT {stt['model']} ({stt['compute_type']}, {stt['threads']} threads), {stt['utterances']} utterances "
        f"(espeak-ng + piper), endpoint silence {stt['endpoint_silence_ms']} ms",
        f"  {'real-time factor (one whole pass)':42s} {stt['rtf_mean']:8.3f}",
        f"  {'final after endpoint p50 / p95 (s)':42s} {stt['final_after_endpoint_p50_s']:8.3f} / "
        f"{stt['final_after_endpoint_p95_s']:.3f}",
        f"  {'final after speech end p50 / p95 (s)':42s} {stt['final_after_speech_end_p50_s']:8.3f} / "
        f"{stt['final_after_speech_end_p95_s']:.3f}",
        f"  {'finals that reused the pause-time pass':42s} {stt['finals_without_a_new_pass']:8d} / {stt['utterances']}",
        f"  {'word error rate':42s} {stt['wer']:8.3f}",
        f"TTS {tts['voice']} ({tts['sample_rate']} Hz)",
    ]
    for label in ("short", "long"):
        row = tts[label]
        lines.append(
            f"  {label + ' fragment (' + str(row['chars']) + ' chars): first audio p50 (s)':42s} "
            f"{row['first_audio_p50_s']:8.3f}   real-time factor {row['rtf_p50']:.3f}"
        )
    return "\n".join(lines)


def main(config, args, extra: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specvoice bench speech")
    parser.add_argument("--out", default="bench-results/speech.json", help="JSON results file")
    parser.add_argument("--sentences", type=positive, default=len(SENTENCES), help="test sentences (x2 voices)")
    parser.add_argument("--repeats", type=positive, default=5, help="TTS repeats per fragment")
    opts = parser.parse_args(extra)
    started = time.time()
    load = os.getloadavg()[0]
    stt = asyncio.run(bench_stt(config, SENTENCES[: max(1, opts.sentences)]))
    tts = asyncio.run(bench_tts(config, max(1, opts.repeats)))
    print(f"machine: {os.cpu_count()} CPUs, 1-minute load average at start {load:.1f} (other work slows every figure)")
    print(_table(stt, tts))
    result = {
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": round(load, 2), "python": platform.python_version()},
        "started": started,
        "duration_s": round(time.time() - started, 1),
        "stt": stt,
        "tts": tts,
    }
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0
