"""The home case file: a home's devices (its allow-list) and spoken requests with the action each one expects.

The format is kept stable because others feed `specvoice bench home` their own files (``state_topic`` and
``area`` optional; a case may set ``"state": {"<state_topic>": "<value>"}`` to publish before it is asked)::

    {"devices": [{"name": "kitchen light", "topic": "home/kitchen/light/set", "payloads": ["ON", "OFF"]}, ...],
     "cases": [{"say": "turn on the kitchen light", "expect": {"topic": "home/kitchen/light/set", "payload": "ON"}},
               {"say": "what's the weather like", "expect": null}, ...]}

It lives in the library, not in the benchmark, because a case file is the user's data: loading it checks every
entry and names the fix, and scoring a reply (published, refused, consistent) is the rule the tests hold too.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from audio.frames import SPEECH_RATE
from audio.wavfile import write_wav
from voice.dialog.actions import REFUSED_SPEECH, check_allowed
from voice.dialog.home import ASK_BACK
from voice.dialog.home import say_value as _say
from voice.dialog.state_reply import OPPOSITE
from voice.events import ActionRequested
from voice.speechset import voices

DEFAULT_CASES = Path(__file__).parent / "configs" / "home_cases.json"  # configs/ (shipped in the package)
# human phrasings for a home whose device names the code never saw, split once into a tuning and a test half
HELD_OUT_CASES = Path(__file__).parent / "configs" / "home_phrasings.json"
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
    aliases: list[str] = field(default_factory=list)
    floor: str | None = None
    domain: str | None = None


Expect = dict[str, str] | list[dict[str, str]] | None  # one command, several (an area's), or none


def expected(expect: Expect) -> list[dict[str, str]]:
    """The commands a case expects, in a stable order."""
    found = [] if expect is None else expect if isinstance(expect, list) else [expect]
    return sorted(found, key=lambda e: (e["topic"], e["payload"]))


@dataclass
class Case:
    say: str
    expect: Expect  # {"topic", "payload"}, a list of them; None: no action is wanted
    intent: str = "other"  # the row of the table it is counted in (a file's "intent" or "category")
    state: dict[str, str] = field(default_factory=dict)  # state_topic -> value at the time of asking
    split: str | None = None  # "tune" or "test": a held-out set is tuned on one half and reported on the other


@dataclass
class CaseFile:
    devices: list[Device]
    cases: list[Case]
    answers: dict[str, list[str]] = field(default_factory=dict)  # how users answer a question back, by value

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
    top = _object(data, source, {"devices", "cases", "answers"}, {"devices", "cases"}, f"give both lists; {FIX_FORMAT}")
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
            {"name", "topic", "payloads", "area", "state_topic", "aliases", "floor", "domain"},
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
            [_string(a, f"{where}.aliases", "list other names as strings") for a in d.get("aliases", [])],
            _string(d["floor"], f"{where}.floor", "name the floor or leave it out") if "floor" in d else None,
            _string(d["domain"], f"{where}.domain", "give a Home Assistant domain or leave it out")
            if "domain" in d
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
            {"say", "expect", "intent", "category", "state", "split"},
            {"say", "expect"},
            'give "say" and "expect" (null when no action is wanted)',
        )
        commands = [] if c["expect"] is None else c["expect"] if isinstance(c["expect"], list) else [c["expect"]]
        for e in commands:
            e = _object(
                e, f"{where}.expect", {"topic", "payload"}, {"topic", "payload"}, "give topic and payload, or null"
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
        expect: Expect = c["expect"]
        state = c.get("state", {})
        if not isinstance(state, dict) or not all(isinstance(v, str) for v in state.values()):
            raise CaseFileError(f'{where}.state must map state topics to strings; fix: e.g. {{"<state_topic>": "ON"}}')
        if unknown := set(state) - state_topics:
            raise CaseFileError(
                f"{where}.state: {sorted(unknown)} is no device's state_topic; fix: give the device a state_topic"
            )
        label = c.get("intent", c.get("category"))
        intent = _string(label, f"{where}.intent", "name the intent or leave it out") if label is not None else None
        split = c.get("split")
        if split not in (None, "tune", "test"):
            raise CaseFileError(
                f"{where}.split must be 'tune' or 'test', not {split!r}; fix: one of them, or leave it out"
            )
        say = _string(c["say"], f"{where}.say", "write what the user says")
        cases.append(Case(say, expect, intent or "other", state, split))
    answers = top.get("answers", {})
    if not isinstance(answers, dict) or not all(
        isinstance(v, list) and v and all(isinstance(a, str) and a.strip() for a in v) for v in answers.values()
    ):
        raise CaseFileError(f"{source}: 'answers' must map a value (or yes/no/number) to sentences; fix: {FIX_FORMAT}")
    return CaseFile(devices, cases, answers)


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
    expect: Expect
    intent: str
    published: list[dict[str, str]]
    refused: list[dict[str, str]]
    reply: str
    spoken: bool
    transcript: str | None = None  # what the listener heard (spoken runs)
    state: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    state_right: bool | None = None  # a question about state: the reply says the state it was given
    first_token_ms: float | None = None  # from the question to the model's first token (prefill included)
    prompt_tokens: int | None = None  # the whole prompt the model read (system prompt, tools, the question)
    reply_tokens: int | None = None  # tokens the model wrote, action markers or tool calls included
    answer: str | None = None  # the reply asked back ("Do you want the fan on or off?"): the user's answer
    answer_published: list[dict[str, str]] = field(default_factory=list)  # ... and what it published
    answer_reply: str | None = None
    answer_transcript: str | None = None  # what the listener heard of the answer (spoken runs)

    def __post_init__(self) -> None:
        if self.state_right is None and self.state and not self.expect:
            self.state_right = state_answered(self.state, self.reply, self.say)

    @property
    def right(self) -> bool:
        """Exactly the expected actions were published, each once (for a no-action case: nothing was)."""
        return expected(self.published) == expected(self.expect)

    @property
    def right_after_answer(self) -> bool:
        """Right at once, or nothing at once and exactly the expected actions after the user's answer."""
        after = expected(self.answer_published) == expected(self.expect)
        return self.right or (not self.published and bool(self.expect) and after)

    @property
    def wrong(self) -> bool:
        """Something was published, at once or after the answer, that the case did not expect."""
        wanted = {(e["topic"], e["payload"]) for e in expected(self.expect)}
        return any((p["topic"], p["payload"]) not in wanted for p in [*self.published, *self.answer_published])

    @property
    def consistent(self) -> bool:
        """The words match the deed: the refusal (or a question back) is said when a request was refused, and not
        when all was done."""
        said_refusal = any(s.casefold() in self.reply.casefold() for s in (REFUSED_SPEECH.strip(), ASK_BACK))
        return said_refusal if self.refused else not (self.published and said_refusal)


