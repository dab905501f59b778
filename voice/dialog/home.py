"""The home the assistant runs in: named devices by area, their last known state, and the rules that keep the
model's actions to what the user asked for.

Why rules in code and not only in the prompt: the embedded model is a small *coding* model. Measured on Home
Assistant's sentences (``specvoice bench home``) with only a prompt, it switched the device when asked about its
state ("is the garage door open?") and copied several commands of the list into one reply. So a reply's actions
are grounded in the user's own words here: one command per device per reply, only for a device the words name
(its name, or its area plus its kind: "the lights in the kitchen"), only with a value the words ask for ("turn
the coffee machine to light", tiny.en's "off", is not a request for ON), and never for a question about state.

The system prompt (``prompt``) depends on the devices only, never on their state: it is the cached prefix of
every turn. The state goes into the user's message, and only when the words ask about state (``annotate``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from voice.dialog.actions import (
    KEYWORD,
    Grounding,
    Refusal,
    action_instructions,
    action_tool,
    tool_instructions,
)
from voice.dialog.devices import HomeDevice
from voice.dialog.home_prompt import home_prompt
from voice.dialog.wording import (
    HEDGES,
    PLACE_WORDS,
    REQUEST_WORDS,
    YES_WORDS,
    asked_values,
    asks_state,
    only_by_a_place,
    plurals,
    requests,
    said_as,
    sounds_like,
    words,
)

if TYPE_CHECKING:
    from voice.config_servers import MQTTConfig

OPPOSITE = {"on": "off", "off": "on", "open": "closed", "closed": "open"}  # a state and the one it is not
ASK_BACK = "Do you want the"  # how a question back (``ask_value``) starts
_SAID = {"close": "closed", "lock": "locked", "unlock": "unlocked"}  # a value as the question back says it
UNKNOWN = "unknown"  # said for a device with a state topic from which nothing has come yet


def ask_value(device: HomeDevice, values: Sequence[str] | None = None) -> str:
    """The question back when the words name a device but none of its values ("Sprinkler." for "sprinkler on",
    as tiny.en heard it): its word values, else all ("Do you want the garage door open or closed?"); or, with
    ``values``, whether those are wanted ("Do you want the bedroom fan on?")."""
    if values is None:
        values = [p for p in device.payloads if not p.isdigit()] or device.payloads
    said = [_say(p) for p in values]
    choices = f"{', '.join(said[:-1])} or {said[-1]}" if len(said) > 1 else said[0]
    return f" {ASK_BACK} {device.name} {choices}?"


def _say(value: str) -> str:
    """A value as the question back says it ("closed", "set to 50")."""
    return f"set to {value}" if value.isdigit() else _SAID.get(value.casefold(), value.casefold())


def answer_forms(value: str) -> list[str]:
    """The common ways to answer a question back with ``value`` ("On.", "Turn it on, please.", "Close it.", "Set
    it to 50 percent."): what the recogniser chooses among when it heard an answer as nothing (``Home.answers``)."""
    v = value.casefold()
    if v.isdigit():
        phrases = [f"{v} percent", f"Set it to {v} percent"]
    elif v in ("on", "off"):
        phrases = [v.capitalize(), f"Turn it {v}", f"Switch it {v}"]
    else:
        phrases = [_say(v).capitalize(), f"{v.capitalize()} it"]
    return [f"{p}{end}" for p in phrases for end in (".", ", please.")]


@dataclass(frozen=True)
class Heard:
    """The user's words as the home reads them (``Home.hear``)."""

    text: str  # with the device (and value) of the question back they answer, or of the name they sound like
    answered: bool = False  # they answer the last reply's question back (``follow_up``)
    guessed: HomeDevice | None = None  # spoken, naming no device: the one they sound like; asked back, never done


@dataclass
class Home:
    """The configured devices and the last state heard on their state topics (``states``: state topic -> value,
    written by the MQTT bridge)."""

    devices: list[HomeDevice]
    extra: dict[str, list[str]] = field(default_factory=dict)  # allow-listed topics that are no named device
    states: dict[str, str] = field(default_factory=dict)
    grounded: bool = True  # False only to measure what the prompt does alone (`bench home --ungrounded`)

    @classmethod
    def from_config(cls, mqtt: MQTTConfig) -> Home | None:
        """The home of ``mqtt.devices``; None when no device is named (then the plain allow-list prompt is used)."""
        if not mqtt.devices:
            return None
        devices = [HomeDevice(d.name, d.topic, tuple(d.payloads), d.area, d.state_topic) for d in mqtt.devices]
        named = {d.topic for d in devices}
        extra = {t: list(p) for t, p in mqtt.allowed_actions.items() if t not in named}
        return cls(devices, extra)

    @property
    def allowed(self) -> dict[str, list[str]]:
        return {**self.extra, **{d.topic: list(d.payloads) for d in self.devices}}

    def resolve(self, device: str) -> str:
        """The command topic of the device a ``control_device`` call names: its name (any case), a topic the model
        wrote instead, or else the one device whose name's words are all in what it wrote (measured: the model
        copies the user's "bedroom light lamp"). Anything else comes back as it is: no topic, so it is refused.
        Only the name is read here; whether the user asked for that device is still the grounding's question."""
        by_name = {d.name.casefold(): d.topic for d in self.devices}
        if device.casefold() in by_name:
            return by_name[device.casefold()]
        if device in self.allowed:
            return device
        said = set(words(device))
        matches = [d.topic for d in self.devices if set(words(d.name)) <= said]
        return matches[0] if len(matches) == 1 else device

    def prompt(self, action_format: str = "markers") -> str:
        """The system prompt for a home assistant (voice/dialog/home_prompt.py): nothing in it changes between
        turns, so it stays the cached prefix of every turn."""
        return home_prompt(self.devices, self.extra, action_format)

    def named(self, text: str) -> list[HomeDevice]:
        """The devices the words name (``HomeDevice.named_in``); when they name none so, the one device of its kind
        in its area, said as "the <kind>" with the area ("the light in the bedroom", one light there; not "the
        aquarium light in the living room")."""
        said, many = words(text), plurals(text)
        if named := [d for d in self.devices if d.named_in(said, many)]:
            return named
        kinds = Counter((d.area, d.kind) for d in self.devices)
        plain = {w for before, w in zip(["", *said[:-1]], said, strict=True) if before in PLACE_WORDS}  # "the lamp"
        return [
            d
            for d in self.devices
            if d.area and kinds[d.area, d.kind] == 1 and d.kind in plain and set(words(d.area)) <= set(said)
        ]

    def ask(self, device: HomeDevice, values: Sequence[str] | None = None) -> str:
        """The question back (``ask_value``), after the device's state when one has come: words heard without their
        question word ("Or our bedside lamp off." for "are our bedside lamp off") may have asked for it."""
        state = self.states.get(device.state_topic or "", "").casefold()
        verb = "are" if plurals(device.name) else "is"  # "the garden lights are", "the garage door is"
        said = f" The {device.name} {verb} {'at ' if state.isdigit() else ''}{state}." if state else ""
        return said + ask_value(device, values)

    def elsewhere(self, said: Sequence[str], named: Iterable[HomeDevice]) -> bool:
        """The words name an area that none of the devices they name is in or named after: "Switch on the Living
        room, Bedroom light light." was heard for the aquarium light in the living room (not a listed device; the
        hint's names drew Whisper). "... kitchen light and the hallway light" names both of theirs."""
        own = {w for d in named for w in [*words(d.name), *words(d.area or "")]}
        areas = {d.area for d in self.devices if d.area}
        return any(set(place) <= set(said) and not set(place) <= own for place in map(words, areas))

    def follow_up(self, text: str, history: Sequence[dict] = ()) -> str:
        """The user's words, with the device the last reply asked about (``ask_value``) when they answer it and
        name no device of their own: "On." after "Do you want the sprinkler on or off?" is "On. (the sprinkler)",
        "Yes." after "Do you want the fan on?" is "Yes. (the fan on)"; that names it (and the value) for the
        grounding, the constrained decode and the model alike."""
        if (asked := self.asked_back(history)) is None or self.named(text):
            return text
        device, values = asked
        if asked_values(device.payloads, words(text)):  # "Off." to either question
            return f"{text} (the {device.name})"
        if len(values) == 1 and YES_WORDS & set(words(text)):
            return f"{text} (the {device.name} {_say(values[0])})"
        return text

    def asked_back(self, history: Sequence[dict]) -> tuple[HomeDevice, list[str]] | None:
        """The device the last reply ended by asking about (``ask_value``), and the values the question named (one:
        "do you want it on?", which "yes" answers; more: which of them); None when it asked nothing."""
        last = history[-1] if history else {}
        content = last.get("content") if last.get("role") == "assistant" else None
        if not isinstance(content, str) or not content.rstrip().endswith("?") or ASK_BACK not in content:
            return None
        question = content[content.rfind(ASK_BACK) + len(ASK_BACK) :]
        for device in sorted(self.devices, key=lambda d: -len(d.name)):
            if question.startswith(f" {device.name} "):
                said = f" {' '.join(words(question[len(device.name) + 1 :]))} "
                return device, [p for p in device.payloads if f" {' '.join(words(_say(p)))} " in said]
        return None

    def answers(self, heard: str, history: Sequence[dict] = ()) -> list[str]:
        """What a short answer to the last question back may be, for the recogniser to choose among when the words
        it heard answer nothing (no value, no yes, no no, no device): tiny.en heard "Turn it on, please." as "Tommy
        tongue, please." in one espeak-ng voice every time. The values the question named and the device's word
        values (``answer_forms``), yes when it named one, and no. [] when there was no question back or the words
        answer it."""
        if (asked := self.asked_back(history)) is None or self.follow_up(heard, history) != heard:
            return []
        if self.named(heard) or {"no", "nope", "not", "dont"} & set(words(heard)):
            return []
        device, named = asked  # any of its word values answers too: "Turn it off." to "Do you want it on?"
        values = dict.fromkeys([*named, *(p for p in device.payloads if not p.isdigit())])
        yes = ["Yes.", "Yes, please."] if len(named) == 1 else []
        return [*(form for v in values for form in answer_forms(v)), *yes, "No.", "No, thanks."]

    def hear(self, text: str, history: Sequence[dict] = (), spoken: bool = False) -> Heard:
        """The words as the grounding, the constrained decode and the model read them: an answer to the last
        question back (``follow_up``); else, for spoken words that name no device, ask for something and ask
        nothing about state, the device they sound like (``sounds_like``, or the audio chose it:
        voice/dialog/rehearing.py): "Close my garbage door. (the garage door)" (``guessed_as``), which the
        grounding asks back about before anything is done."""
        answer = self.follow_up(text, history)
        if answer != text:
            return Heard(answer, answered=True)
        by_name = {d.name: d for d in self.devices}
        if spoken and (guess := _GUESS.fullmatch(text)) and guess[2] in by_name and not self.named(guess[1]):
            return Heard(text, guessed=by_name[guess[2]])  # guessed before (by the audio)
        if not self.guessing(text, spoken) or (at := sounds_like(tuple(words(text)), tuple(by_name))) is None:
            return Heard(text)
        if not self.asks_of(self.devices[at], text):
            return Heard(text)
        return Heard(guessed_as(text, self.devices[at]), guessed=self.devices[at])

    def guessing(self, text: str, spoken: bool) -> bool:
        """Whether a device may be guessed for the words: spoken, naming none, asking nothing about state."""
        return spoken and not self.named(text) and not asks_state(text)

    def asks_of(self, device: HomeDevice, text: str) -> bool:
        """The words ask something of the device, if it is the one meant: one of its values, or a request word."""
        said = words(text)
        return bool(asked_values(device.payloads, said) or REQUEST_WORDS & set(said))

    def renamings(self, text: str, history: Sequence[dict] = ()) -> dict[str, HomeDevice]:
        """Spoken words that name no device, that no name is spelled like (``hear``) and that nothing hedges, said
        with a span as a device's name (``said_as``): each such text with its device, for the recogniser to score
        against the audio ("Set the memory light 50" -> "Set the bedroom light 50"). {} otherwise."""
        heard = self.hear(text, history, spoken=True)
        if heard.text != text or heard.guessed or not self.guessing(text, True) or HEDGES & set(words(text)):
            return {}
        return {said: d for d in self.devices if self.asks_of(d, text) for said in said_as(text, d.name)}

    def annotate(self, text: str, history: Sequence[dict] = (), spoken: bool = False) -> str:
        """The user's words as the model sees them: ``hear``, and with the state of the devices asked about
        when the words ask about state (the named devices, else those of the kind named: "which lights are on")."""
        text = self.hear(text, history, spoken).text
        if not asks_state(text):
            return text
        shown = [d for d in self.named(text) if d.state_topic]
        if not shown:
            heard = set(words(text))
            shown = [d for d in self.devices if d.state_topic and d.kind in heard]
        if not shown:
            return text
        values = [self.states.get(d.state_topic or "", UNKNOWN) for d in shown]
        known = ", ".join(f"{d.name} = {value}" for d, value in zip(shown, values, strict=True))
        return f"{text}\n(state now: {known}{_yes_or_no(text, values)})"

    def grounding(self, heard: str, history: Sequence[dict] = (), spoken: bool = False) -> Grounding:
        """A check for ActionParser: None when the user's words (``follow_up``) ask for this action, else why not.
        A device named with none of its values is asked back about (``ask_value``). So is a ``spoken`` command
        that the words only sound like (``hear``), that asks for two values, that names another area
        (``elsewhere``), whose value only an "on" before a place asks for (``only_by_a_place``), or that has no
        request word (``requests``): it may be a question heard without its first word."""
        h = self.hear(heard, history, spoken)
        heard, said = h.text, words(h.text)
        question, devices = asks_state(heard), self.named(heard)
        named, by_topic = {d.topic for d in devices}, {d.topic: d for d in self.devices}

        def check(topic: str, payload: str) -> Refusal | None:
            if not self.grounded:
                return None
            if question:
                return Refusal("the user asked a question, not for a change (a question about state never acts)")
            if (device := by_topic.get(topic)) is None:
                return None  # an allow-listed topic without a name: the allow-list alone decides
            if topic not in named:
                return Refusal(f"the user's words do not name the {device.name!r}")
            if payload not in (asked := asked_values(device.payloads, said)):
                why = f"the user's words do not ask for {payload!r} (heard as {heard!r})"
                if asked or any(w.isdigit() for w in said):  # a value it cannot take ("25%"): no question
                    return Refusal(why)
                return Refusal(why + ": asked back", self.ask(device))
            if not spoken or h.answered:
                return None
            two = len(asked) > 1 and len(devices) == 1  # "turn on the lamp and off the fan" asks for each one
            if h.guessed == device or two or self.elsewhere(said, devices) or only_by_a_place(payload, said):
                return Refusal(f"heard {heard!r}, not for certain: asked back", self.ask(device, asked))
            if not requests(heard, device.name, device.payloads):
                return Refusal(f"heard no request word in {heard!r}: asked back", self.ask(device, [payload]))
            return None

        return check

    def opening(self, heard: str, history: Sequence[dict] = (), spoken: bool = False) -> list[tuple[str, str]]:
        """The commands one of which the reply opens with when the words (``follow_up``) leave the model nothing
        to decide, as Home Assistant matches its sentences before any model: they name one device, nothing hedges
        them (``HEDGES``: "don't", "when") or makes them a question ("?", a question opener), and they ask for one
        of its values that the grounding lets through or asks back about (that command), or for none of them (all
        its values: the grounding turns the one written into the question back, ``ask_value``). Else []: the
        model decides. Measured on configs/home_cases.json: 249 of its 270 commands open with their command, none
        wrong, and none of the 142 other cases opens with anything."""
        text = self.hear(heard, history, spoken).text
        said, named = words(text), self.named(text)
        hedged = HEDGES & set(said) or text.rstrip().endswith("?")
        if not self.grounded or len(named) != 1 or asks_state(text) or hedged:
            return []
        device = named[0]
        asked = asked_values(device.payloads, said)
        if len(asked) > 1 and not spoken:  # spoken, the grounding asks which
            return []
        check = self.grounding(heard, history, spoken)
        allowed = [(device.topic, p) for p in asked or device.payloads]
        return [(t, p) for t, p in allowed if (refusal := check(t, p)) is None or refusal.asks_back]

    def set_state(self, state_topic: str, value: str) -> bool:
        """Keep a state topic's latest value; False when no device has that state topic."""
        if not any(d.state_topic == state_topic for d in self.devices):
            return False
        self.states[state_topic] = value.strip()
        return True


def guessed_as(text: str, device: HomeDevice) -> str:
    """Words that name no device, with the one guessed for them: "Close my garbage door. (the garage door)"."""
    return f"{text} (the {device.name})"


_GUESS = re.compile(r"(.*) \(the (.+)\)", re.DOTALL)  # ``guessed_as``'s form


def _yes_or_no(question: str, values: list[str]) -> str:
    """For a yes/no question about one device's state ("is the garage door closed?"), the answer the state
    gives: measured, the small model opened with "Yes" whatever the state it was shown. "" when the question
    names no single state (or both, "open or closed") or the state is not one of a known pair."""
    if len(values) != 1 or (value := values[0].casefold()) not in OPPOSITE:
        return ""
    named = {w for w in words(question)} & {value, OPPOSITE[value]}
    if len(named) != 1:
        return ""
    return "; so the answer is yes" if named == {value} else "; so the answer is no"


@dataclass
class ActionSetup:
    """How the model is told about the allowed actions (mqtt.action_format), and how its answers are read."""

    prompt: str  # what the system prompt says about actions ("" without any)
    base: str  # the configured system prompt, less what a home prompt says itself
    tools: list[dict]  # control_device, for the tool-call format
    resolve: Callable[[str], str] | None  # a device named in a tool call -> its topic
    constrained: bool  # the command after '[ACTION' is decoded among the grounded ones only

    @property
    def system_prompt(self) -> str:
        return (self.base + self.prompt).strip()


def action_setup(
    allowed: dict[str, list[str]], action_format: str, system_prompt: str, home: Home | None
) -> ActionSetup:
    """With named devices the home prompt replaces the generic one (it would say "helpful assistant" twice)."""
    from voice.config import DEFAULT_SYSTEM_PROMPT

    tools_format = bool(allowed) and action_format == "tools"
    if home is not None:
        prompt = "\n\n" + home.prompt(action_format)
        base = "" if system_prompt == DEFAULT_SYSTEM_PROMPT else system_prompt
    else:
        instructions = tool_instructions if tools_format else action_instructions
        prompt, base = ("\n\n" + instructions(allowed) if allowed else ""), system_prompt
    return ActionSetup(
        prompt=prompt,
        base=base,
        tools=[action_tool()] if tools_format else [],
        resolve=(home.resolve if home is not None else str) if tools_format else None,  # no names: topics are
        constrained=bool(allowed) and action_format == "constrained",
    )


def constrained_commands(
    home: Home | None, text: str, history: Sequence[dict] = (), spoken: bool = False
) -> dict[str, list[str]]:
    """What a constrained action may say (mqtt.action_format = "constrained"): each value the words (``follow_up``)
    ask for of each device they name; none for a state question, or without named devices (the reply is then free,
    and the parser refuses what comes). Never the whole allow-list: a marker the model began for a topic off the
    list ("[ACTION home/front_door/lock/set") would be made into an allowed command instead of refused."""
    if home is None:
        return {}
    text = home.hear(text, history, spoken).text
    if asks_state(text) or not home.grounded:
        return {} if home.grounded else home.allowed
    asked = {d.topic: asked_values(d.payloads, words(text)) for d in home.named(text)}
    return {topic: values for topic, values in asked.items() if values}


def marker_choices(
    home: Home | None, text: str, history: Sequence[dict] = (), spoken: bool = False
) -> tuple[list[str], list[str]]:
    """For the constrained format: what may follow "[ACTION" (``constrained_commands``), and the markers one of
    which the reply must open with (``Home.opening``; none: it opens freely)."""
    commands = constrained_commands(home, text, history, spoken)
    opening = home.opening(text, history, spoken) if home is not None else []
    choices = [f" {topic} {p}]" for topic, payloads in commands.items() for p in payloads]
    return choices, [f"[{KEYWORD} {topic} {p}]" for topic, p in opening]
