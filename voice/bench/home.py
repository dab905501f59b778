"""`specvoice bench home`: does the assistant do the right home thing? Measured on Home Assistant's own sentences.

Each case is a sentence a user says and the action it should cause (or ``null``: chit-chat, a question about a
device's state, a device that is not on the list). The case file's devices become the allow-list
(``mqtt.allowed_actions``), each case is asked as text on the path an MQTT ``ask`` takes (a session whose history
is cleared, ``Session.ask`` without speech), and the actions are caught where the MQTT bridge would receive them:
the session's ``ActionRequested`` events. What the bridge would publish is what passes its own allow-list check
again. No broker is needed. ``--spoken N`` also plays N cases, spoken by piper, through the real listener (VAD,
Whisper) first.

Scores: the right action (topic and payload, nothing else) for command cases; any action where none is wanted;
refused requests and unallowed publishes (the latter must stay 0); whether the reply says the refusal when a
request was refused (and does not when the action was done). The case file format::

    {"devices": [{"name": "kitchen light", "topic": "home/kitchen/light/set", "payloads": ["ON", "OFF"],
                  "area": "kitchen", "state_topic": "home/kitchen/light/state"}, ...],
     "cases": [{"say": "turn on the kitchen light", "expect": {"topic": "home/kitchen/light/set", "payload": "ON"},
                "intent": "HassTurnOn"},
               {"say": "is the kitchen light on", "expect": null, "intent": "HassGetState",
                "state": {"home/kitchen/light/state": "ON"}}, ...]}

``area``, ``state_topic``, ``intent`` and ``state`` are optional. The assistant has no way yet to read a device's
state, so ``state`` is checked and carried into the JSON but not shown to the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from voice.actions import REFUSED_SPEECH, check_allowed
from voice.bench import count, positive
from voice.events import ActionRequested, Event, TurnDone, TurnError

DEFAULT_CASES = Path(__file__).parents[1] / "configs" / "home_cases.json"  # configs/ (shipped in the package)
FIX_FORMAT = "see the format in `specvoice bench home --help`"


class CaseFileError(ValueError):
    """A case file that cannot be used; the message names the file, the entry and the fix."""


@dataclass
class Device:
    name: str
    topic: str  # the command topic: what an action publishes to
    payloads: list[str]
    area: str | None = None
    state_topic: str | None = None


@dataclass
class Case:
    say: str
    expect: dict[str, str] | None  # {"topic", "payload"}; None: no action is wanted
    intent: str = "other"
    state: dict[str, str] = field(default_factory=dict)  # state_topic -> value at the time of asking


@dataclass
class CaseFile:
    devices: list[Device]
    cases: list[Case]

    @property
    def allowed(self) -> dict[str, list[str]]:
        """The allow-list the devices make: topic -> payloads."""
        return {d.topic: list(d.payloads) for d in self.devices}


def _string(value: Any, where: str, fix: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CaseFileError(f"{where} must be a non-empty string, not {value!r}; fix: {fix}")
    return value


def _object(value: Any, where: str, keys: set[str], required: set[str], fix: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CaseFileError(f"{where} must be a JSON object, not {type(value).__name__}; fix: {fix}")
    if unknown := set(value) - keys:
        raise CaseFileError(f"{where} has unknown key(s) {sorted(unknown)}; fix: use only {sorted(keys)}")
    if missing := required - set(value):
        raise CaseFileError(f"{where} lacks {sorted(missing)}; fix: {fix}")
    return value


def parse_cases(data: Any, source: str = "case file") -> CaseFile:
    """Check a case file's content and return it as dataclasses; CaseFileError says what is wrong and how to fix."""
    top = _object(data, source, {"devices", "cases"}, {"devices", "cases"}, f"give both lists; {FIX_FORMAT}")
    if not isinstance(top["devices"], list) or not top["devices"]:
        raise CaseFileError(f"{source}: 'devices' must be a non-empty list; fix: list the devices the home has")
    if not isinstance(top["cases"], list) or not top["cases"]:
        raise CaseFileError(f"{source}: 'cases' must be a non-empty list; fix: add cases, {FIX_FORMAT}")
    devices: list[Device] = []
    for i, raw in enumerate(top["devices"]):
        where = f"{source}: devices[{i}]"
        d = _object(
            raw,
            where,
            {"name", "topic", "payloads", "area", "state_topic"},
            {"name", "topic", "payloads"},
            "give name, topic and payloads, e.g. "
            '{"name": "kitchen light", "topic": "home/kitchen/light/set", "payloads": ["ON", "OFF"]}',
        )
        payloads = d["payloads"]
        if not isinstance(payloads, list) or not all(isinstance(p, str) for p in payloads):
            raise CaseFileError(f'{where}: \'payloads\' must be a list of strings; fix: e.g. ["ON", "OFF"]')
        device = Device(
            _string(d["name"], f"{where}.name", "name the device as a user would, e.g. 'kitchen light'"),
            _string(d["topic"], f"{where}.topic", "give the device's command topic"),
            list(payloads),
            _string(d["area"], f"{where}.area", "name the room or leave 'area' out") if "area" in d else None,
            _string(d["state_topic"], f"{where}.state_topic", "give the state topic or leave it out")
            if "state_topic" in d
            else None,
        )
        if any(other.topic == device.topic for other in devices):
            raise CaseFileError(f"{where}: topic {device.topic!r} is listed twice; fix: one device per topic")
        devices.append(device)
    try:
        check_allowed({d.topic: d.payloads for d in devices})
    except ValueError as exc:
        raise CaseFileError(f"{source}: devices: {exc}") from None
    by_topic = {d.topic: d for d in devices}
    state_topics = {d.state_topic for d in devices if d.state_topic}
    cases: list[Case] = []
    for i, raw in enumerate(top["cases"]):
        where = f"{source}: cases[{i}]"
        c = _object(
            raw,
            where,
            {"say", "expect", "intent", "state"},
            {"say", "expect"},
            'give "say" and "expect" (null when no action is wanted)',
        )
        expect = c["expect"]
        if expect is not None:
            e = _object(
                expect, f"{where}.expect", {"topic", "payload"}, {"topic", "payload"}, "give topic and payload, or null"
            )
            if e["topic"] not in by_topic:
                raise CaseFileError(
                    f"{where}.expect: topic {e['topic']!r} is no device's topic; fix: add the device to 'devices' "
                    "or expect null (a device not on the list must not be switched)"
                )
            if e["payload"] not in by_topic[e["topic"]].payloads:
                raise CaseFileError(
                    f"{where}.expect: payload {e['payload']!r} is not one of {by_topic[e['topic']].payloads} for "
                    f"{e['topic']!r}; fix: use one of them or add it to the device's payloads"
                )
            expect = {"topic": e["topic"], "payload": e["payload"]}
        state = c.get("state", {})
        if not isinstance(state, dict) or not all(isinstance(v, str) for v in state.values()):
            raise CaseFileError(f'{where}.state must map state topics to strings; fix: e.g. {{"<state_topic>": "ON"}}')
        if unknown := set(state) - state_topics:
            raise CaseFileError(
                f"{where}.state: {sorted(unknown)} is no device's state_topic; fix: give the device a state_topic"
            )
        intent = _string(c["intent"], f"{where}.intent", "name the intent or leave it out") if "intent" in c else None
        cases.append(
            Case(_string(c["say"], f"{where}.say", "write what the user says"), expect, intent or "other", state)
        )
    return CaseFile(devices, cases)


