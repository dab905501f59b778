"""Which Whisper model and decoding to use, and when a turn is over: measured on the varied-voice sets.

Run: ``python -m voice.bench.stt_accuracy [--models ...] [--beams 1,5] [--skip-stt] [--skip-turn]``; prints
two tables and writes JSON (default bench-results/stt_accuracy.json). Every figure here is a wall-clock time.

STT: one offline whole-utterance pass per utterance of ``speechset.varied_set()`` (14 voices: espeak accents
and speeds, piper at three speeds, three with background noise) through ``SpeechToText.decode``, the same
call the streaming path makes (word timestamps included), per model and beam size. Reported: word error
rate (all, clean voices, noisy voices), mean and p95 time of one pass, real-time factor.

End of turn: every utterance of ``complete_turns()`` and ``paused_turns()`` goes through the silero VAD in
20 ms blocks and then through ``EndOfTurnPolicy`` with several settings, against the VAD-only rule
(500 ms of silence). When the policy asks, Smart Turn runs on the turn's audio up to that moment (and, for
the "+text" rows, Whisper tiny.en transcribes the same audio); the answer counts from the ask time plus the
measured time of both calls, as it would in a live stream. Reported: false cuts (a paused request ended in
its pause), and the endpointing wait on complete requests (end of speech -> END), p50 and p95.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from audio.end_of_turn import (
    TRANSCRIPT_PROMPT,
    EndOfTurnPolicy,
    SmartTurn,
    TurnAction,
    TurnSettings,
)
from audio.frames import SPEECH_RATE, AudioChunk
from audio.vad import Vad
from voice.bench import count, positive
from voice.config import STTConfig
from voice.hearing.stt import SpeechToText
from voice.home_casefile import home_hotwords
from voice.models import resolve
from voice.speechset import (
    Utterance,
    complete_turns,
    normalize_words,
    paused_turns,
    varied_set,
    wer,
)

BLOCK = SPEECH_RATE // 50  # 20 ms, as the microphone delivers it
PREROLL_S = 0.3  # the VAD's pre-roll: the turn audio starts this long before the detected speech start


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3) if values else float("nan")


def _text(stt: SpeechToText, audio: np.ndarray, prompt: str | None = None) -> str:
    return "".join(w.text for w in stt.decode(audio.astype(np.float32) / 32768.0, prompt)).strip()


def _corpus_wer(rows: list[dict]) -> float:
    words = sum(r["ref_words"] for r in rows)
    return round(sum(r["wer"] * r["ref_words"] for r in rows) / max(1, words), 4)


# ---- STT ------------------------------------------------------------------------------------------------------


def bench_stt(
    models: list[str],
    beams: list[int],
    utterances: tuple[Utterance, ...],
    threads: int,
    windows: list[int],
    hotwords: list[str] | None = None,
    prompt: str | None = None,
) -> list[dict]:
    """Every (model, beam, window) on every utterance, interleaved (each utterance goes through all settings in
    turn), so a busy neighbour slows every setting alike and the latency columns compare fairly. ``windows``:
    stt.window_s values (30: Whisper's padded window; 0: fitted to the audio, for a prompted pass). ``hotwords``:
    each setting also with these stt.hotwords (does the hint cost words on speech that has none of them?).
    ``prompt``: every pass with this initial prompt (TRANSCRIPT_PROMPT: as the pass at a pause)."""
    hints: list[list[str]] = [[], hotwords] if hotwords else [[]]
    setups = [
        (
            (model, beam, window, len(hint)),
            SpeechToText(
                resolve(model, "stt"),
                STTConfig(language="en", compute_type="int8", beam_size=beam, threads=threads, window_s=window),
                hotwords=hint,
            ),
        )
        for model in models
        for beam in beams
        for window in windows
        for hint in hints
    ]
    for _, stt in setups:
        _text(stt, utterances[0].audio)  # the first pass allocates; not part of the figures
    rows: dict[tuple[str, int, int, int], list[dict]] = {key: [] for key, _ in setups}
    for u in tqdm(utterances, desc="stt", disable=None, leave=False):
        for key, stt in setups:
            t0 = time.perf_counter()
            text = _text(stt, u.audio, prompt)
            seconds = time.perf_counter() - t0
            rows[key].append(
                {
                    "id": u.id,
                    "voice": u.voice.name,
                    "noisy": u.voice.noise is not None,
                    "reference": u.text,
                    "text": text,
                    "wer": round(wer(u.text, text), 4),
                    "ref_words": len(normalize_words(u.text)),
                    "audio_s": round(len(u.audio) / SPEECH_RATE, 3),
                    "pass_s": round(seconds, 4),
                }
            )
    results = []
    for (model, beam, window, n_hints), rs in rows.items():
        passes = [r["pass_s"] for r in rs]
        voices = sorted({r["voice"] for r in rs})
        results.append(
            {
                "model": model,
                "beam": beam,
                "window_s": window,
                "prompt": prompt,
                "hotwords": n_hints,
                "threads": threads,
                "utterances": len(rs),
                "wer": _corpus_wer(rs),
                "wer_clean": _corpus_wer([r for r in rs if not r["noisy"]]),
                "wer_noisy": _corpus_wer([r for r in rs if r["noisy"]]),
                "wer_by_voice": {v: _corpus_wer([r for r in rs if r["voice"] == v]) for v in voices},
                "mean_audio_s": round(float(np.mean([r["audio_s"] for r in rs])), 3),
                "pass_mean_s": round(float(np.mean(passes)), 4),
                "pass_p50_s": _pct(passes, 50),
                "pass_p95_s": _pct(passes, 95),
                "rtf": round(sum(passes) / sum(r["audio_s"] for r in rs), 4),
                "rows": rs,
            }
        )
    return results


def stt_table(results: list[dict]) -> str:
    if not results:
        return ""
    lines = [
        (
            f"{'model':18s} {'beam':>4s} {'window':>6s} {'hotwords':>8s} {'WER':>6s} {'clean':>6s} {'noisy':>6s} "
            f"{'pass mean':>10s} {'pass p95':>9s} {'RTF':>6s}   (one offline pass per utterance, mean audio "
            f"{results[0]['mean_audio_s']:.2f} s, {results[0]['utterances']} utterances)"
        )
    ]
    for r in results:
        lines.append(
            f"{r['model']:18s} {r['beam']:4d} {r['window_s'] or 'fit':>6} {r.get('hotwords', 0):8d} {r['wer']:6.3f} "
            f"{r['wer_clean']:6.3f} {r['wer_noisy']:6.3f} "
            f"{r['pass_mean_s'] * 1000:8.0f}ms {r['pass_p95_s'] * 1000:7.0f}ms {r['rtf']:6.3f}"
        )
    return "\n".join(lines)


# ---- end of turn ----------------------------------------------------------------------------------------------


@dataclass
class VadTrace:
    """The VAD's view of one utterance, block by block: (end time, speech, pause start)."""

    blocks: list[tuple[float, bool, float | None]]
    speech_start: float | None


def vad_trace(vad: Vad, audio: np.ndarray) -> VadTrace:
    vad.reset()
    blocks, start = [], None
    for i in range(0, len(audio) - BLOCK + 1, BLOCK):
        for event in vad.process(AudioChunk(audio[i : i + BLOCK], SPEECH_RATE, i / SPEECH_RATE)):
            if event.kind == "speech_start" and start is None:
                start = event.t
        t = (i + BLOCK) / SPEECH_RATE
        blocks.append((t, vad.speaking and vad.pause_since is None, vad.pause_since))
    return VadTrace(blocks, start)


@dataclass
class Probe:
    """What the policy is told when it asks at one moment of one utterance, and what that cost."""

    probability: float
    smart_s: float
    text: str
    stt_s: float


class Prober:
    """Runs Smart Turn and the tiny.en pass at most once per (utterance, moment): the policy variants share
    the answers."""

    def __init__(self, smart: SmartTurn, stt: SpeechToText, prompt: str | None) -> None:
        self.smart, self.stt, self.prompt = smart, stt, prompt
        self._done: dict[tuple[str, int], Probe] = {}

    def __call__(self, u: Utterance, start_s: float, end_s: float, pause_start_s: float | None) -> Probe:
        key = (u.id, round(end_s * SPEECH_RATE))
        if key not in self._done:
            clip_start = max(0.0, start_s - PREROLL_S)
            audio = u.audio[int(clip_start * SPEECH_RATE) : key[1]]
            t0 = time.perf_counter()
            p = self.smart.probability(audio)
            t1 = time.perf_counter()
            words = self.stt.decode(audio.astype(np.float32) / 32768.0, self.prompt)
            stt_s = time.perf_counter() - t1
            # only words that start before the pause: Whisper may invent one in the silence ("for it.")
            pause_at = pause_start_s - clip_start if pause_start_s is not None else float("inf")
            text = "".join(w.text for w in words if w.start < pause_at).strip()
            self._done[key] = Probe(p, t1 - t0, text, stt_s)
        return self._done[key]

    @property
    def smart_times(self) -> list[float]:
        return [p.smart_s for p in self._done.values()]

    @property
    def stt_times(self) -> list[float]:
        return [p.stt_s for p in self._done.values()]


@dataclass(frozen=True)
class Costs:
    """How long an answer takes to come back: fixed seconds (the same for every call, so policies compare
    on equal terms), or None for each call's own measured time."""

    smart_s: float | None
    stt_s: float | None

    def of(self, answer: Probe, transcript: bool) -> float:
        smart = answer.smart_s if self.smart_s is None else self.smart_s
        stt = answer.stt_s if self.stt_s is None else self.stt_s
        return max(smart, stt) if transcript else smart  # the two run at once, in two worker threads


@dataclass
class TurnResult:
    end_s: float | None  # when the policy ended the turn (utterance clock), None: never
    reason: str
    asks: int


def run_policy(
    u: Utterance,
    trace: VadTrace,
    settings: TurnSettings,
    model_ready: bool,
    probe: Callable[[Utterance, float, float, float | None], Probe],
    costs: Costs,
) -> TurnResult:
    """Play the VAD trace into a fresh policy; the answer to an ASK arrives ``costs`` later."""
    policy = EndOfTurnPolicy(settings, model_ready=model_ready)
    pending: tuple[float, int, Probe] | None = None
    for t, speech, pause in trace.blocks:
        if pending is not None and pending[0] <= t:
            due, ask_id, answer = pending
            pending = None
            step = policy.verdict(ask_id, answer.probability, due, answer.text if settings.use_transcript else None)
            if step.action is TurnAction.END:
                return TurnResult(due, step.reason, policy.asks)
        step = policy.observe(t, speech, pause)
        if step.action is TurnAction.END:
            return TurnResult(t, step.reason, policy.asks)
        if step.action is TurnAction.ASK:
            answer = probe(u, trace.speech_start or 0.0, t, policy.pause_start)
            pending = (t + costs.of(answer, settings.use_transcript), step.ask_id, answer)
    return TurnResult(None, "never", policy.asks)


def _policies(
    thresholds: list[float], max_silences: list[int], reasks: list[int], min_silence: int
) -> dict[str, TurnSettings]:
    out = {"vad-only 500 ms": TurnSettings(engine="vad", vad_silence_ms=500)}
    for text in (False, True):
        for th in thresholds:
            for mx in max_silences:
                for re_ms in reasks:
                    name = f"smart{'+text' if text else ''} p>={th} max {mx} reask {re_ms}"
                    out[name] = TurnSettings(
                        threshold=th, min_silence_ms=min_silence, max_silence_ms=mx, reask_ms=re_ms, use_transcript=text
                    )
    return out


def evaluate(settings: TurnSettings, traces: dict[str, VadTrace], prober: Prober, costs: Costs, pass_s: float) -> dict:
    """False cuts on the paused set; waits on the complete set: speech end -> END, and speech end -> the
    transcript ready (END itself when the deciding ask's tiny.en pass is the transcript, else END plus
    one pass of ``pass_s``)."""
    complete, paused = complete_turns(), paused_turns()
    waits, ready, cut_complete, early = [], [], 0, 0
    for u in complete:
        r = run_policy(u, traces[u.id], settings, True, prober, costs)
        if r.end_s is None:
            continue
        cut_complete += r.end_s < u.speech_end
        early += r.reason == "complete"
        waits.append(r.end_s - u.speech_end)
        with_text = settings.use_transcript and r.reason == "complete"
        ready.append(waits[-1] + (0.0 if with_text else pass_s))
    cuts: dict[str, int] = {}
    never = 0
    for u in paused:
        r = run_policy(u, traces[u.id], settings, True, prober, costs)
        assert u.pause is not None
        never += r.end_s is None
        if r.end_s is not None and r.end_s < u.pause[1]:
            cuts[u.voice.name] = cuts.get(u.voice.name, 0) + 1
    n_cuts = sum(cuts.values())
    return {
        "settings": asdict(settings),
        "false_cuts": n_cuts,
        "paused": len(paused),
        "false_cut_rate": round(n_cuts / len(paused), 4),
        "false_cuts_by_voice": cuts,
        "paused_never_ended": never,
        "complete": len(complete),
        "complete_cut_before_end": cut_complete,
        "complete_ended_by_model": early,
        "wait_p50_s": _pct(waits, 50),
        "wait_p95_s": _pct(waits, 95),
        "wait_mean_s": round(float(np.mean(waits)), 3) if waits else None,
        "transcript_ready_p50_s": _pct(ready, 50),
        "transcript_ready_p95_s": _pct(ready, 95),
    }


def bench_turn(
    policies: dict[str, TurnSettings], smart: SmartTurn, stt: SpeechToText, vad: Vad, prompt: str | None
) -> dict:
    """Every policy twice: with each model call's measured time (first), then with the p50 of those times
    for every call (the table: equal terms for all policies, and repeatable on a noisy machine)."""
    complete, paused = complete_turns(), paused_turns()
    traces = {u.id: vad_trace(vad, u.audio) for u in tqdm(complete + paused, desc="vad", disable=None, leave=False)}
    prober = Prober(smart, stt, prompt)
    measured = Costs(None, None)
    first_pass = {
        name: evaluate(settings, traces, prober, measured, 0.0)
        for name, settings in tqdm(policies.items(), desc="policies", disable=None, leave=False)
    }
    smart_p50, stt_p50 = float(np.median(prober.smart_times)), float(np.median(prober.stt_times))
    fixed = Costs(smart_p50, stt_p50)
    rows = {name: evaluate(settings, traces, prober, fixed, stt_p50) for name, settings in policies.items()}
    instant = Costs(0.0, 0.0)  # the rule alone: every answer at once (the most cuts a fast machine could make)
    for name, row in rows.items():
        row["false_cuts_with_measured_times"] = first_pass[name]["false_cuts"]
        row["wait_p50_s_with_measured_times"] = first_pass[name]["wait_p50_s"]
        zero = evaluate(policies[name], traces, prober, instant, 0.0)
        row["false_cuts_instant"], row["wait_p50_s_instant"] = zero["false_cuts"], zero["wait_p50_s"]
        row["complete_ended_by_model_instant"] = zero["complete_ended_by_model"]
    return {
        "policies": rows,
        "model_calls": len(prober.smart_times),
        "smart_turn_ms_p50": round(smart_p50 * 1000, 1),
        "smart_turn_ms_p95": _pct([s * 1000 for s in prober.smart_times], 95),
        "tiny_pass_ms_p50": round(stt_p50 * 1000, 1),
        "tiny_pass_ms_p95": _pct([s * 1000 for s in prober.stt_times], 95),
        "transcript_prompt": prompt,
        "paused_pauses_s": sorted({round(u.pause[1] - u.pause[0], 2) for u in paused if u.pause}),
        "utterances": {"complete": len(complete), "paused": len(paused)},
    }


def smart_turn_timing(path: Path, threads: list[int], repeats: int = 30) -> dict[str, dict]:
    """Inference time of one call on a full 8 s window (the model's cost does not depend on the length)."""
    audio = complete_turns()[0].audio
    out = {}
    for n in threads:
        model = SmartTurn(path, threads=n)
        model.probability(audio)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.probability(audio)
            times.append((time.perf_counter() - t0) * 1000)
        out[str(n)] = {"p50_ms": _pct(times, 50), "p95_ms": _pct(times, 95), "min_ms": round(min(times), 2)}
    return out


def turn_table(turn: dict) -> str:
    lines = [
        (
            f"{'end-of-turn rule':40s} {'false cuts':>12s} {'wait p50':>9s} {'wait p95':>9s} {'ready p50':>10s} "
            f"{'by model':>9s} | {'instant: cuts':>13s} {'wait p50':>9s}   ({turn['utterances']['paused']} paused "
            f"requests, pauses {turn['paused_pauses_s']} s; {turn['utterances']['complete']} complete)"
        )
    ]
    for name, r in turn["policies"].items():
        lines.append(
            f"{name:40s} {r['false_cuts']:4d} ({r['false_cut_rate']:5.1%}) {r['wait_p50_s'] * 1000:7.0f}ms "
            f"{r['wait_p95_s'] * 1000:7.0f}ms {r['transcript_ready_p50_s'] * 1000:8.0f}ms "
            f"{r['complete_ended_by_model']:5d}/{r['complete']} | {r['false_cuts_instant']:13d} "
            f"{r['wait_p50_s_instant'] * 1000:7.0f}ms"
        )
    lines.append(
        f"every answer charged the p50 call time: Smart Turn {turn['smart_turn_ms_p50']:.0f} ms (p95 "
        f"{turn['smart_turn_ms_p95']:.0f}), tiny.en pass {turn['tiny_pass_ms_p50']:.0f} ms (p95 "
        f"{turn['tiny_pass_ms_p95']:.0f}), {turn['model_calls']} calls; 'ready': speech end -> transcript"
    )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m voice.bench.stt_accuracy", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench-results/stt_accuracy.json")
    parser.add_argument("--models", default="whisper-tiny.en,whisper-base", help="comma-separated STT models")
    parser.add_argument("--beams", default="1,5", help="comma-separated beam sizes")
    parser.add_argument("--threads", type=positive, default=STTConfig().threads, help="STT CPU threads")
    parser.add_argument("--windows", default="0", help="stt.window_s values (30: padded; 0: fitted to the audio)")
    parser.add_argument("--prompt", choices=("none", "pause"), default="none", help="pause: as the pass at a pause")
    parser.add_argument(
        "--hotwords",
        default="",
        help="also decode with these stt.hotwords (comma-separated; 'home': the device names and areas of "
        "configs/home_cases.json, as voice.config.stt_hotwords makes them)",
    )
    parser.add_argument("--per-voice", type=count, default=0, help="STT: only the first N sentences per voice (0: all)")
    parser.add_argument("--thresholds", default="0.5,0.7,0.9")
    parser.add_argument("--max-silences", default="1000,1500")
    parser.add_argument("--reasks", default="0,300")
    parser.add_argument("--no-prompt", action="store_true", help="end of turn: the pass without TRANSCRIPT_PROMPT")
    parser.add_argument("--min-silence", type=positive, default=200)
    parser.add_argument("--turn-threads", type=positive, default=1, help="Smart Turn onnxruntime threads")
    parser.add_argument("--skip-stt", action="store_true")
    parser.add_argument("--skip-turn", action="store_true")
    opts = parser.parse_args(argv)
    started, load = time.time(), os.getloadavg()[0]
    result: dict = {
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": round(load, 2), "python": platform.python_version()},
        "started": started,
    }
    print(f"machine: {os.cpu_count()} CPUs, 1-minute load average at start {load:.1f}")
    if not opts.skip_stt:
        utterances = varied_set()
        if opts.per_voice:
            keep = {f"{i:02d}" for i in range(opts.per_voice)}
            utterances = tuple(u for u in utterances if u.id.rsplit("/", 1)[1] in keep)
        models = [m for m in opts.models.split(",") if m]
        hotwords = home_hotwords() if opts.hotwords == "home" else [h for h in opts.hotwords.split(",") if h.strip()]
        result["hotwords"] = hotwords
        prompt = TRANSCRIPT_PROMPT if opts.prompt == "pause" else None
        windows = _ints(opts.windows)
        result["stt"] = bench_stt(models, _ints(opts.beams), utterances, opts.threads, windows, hotwords, prompt)
        print(stt_table(result["stt"]))
    if not opts.skip_turn:
        onnx = resolve("smart-turn-v3.2", "turn").path
        assert onnx is not None
        result["smart_turn_timing"] = smart_turn_timing(onnx, [1, 2])
        print(
            "Smart Turn, one call on an 8 s window: "
            + ", ".join(
                f"{n} thread(s) p50 {t['p50_ms']:.1f} ms p95 {t['p95_ms']:.1f} ms"
                for n, t in result["smart_turn_timing"].items()
            )
        )
        vad = Vad(resolve("silero-vad", "vad").path, end_silence_ms=10_000)
        tiny = SpeechToText(resolve("whisper-tiny.en", "stt"), STTConfig(language="en", compute_type="int8"))
        policies = _policies(_floats(opts.thresholds), _ints(opts.max_silences), _ints(opts.reasks), opts.min_silence)
        result["turn"] = bench_turn(
            policies,
            SmartTurn(onnx, threads=opts.turn_threads),
            tiny,
            vad,
            None if opts.no_prompt else TRANSCRIPT_PROMPT,
        )
        print(turn_table(result["turn"]))
    result["duration_s"] = round(time.time() - started, 1)
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
