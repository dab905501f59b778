"""`specvoice bench home`: does the assistant do the right home thing? Measured on Home Assistant's own sentences.

Each case is a sentence a user says and the action it should cause (or ``null``: chit-chat, a question about a
device's state, a device that is not on the list). The case file's devices become the allow-list
(``mqtt.allowed_actions``), each case is asked as text on the path an MQTT ``ask`` takes (a session whose history
is cleared, ``Session.ask`` without speech), and the actions are caught where the MQTT bridge would receive them:
the session's ``ActionRequested`` events. What the bridge would publish is what passes its own allow-list check
again. No broker is needed. ``--spoken N`` also plays N cases, spoken, through the real listener (VAD, Whisper)
first: by default about half by the assistant's piper voice and half by espeak-ng accents (``SPOKEN_VOICES``), the
voice of each case drawn from ``--seed``, so the same command speaks the same cases in the same voices
(``--voices piper``: all by piper, as before). ``--condition`` places the spoken cases in a listening condition
(voice/roomset.py: a simulated room, a distance, a noise that runs on after the words).

Scores: the right action (topic and payload, nothing else) for command cases; any action where none is wanted;
refused requests and unallowed publishes (the latter must stay 0); whether the reply says the refusal when a
request was refused (and does not when the action was done). The case file format::

    {"devices": [{"name": "kitchen light", "topic": "home/kitchen/light/set", "payloads": ["ON", "OFF"],
                  "area": "kitchen", "state_topic": "home/kitchen/light/state"}, ...],
     "cases": [{"say": "turn on the kitchen light", "expect": {"topic": "home/kitchen/light/set", "payload": "ON"},
                "intent": "HassTurnOn"},
               {"say": "is the kitchen light on", "expect": null, "intent": "HassGetState",
                "state": {"home/kitchen/light/state": "ON"}}, ...]}

``area``, ``state_topic``, ``intent`` and ``state`` are optional. The devices become ``mqtt.devices`` (named, by
area: the home prompt and the grounding of voice/dialog/home.py). A case's ``state`` is put where the MQTT bridge
keeps what it heard on the state topics before the case is asked; a question about state (no action expected)
is scored as said right when, of the value and its opposite (on/off, open/closed), the reply says the value
first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from audio.frames import SPEECH_RATE
from audio.wavfile import read_wav, write_wav
from voice.bench import count, positive
from voice.config_servers import HomeDeviceConfig
from voice.events import ActionRequested, Event, TranscriptFinal, TurnDone, TurnError
from voice.home_casefile import (
    DEFAULT_CASES,
    PIPER,
    Case,
    CaseFileError,
    Result,
    answer_for,
    load_cases,
    published_actions,
    speak_case,
    spoken_voices,
)
from voice.roomset import CONDITIONS_HELP, Condition, parse
from voice.speechset import Voice, framed

# The espeak-ng half of the spoken sample: accents and speeds of `espeak-ng --voices=en` (as the varied STT set).


_SPOKEN_TURN_S = 120.0  # a spoken case's turn ends well within this after its audio (else nothing was heard)


class HomeRunner:
    """One assistant and one session, loaded once; each case starts from a fresh history (like an MQTT ask)."""

    def __init__(self, assistant: Any, allowed: dict[str, list[str]]) -> None:
        self.allowed = allowed
        self.requests: list[ActionRequested] = []
        self.ended: asyncio.Queue[Event | None] = asyncio.Queue()
        self.session = assistant.session(self._on_event, name="bench-home")
        self.session.speak_replies = False  # text only: the reply's words are scored, its audio is not needed
        self.assistant = assistant

    def _on_event(self, event: Event) -> None:
        if isinstance(event, ActionRequested):
            self.requests.append(event)
        elif isinstance(event, (TurnDone, TurnError)):
            self.ended.put_nowait(event)
        elif isinstance(event, TranscriptFinal) and not event.text.strip():
            self.ended.put_nowait(None)  # nothing heard: no turn will end

    async def run(self, case: Case, wav: Path | None = None) -> Result:
        from voice.transports.mqtt.commands import forget_history

        await forget_history(self.session)
        if self.assistant.home is not None:  # what the MQTT bridge would have heard on the state topics
            self.assistant.home.states.clear()
            self.assistant.home.states.update(case.state)
        started = time.monotonic()
        done = await self._turn(case.say, wav)
        published = published_actions(self.requests, self.allowed)
        refused = [{"topic": r.topic, "payload": r.payload} for r in self.requests if not r.allowed]
        return Result(
            say=case.say,
            expect=case.expect,
            intent=case.intent,
            published=published,
            refused=refused,
            reply=done.reply if done else "",
            spoken=wav is not None,
            transcript=done.transcript if done and wav is not None else None,
            state=case.state,
            seconds=round(time.monotonic() - started, 2),
            first_token_ms=_first_token_ms(done),
            prompt_tokens=_decoder(done).get("prompt_tokens"),
            reply_tokens=_decoder(done).get("new_tokens"),
        )

    async def answer(self, result: Result, said: str, wav: Path | None = None) -> None:
        """The user's answer to the reply's question back, in the same conversation: what it published."""
        done = await self._turn(said, wav)
        result.answer = said
        result.answer_published = published_actions(self.requests, self.allowed)
        result.answer_reply = done.reply if done else ""
        result.answer_transcript = done.transcript if done and wav is not None else None

    async def _turn(self, say: str, wav: Path | None) -> TurnDone | None:
        """One turn, asked as text (as an MQTT ask) or played as ``wav`` through the listener."""
        from voice.wavturn import run_turn

        self.requests.clear()
        while not self.ended.empty():
            self.ended.get_nowait()
        if wav is None:
            return await self.session.ask(say, speak=False)
        try:
            return await run_turn(self.session, wav, self.ended, timeout_s=_SPOKEN_TURN_S)
        except TimeoutError:  # the listener heard no speech at all: no turn began
            return None


def _decoder(done: TurnDone | None) -> dict[str, Any]:
    return (done.trace.get("decoder") or {}) if done else {}


def _first_token_ms(done: TurnDone | None) -> float | None:
    marks = done.trace.get("marks_ms", {}) if done else {}
    if "llm_first_token" not in marks:
        return None
    return round(marks["llm_first_token"] - marks.get("turn_start", 0.0), 1)


def summarize(results: list[Result], allowed: dict[str, list[str]]) -> dict[str, Any]:
    """Per intent and in total: right actions, actions where none was wanted, refusals, unallowed publishes."""

    def score(rs: list[Result]) -> dict[str, Any]:
        commands = [r for r in rs if r.expect]
        quiet = [r for r in rs if not r.expect]
        return {
            "cases": len(rs),
            "commands": len(commands),
            "right_action": sum(r.right for r in commands),
            "no_action_cases": len(quiet),
            "acted_when_none_wanted": sum(bool(r.published or r.answer_published) for r in quiet),
            "wrong_actions": sum(r.wrong for r in commands),
            "asked_back": sum(r.answer is not None for r in commands),
            "right_after_answer": sum(r.right_after_answer for r in commands),
            "refused_requests": sum(len(r.refused) for r in rs),
            "unallowed_published": sum(
                p["payload"] not in allowed.get(p["topic"], []) for r in rs for p in r.published
            ),
            "consistent_reply": sum(r.consistent for r in rs),
            "state_questions": sum(r.state_right is not None for r in rs),
            "state_right": sum(bool(r.state_right) for r in rs),
            "first_token_ms_median": statistics.median(ttft)
            if (ttft := [r.first_token_ms for r in rs if r.first_token_ms is not None])
            else None,
            "prompt_tokens_median": statistics.median(prompt)
            if (prompt := [r.prompt_tokens for r in rs if r.prompt_tokens is not None])
            else None,
            "reply_tokens_mean": round(statistics.mean(reply), 1)
            if (reply := [r.reply_tokens for r in rs if r.reply_tokens is not None])
            else None,
        }

    intents = sorted({r.intent for r in results})
    return {"per_intent": {i: score([r for r in results if r.intent == i]) for i in intents}, "total": score(results)}


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def print_table(summary: dict[str, Any], title: str) -> None:
    print(f"\n{title}")
    head = (
        f"{'intent':18s}{'cases':>6s}{'right action':>14s}{'after asking':>14s}{'wrong':>7s}{'acted, none wanted':>20s}"
    )
    print(head + f"{'refused':>9s}{'unallowed':>11s}{'consistent':>12s}{'state said':>12s}")
    rows = [*summary["per_intent"].items(), ("total", summary["total"])]
    for name, s in rows:
        print(
            f"{name:18s}{s['cases']:6d}"
            f"{_pct(s['right_action'], s['commands']):>14s}"
            f"{_pct(s['right_after_answer'], s['commands']):>14s}"
            f"{s['wrong_actions']:7d}"
            f"{_pct(s['acted_when_none_wanted'], s['no_action_cases']):>20s}"
            f"{s['refused_requests']:9d}{s['unallowed_published']:11d}"
            f"{_pct(s['consistent_reply'], s['cases']):>12s}"
            f"{_pct(s['state_right'], s['state_questions']):>12s}"
        )


async def bench(config: Any, argv: list[str]) -> int:
    from voice.app.cli import fail
    from voice.assistant import Assistant

    p = argparse.ArgumentParser(
        prog="specvoice bench home",
        description=__doc__.split("\n")[0],
        epilog="case file format:" + __doc__.split("The case file format::")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cases", default=str(DEFAULT_CASES), help="case file (default: configs/home_cases.json)")
    p.add_argument("--json", default="bench-results/home.json", help="write one record per case here")
    p.add_argument("--limit", type=positive, help="only the first N cases (the default file is shuffled)")
    p.add_argument(
        "--split",
        choices=["tune", "test"],
        help="only the cases of this half of a held-out file (configs/home_phrasings.json): "
        "tune on one half, report the other",
    )
    p.add_argument(
        "--spoken", type=count, default=0, help="also play N of them, spread evenly over the list, to the listener"
    )
    p.add_argument(
        "--voices",
        choices=["mixed", "piper"],
        default="mixed",
        help="spoken cases: half piper, half espeak-ng accents (default), or all piper",
    )
    p.add_argument("--seed", type=int, default=0, help="which spoken case gets which voice (--voices mixed)")
    p.add_argument(
        "--condition",
        default="clean",
        help="where the spoken cases are said: one listening condition. " + CONDITIONS_HELP,
    )
    p.add_argument(
        "--ungrounded",
        action="store_true",
        help="measure the prompt alone: no check that the user's words asked for the action",
    )
    p.add_argument(
        "--format",
        choices=["markers", "tools", "constrained"],
        help="how the model asks for an action (default: mqtt.action_format): [ACTION] markers, control_device "
        "calls, or markers whose command is a constrained decode",
    )
    args = p.parse_args(argv)
    try:
        condition = parse(args.condition)
    except ValueError as exc:
        p.error(str(exc))
    try:
        cases = load_cases(args.cases)
    except CaseFileError as exc:
        fail(exc)
        return 2
    chosen = [c for c in cases.cases if args.split is None or c.split == args.split][: args.limit]
    allowed = cases.allowed
    devices = [HomeDeviceConfig.model_validate(asdict(d)) for d in cases.devices]
    action_format = args.format or config.mqtt.action_format
    mqtt = config.mqtt.model_copy(update={"allowed_actions": {}, "devices": devices, "action_format": action_format})
    assistant = await Assistant.load(config.model_copy(update={"mqtt": mqtt}))
    if args.ungrounded and assistant.home is not None:
        assistant.home.grounded = False
    runner = HomeRunner(assistant, allowed)
    results: list[Result] = []
    for case in tqdm(chosen, desc="text cases", unit="case", disable=None):
        results.append(result := await runner.run(case))
        if (said := answer_for(case, result, cases, args.seed)) is not None:
            await runner.answer(result, said)
    n = min(args.spoken, len(chosen))
    heard = [chosen[i * len(chosen) // n] for i in range(n)] if n else []  # spread evenly: every category
    voices = spoken_voices(len(heard), args.seed, args.voices)
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(tqdm(heard, desc="spoken cases", unit="case", disable=None)):
            wav = placed(speak_case(assistant, case.say, voices[i], Path(tmp) / f"case{i}.wav"), condition)
            results.append(result := await runner.run(case, wav))
            if (said := answer_for(case, result, cases, args.seed)) is not None:
                answer = placed(speak_case(assistant, said, voices[i], Path(tmp) / f"answer{i}.wav"), condition)
                await runner.answer(result, said, answer)
    await runner.session.close()
    text = [r for r in results if not r.spoken]
    spoken = [r for r in results if r.spoken]
    summary = {"text": summarize(text, allowed)}
    title = f"home actions ({action_format}), {config.models.target}, {len(text)} text cases from {args.cases}"
    print_table(summary["text"], title)
    if spoken:
        summary["spoken"] = summarize(spoken, allowed)
        by = {"piper": [r for r, v in zip(spoken, voices, strict=True) if v == PIPER]}
        by["espeak-ng"] = [r for r, v in zip(spoken, voices, strict=True) if v != PIPER]
        summary["spoken_by_voice"] = {k: summarize(rs, allowed)["total"] for k, rs in by.items() if rs}
        print_table(
            summary["spoken"],
            f"{len(spoken)} of them spoken ({len(by['piper'])} piper, {len(by['espeak-ng'])} espeak-ng, "
            f"seed {args.seed}, {condition.name}) -> listener -> Whisper",
        )
        for k, total in summary["spoken_by_voice"].items():
            print(
                f"  {k}: right action {_pct(total['right_action'], total['commands'])} "
                f"({_pct(total['right_after_answer'], total['commands']).strip()} after asking back), "
                f"acted when none wanted {_pct(total['acted_when_none_wanted'], total['no_action_cases'])}, state said "
                f"{_pct(total['state_right'], total['state_questions'])}"
            )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "machine": platform.processor() or platform.machine(),
                "config": {
                    "target": config.models.target,
                    "llm": config.llm.model_dump(),
                    "action_format": action_format,
                },
                "cases_file": str(args.cases),
                "split": args.split,
                "spoken_voices": {"mix": args.voices, "seed": args.seed},
                "spoken_condition": condition.name,
                "summary": summary,
                "cases": [asdict(r) for r in text]
                + [asdict(r) | {"voice": v} for r, v in zip(spoken, voices, strict=True)],
            },
            indent=1,
        )
    )
    total = summary["text"]["total"]
    print(
        f"median time to first token: {total['first_token_ms_median']} ms (devices: {len(cases.devices)}); "
        f"prompt tokens (median): {total['prompt_tokens_median']}; reply tokens (mean): {total['reply_tokens_mean']}"
    )
    print(f"wrote {args.json}")
    return 0


def placed(wav: Path, condition: Condition) -> Path:
    """The recording at ``wav`` rewritten as ``condition`` hears it, with the room's noise running on after the
    words (``framed``); in the clean condition, as it is."""
    if condition.name == "clean":
        return wav
    samples, _ = read_wav(wav, SPEECH_RATE, convert=True)
    heard = condition.hear(framed(f"home/{wav.stem}", Voice(wav.stem, "piper"), "", samples))
    write_wav(wav, heard.audio, SPEECH_RATE)
    return wav


def main(config: Any, args: Any, extra: list[str]) -> int:
    return asyncio.run(bench(config, extra))