def answer_for(case: Case, result: Result, cases: CaseFile, seed: int = 0) -> str | None:
    """What the user says back when a command case's reply asked back (voice/dialog/home.py ``ask_value``), drawn
    from the case file's ``answers`` (varied phrasings written apart from the code; the held-out set's when the file
    has none; a case of a split draws from that split's half, ``_half``): a yes when the question offers the one
    value wanted, that value otherwise, a no when it asks about another device than the one meant. None when there
    is nothing to answer."""
    wanted = expected(case.expect)
    if not wanted or ASK_BACK.casefold() not in result.reply.casefold():
        return None
    answers = {key: _half(said, case.split) for key, said in (cases.answers or _held_out_answers()).items()}
    rng = random.Random(f"{seed}:{case.say}")
    topics = {w["topic"] for w in wanted}
    reply = result.reply.casefold()
    question = reply[reply.rfind(ASK_BACK.casefold()) :]
    named = [d for d in cases.devices if f"the {d.name}".casefold() in question]
    if not any(d.topic in topics for d in named) or any(d.topic not in topics for d in named):
        return rng.choice(answers["no"])  # about other devices than those meant, or more of them
    value = wanted[0]["payload"]
    offered = f" {_say(value)}?".casefold()
    if reply.rstrip().endswith(offered) and not reply.rstrip().endswith(f" or{offered}"):  # one value, the one wanted
        return rng.choice(answers["yes"])
    if value.isdigit():
        return rng.choice(answers["number"]).replace("{n}", value)
    return rng.choice(answers.get(value, answers["yes"]))