def load_cases(path: str | Path) -> CaseFile:
    """Read and check a case file (JSON)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CaseFileError(f"cannot read case file {path}: {exc.strerror}; fix: give an existing file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaseFileError(f"{path}: not JSON ({exc}); fix: {FIX_FORMAT}") from None
    return parse_cases(data, str(path))


@dataclass
class Result:
    """One case's outcome: the JSON record of ``--json`` (``refused``: requests the allow-list turned down)."""

    say: str
    expect: dict[str, str] | None
    intent: str
    published: list[dict[str, str]]
    refused: list[dict[str, str]]
    reply: str
    spoken: bool
    transcript: str | None = None  # what the listener heard (spoken runs)
    state: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def right(self) -> bool:
        """Exactly the expected action was published (for a no-action case: nothing was)."""
        return self.published == ([self.expect] if self.expect else [])

    @property
    def consistent(self) -> bool:
        """The words match the deed: the refusal is said when a request was refused, and not when all was done."""
        said_refusal = REFUSED_SPEECH.strip().casefold() in self.reply.casefold()
        return said_refusal if self.refused else not (self.published and said_refusal)


def published_actions(requests: list[ActionRequested], allowed: dict[str, list[str]]) -> list[dict[str, str]]:
    """What the MQTT bridge would publish: allowed requests that pass its own allow-list check again."""
    return [
        {"topic": r.topic, "payload": r.payload}
        for r in requests
        if r.allowed and r.payload in allowed.get(r.topic, [])
    ]


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

    async def run(self, case: Case, wav: Path | None = None) -> Result:
        from voice.transports.mqtt_commands import forget_history
        from voice.wavturn import run_turn

        forget_history(self.session)
        self.requests.clear()
        while not self.ended.empty():
            self.ended.get_nowait()
        started = time.monotonic()
        done: TurnDone | None
        if wav is None:
            done = await self.session.ask(case.say, speak=False)
        else:
            done = await run_turn(self.session, wav, self.ended)
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
        )


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
            "acted_when_none_wanted": sum(bool(r.published) for r in quiet),
            "refused_requests": sum(len(r.refused) for r in rs),
            "unallowed_published": sum(
                p["payload"] not in allowed.get(p["topic"], []) for r in rs for p in r.published
            ),
            "consistent_reply": sum(r.consistent for r in rs),
        }

    intents = sorted({r.intent for r in results})
    return {"per_intent": {i: score([r for r in results if r.intent == i]) for i in intents}, "total": score(results)}


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def print_table(summary: dict[str, Any], title: str) -> None:
    print(f"\n{title}")
    head = f"{'intent':16s}{'cases':>6s}{'right action':>14s}{'acted, none wanted':>20s}{'refused':>9s}"
    print(head + f"{'unallowed':>11s}{'consistent':>12s}")
    rows = [*summary["per_intent"].items(), ("total", summary["total"])]
    for name, s in rows:
        print(
            f"{name:16s}{s['cases']:6d}"
            f"{_pct(s['right_action'], s['commands']):>14s}"
            f"{_pct(s['acted_when_none_wanted'], s['no_action_cases']):>20s}"
            f"{s['refused_requests']:9d}{s['unallowed_published']:11d}"
            f"{_pct(s['consistent_reply'], s['cases']):>12s}"
        )


async def bench(config: Any, argv: list[str]) -> int:
    from voice.app.cli import fail
    from voice.assistant import Assistant
    from voice.wavturn import synthesize_question

    p = argparse.ArgumentParser(
        prog="specvoice bench home",
        description=__doc__.split("\n")[0],
        epilog="case file format:" + __doc__.split("The case file format::")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cases", default=str(DEFAULT_CASES), help="case file (default: configs/home_cases.json)")
    p.add_argument("--json", default="bench-results/home.json", help="write one record per case here")
    p.add_argument("--limit", type=positive, help="only the first N cases (the default file is shuffled)")
    p.add_argument("--spoken", type=count, default=0, help="also play the first N of them, spoken, to the listener")
    args = p.parse_args(argv)
    try:
        cases = load_cases(args.cases)
    except CaseFileError as exc:
        fail(exc)
        return 2
    chosen = cases.cases[: args.limit]
    allowed = cases.allowed
    mqtt = config.mqtt.model_copy(update={"allowed_actions": allowed})
    assistant = await Assistant.load(config.model_copy(update={"mqtt": mqtt}))
    runner = HomeRunner(assistant, allowed)
    results: list[Result] = []
    for case in tqdm(chosen, desc="text cases", unit="case", disable=None):
        results.append(await runner.run(case))
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(tqdm(chosen[: args.spoken], desc="spoken cases", unit="case", disable=None)):
            wav = synthesize_question(assistant, case.say, Path(tmp) / f"case{i}.wav")
            results.append(await runner.run(case, wav))
    await runner.session.close()
    text = [r for r in results if not r.spoken]
    spoken = [r for r in results if r.spoken]
    summary = {"text": summarize(text, allowed)}
    print_table(summary["text"], f"home actions, {config.models.target}, {len(text)} text cases from {args.cases}")
    if spoken:
        summary["spoken"] = summarize(spoken, allowed)
        print_table(summary["spoken"], f"the first {len(spoken)} of them spoken (piper -> listener -> Whisper)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "machine": platform.processor() or platform.machine(),
                "config": {"target": config.models.target, "llm": config.llm.model_dump()},
                "cases_file": str(args.cases),
                "summary": summary,
                "cases": [asdict(r) for r in results],
            },
            indent=1,
        )
    )
    print(f"wrote {args.json}")
    return 0


def main(config: Any, args: Any, extra: list[str]) -> int:
    return asyncio.run(bench(config, extra))