def _half(phrasings: list[str], split: str | None) -> list[str]:
    """The answers a case of a split may be given: a tuning case the even ones, a test case the odd ones (so that
    the answers the code is tuned on are not those it is scored on); all for a case of no split."""
    if split is None or len(phrasings) < 2:
        return phrasings
    return phrasings[split == "test" :: 2]


@functools.cache
def _held_out_answers() -> dict[str, list[str]]:
    return load_cases(HELD_OUT_CASES).answers


def state_answered(state: dict[str, str], reply: str, question: str = "") -> bool | None:
    """Does the reply say the state it was given? Of a state value and its opposite ("open"/"closed",
    "on"/"off"), the first one the reply says must be the value, for every device in ``state``; and a reply
    that opens with "yes" or "no" must be right about the state the question names ("is it closed?" with the
    door open: "no"). None when a value has no known opposite (the case cannot be scored this way)."""
    said, heard = _plain_words(reply), _plain_words(question)
    for value in state.values():
        value = value.casefold()
        if value not in OPPOSITE:
            return None
        pair = (value, OPPOSITE[value])  # only this pair: "on" in "is the blind closed on my landing" is no state
        first = next((w for w in said if w in pair), None)
        if first != value:
            return False
        asked = [w for w in heard if w in pair]
        if asked and said and said[0] in ("yes", "no") and (said[0] == "yes") != (asked[-1] == value):
            return False
    return True


def _plain_words(text: str) -> list[str]:
    return [w.strip(".,!?;:\"'") for w in text.casefold().split()]


def published_actions(requests: list[ActionRequested], allowed: dict[str, list[str]]) -> list[dict[str, str]]:
    """What the MQTT bridge would publish: allowed requests that pass its own allow-list check again."""
    return [
        {"topic": r.topic, "payload": r.payload}
        for r in requests
        if r.allowed and r.payload in allowed.get(r.topic, [])
    ]


# ---- the spoken sample: piper (the assistant's voice) and espeak-ng accents ----

SPOKEN_VOICES = voices(
    "espeak-us", "espeak-gb", "espeak-scotland-f3", "espeak-caribbean", "espeak-nyc-f2", "espeak-rp-m3"
)
PIPER = "piper"  # the assistant's own voice (synthesize_question)
_LEAD_S = 0.3  # silence before an espeak utterance (piper's own output starts with some)


def spoken_voices(n: int, seed: int, mix: str) -> list[str]:
    """The voice of each of the first ``n`` spoken cases: ``PIPER`` or a ``SPOKEN_VOICES`` name, half and half
    at random from ``seed`` ('mixed'), or all piper ('piper'). The same arguments give the same list."""
    if mix == "piper":
        return [PIPER] * n
    rng = random.Random(seed)
    return [PIPER if rng.random() < 0.5 else rng.choice(SPOKEN_VOICES).name for _ in range(n)]


def speak_case(assistant: Any, text: str, voice: str, path: Path) -> Path:
    """``text`` as a 16 kHz WAV spoken in ``voice`` (see ``spoken_voices``)."""
    import numpy as np

    from voice.wavturn import synthesize_question

    if voice == PIPER:
        return synthesize_question(assistant, text, path)
    speech = next(v for v in SPOKEN_VOICES if v.name == voice).speak(text)
    write_wav(path, np.concatenate([np.zeros(int(_LEAD_S * SPEECH_RATE), np.int16), speech]), SPEECH_RATE)
    return path


def home_hotwords(path: Path = DEFAULT_CASES) -> list[str]:
    """The stt.hotwords a home with the case file's devices gets by default (voice.config.stt_hotwords)."""
    from voice.config import STTConfig, stt_hotwords
    from voice.config_servers import HomeDeviceConfig, MQTTConfig

    devices = [HomeDeviceConfig.model_validate(asdict(d)) for d in load_cases(path).devices]
    return stt_hotwords(STTConfig(), MQTTConfig.model_validate({"devices": devices}))
