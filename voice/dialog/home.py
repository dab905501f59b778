"""The home the assistant runs in: named devices by area, their last known state, and what a reply may do to them.

What the user's words ask is read by Home Assistant's matcher over Home Assistant's sentences
(voice/dialog/understanding.py). That reading, not the model, decides whether a reply may act:
- a strict match opens the reply with its commands (the model then confirms them in a few words);
- a guess (a match after dropping words at the ends, or a device name that only sounds like the one heard) and any
  command the model proposes when nothing matched are asked back ("Do you want the reading light on?"); the answer
  ("yes", "switch it on", "no") is read by the same matcher (our answer sentences, voice/dialog/sentences/); a no,
  or words that answer nothing, leave the device as it is, and the reply says so;
- a question about state, a request for a later time, a value a device cannot take never act.

The system prompt (``prompt``) depends on the devices only, never on their state: it is the cached prefix of
every turn. The state goes into the user's message, and only when the words ask about state (``annotate``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
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
from voice.dialog.answers import NO, VALUE
from voice.dialog.devices import HomeDevice
from voice.dialog.home_prompt import home_prompt
from voice.dialog.sentence_data import device_class
from voice.dialog.state_reply import is_or_are, listed, state_reply, state_said, yes_or_no
from voice.dialog.understanding import (
    Act,
    AskState,
    CannotDo,
    Command,
    HomeGrammar,
    Later,
    NoMatch,
    Reading,
    infer_domain,
)
from voice.dialog.wording import said_as, sounds_like, words

if TYPE_CHECKING:
    from voice.config_servers import MQTTConfig

ASK_BACK = "Do you want the"  # how a question back (``ask_value``) starts
_SAID = {
    "close": "closed",
    "lock": "locked",
    "unlock": "unlocked",
    "pause": "paused",
    "play": "playing",
}  # a value as the question back says it
UNKNOWN = "unknown"  # said for a device with a state topic from which nothing has come yet
LATER_SPEECH = " Sorry, I can only do that now, not at a later time or when something happens."


def not_switched(name: str, *, sure: bool = True) -> str:
    """What the person hears when the home could not be reached for a command: ``sure`` it was not done, or
    lost while it was on its way."""
    if sure:
        return f"I lost the connection to the home: the {name} was not switched."
    return f"I lost the connection to the home while switching the {name}: it may not have been switched."


DECLINED = "declined"  # the intent of an answer that said no


def ask_value(devices: Sequence[HomeDevice], values: Sequence[str] | None = None) -> str:
    """The question back: whether ``values`` are wanted ("Do you want the bedroom fan on?", "Do you want the desk
    lamp and the reading light off?"), or which of the device's word values ("Do you want the garage door open or
    closed?")."""
    if values is None:
        values = [p for p in devices[0].payloads if not p.isdigit()] or devices[0].payloads
    said = [say_value(p) for p in values]
    choices = f"{', '.join(said[:-1])} or {said[-1]}" if len(said) > 1 else said[0]
    return f" {ASK_BACK} {listed([d.name for d in devices])} {choices}?"


def say_value(value: str) -> str:
    """A value as the question back says it ("closed", "set to 50")."""
    return f"set to {value}" if value.isdigit() else _SAID.get(value.casefold(), value.casefold())


@dataclass(frozen=True)
class Declined:
    """The question back ended without a yes: the user said no (``said_no``), or words that answer nothing and
    command nothing, which the reply owns up to not having understood. Nothing is done, and the reply opens by
    saying so (``left_as_is``): left to itself, the model has answered such words with "Done." when nothing was
    done."""

    devices: tuple[HomeDevice, ...]
    said_no: bool = True

    @property
    def left_as_is(self) -> str:
        names = listed([d.name for d in self.devices])
        it = "they are" if len(self.devices) > 1 or is_or_are(names) == "are" else "it is"
        opening = "Okay, " if self.said_no else "Sorry, I didn't catch that. "
        return f"{opening}I left the {names} as {it}."


Understood = Reading | Declined


@dataclass
class Home:
    """The configured devices and the last state heard on their state topics (``states``: state topic -> value,
    written by the MQTT bridge)."""

    devices: list[HomeDevice]
    extra: dict[str, list[str]] = field(default_factory=dict)  # allow-listed topics that are no named device
    states: dict[str, str] = field(default_factory=dict)
    grounded: bool = True  # False only to measure what the prompt does alone (`bench home --ungrounded`)
    language: str = "en"
    here: str | None = None  # the area the assistant stands in ("the light here")
    # whether the MQTT bridge has the broker now: None before it ever connected (a command then waits for it),
    # False while it is away (a command is refused at once, not confirmed and then reported as not done)
    reachable: bool | None = None

    def __post_init__(self) -> None:
        self.grammar = HomeGrammar(self.devices, self.language, self.here)
        self._understood = functools.lru_cache(maxsize=16)(self._understand)

    @classmethod
    def from_config(cls, mqtt: MQTTConfig, language: str = "en") -> Home | None:
        """The home of ``mqtt.devices``; None when no device is named (then the plain allow-list prompt is used)."""
        if not mqtt.devices:
            return None
        devices = [
            HomeDevice(
                d.name,
                d.topic,
                tuple(d.payloads),
                d.area,
                d.state_topic,
                d.domain or infer_domain(d.payloads, d.topic),
                tuple(d.aliases),
                d.floor,
                d.device_class or device_class(d.name, d.aliases, language),
            )
            for d in mqtt.devices
        ]
        named = {d.topic for d in devices}
        extra = {t: list(p) for t, p in mqtt.allowed_actions.items() if t not in named}
        return cls(devices, extra, language=language, here=mqtt.area)

    @property
    def allowed(self) -> dict[str, list[str]]:
        return {**self.extra, **{d.topic: list(d.payloads) for d in self.devices}}

    def resolve(self, device: str) -> str:
        """The command topic of the device a ``control_device`` call names: its name or an alias (any case), or a
        topic the model wrote instead. Anything else comes back as it is: no topic, so it is refused."""
        by_name = {n.casefold(): d.topic for d in self.devices for n in (d.name, *d.aliases)}
        return by_name.get(device.casefold(), device)

    def prompt(self, action_format: str = "markers") -> str:
        """The system prompt for a home assistant (voice/dialog/home_prompt.py): nothing in it changes between
        turns, so it stays the cached prefix of every turn."""
        return home_prompt(self.devices, self.extra, action_format)

    # ---- understanding ---------------------------------------------------------------------------------------

    def understand(self, text: str, history: Sequence[dict] = (), spoken: bool = False) -> Understood:
        """What the words ask (cached: a turn asks several times): an answer to the last question back, else the
        matcher's reading; spoken words that match nothing may name a device they only sound like (a guess)."""
        return self._understood(text, _last_reply(history), spoken)

    def _understand(self, text: str, last_reply: str, spoken: bool) -> Understood:
        reading = self.grammar.read(text)
        if (asked := self._asked_in(last_reply)) is not None and not _certain(reading):
            devices, values = asked
            answer = self.grammar.answers.read(text, devices[0].payloads)
            if answer is not None and not answer.yes:
                return Declined(tuple(devices))
            if answer is not None and (value := answer.value or (values[0] if len(values) == 1 else None)):
                commands = tuple(Command(d, value) for d in devices if value in d.payloads)
                return Act(commands, certain=True, intent="answer")
        if isinstance(reading, NoMatch) and spoken and (guess := self.guess(text)) is not None:
            return guess
        if asked is not None and isinstance(reading, NoMatch):
            return Declined(tuple(asked[0]), said_no=False)
        if isinstance(reading, Act) and reading.terse and spoken:  # maybe a question that lost its first word
            return Act(reading.commands, certain=False, intent=reading.intent)
        return reading

    def guess(self, text: str) -> Act | None:
        """Spoken words that match nothing, read with a span said as a device's name instead: the device the audio
        chose ("Set the memory light 50 (the bedroom light)", voice/dialog/rehearing.py), else the one whose name
        the words are spelled most like. A guess is never done at once: it is asked back."""
        by_name = {d.name: d for d in self.devices}
        if (chosen := _GUESS.fullmatch(text)) and chosen[2] in by_name:
            text, candidates = chosen[1], [by_name[chosen[2]]]
        elif (at := sounds_like(tuple(words(text)), tuple(by_name))) is not None:
            candidates = [self.devices[at]]
        else:
            return None
        for device in candidates:
            for said in said_as(text, device.name):
                reading = self.grammar.read(said)
                if isinstance(reading, Act) and {c.device for c in reading.commands} == {device}:
                    return Act(reading.commands, certain=False, intent=reading.intent)
        return None

    def asked_back(self, history: Sequence[dict]) -> tuple[list[HomeDevice], list[str]] | None:
        """The devices the last reply ended by asking about (``ask_value``), and the values the question named (one:
        "do you want it on?", which "yes" answers; more: which of them); None when it asked nothing."""
        return self._asked_in(_last_reply(history))

    def _asked_in(self, content: str) -> tuple[list[HomeDevice], list[str]] | None:
        if not content.rstrip().endswith("?") or ASK_BACK not in content:
            return None
        rest = content[content.rfind(ASK_BACK) + len(ASK_BACK) :]
        by_length = sorted(self.devices, key=lambda d: -len(d.name))
        devices: list[HomeDevice] = []
        while device := next(
            (d for d in by_length if rest.startswith(f" {d.name} ") or rest.startswith(f" {d.name},")), None
        ):
            devices.append(device)
            rest = rest[len(device.name) + 1 :]
            for joint in (", the", " and the"):
                if rest.startswith(joint):
                    rest = rest[len(joint) :]
                    break
            else:
                break
        if not devices:
            return None
        said = f" {' '.join(words(rest))} "
        return devices, [p for p in devices[0].payloads if f" {' '.join(words(say_value(p)))} " in said]

    def answers(self, heard: str, history: Sequence[dict] = ()) -> list[str]:
        """What a short answer to the last question back may be, for the recogniser to choose among when the words
        it heard answer nothing and command nothing: sentences of the answer grammar for the device's values. []
        when there was no question back or the words are understood."""
        if (asked := self.asked_back(history)) is None:
            return []
        payloads = asked[0][0].payloads
        if not isinstance(self.grammar.read(heard), NoMatch) or self.grammar.answers.read(heard, payloads):
            return []
        return self.grammar.answers.sample(payloads)

    def rivals(self, heard: str, history: Sequence[dict] = ()) -> tuple[list[str], list[str]]:
        """What else an acting answer to the last question back may have been, for the recogniser to weigh it
        against: the answers that say no, and for a value ("lock it") the answers naming the device's other
        values ("unlock it"). An acting answer the audio fits hardly better than one of them is taken as a no: a
        yes or a value acts, a no does nothing. ([], []) when the words are no acting answer to a question back."""
        if (asked := self.asked_back(history)) is None:
            return [], []
        payloads = asked[0][0].payloads
        answer = self.grammar.answers.read(heard, payloads)
        if answer is None or not answer.yes or _certain(self.grammar.read(heard)):
            return [], []
        noes = self.grammar.answers.sample(payloads, intents=(NO,), every_polite=True)
        if answer.value is None:
            return noes, []
        others = [p for p in payloads if p != answer.value]
        return noes, self.grammar.answers.sample(others, intents=(VALUE,), every_polite=True)

    def renamings(self, text: str, history: Sequence[dict] = ()) -> dict[str, HomeDevice]:
        """Spoken words that match nothing, said with a span as a device's name (``said_as``) where that makes a
        command the matcher reads: each such text with its device, for the recogniser to score against the audio
        ("Set the memory light 50" -> "Set the bedroom light 50"). {} otherwise."""
        understood = self.understand(text, history, spoken=False)
        if not (isinstance(understood, NoMatch) or isinstance(understood, Declined) and not understood.said_no):
            return {}
        found: dict[str, HomeDevice] = {}
        for device in self.devices:
            for said in said_as(text, device.name):
                reading = self.grammar.read(said)
                if isinstance(reading, Act) and reading.certain and {c.device for c in reading.commands} == {device}:
                    found[said] = device
        return found

    # ---- what the model sees, and what a reply may do ---------------------------------------------------------

    def annotate(self, text: str, history: Sequence[dict] = (), spoken: bool = False) -> str:
        """The user's words as the model sees them: an answer with the command it completes ("Yes. (the reading
        light on)"); a question with the state of the devices it is about; a later request or a value a device
        cannot take with a note that says so."""
        understood = self.understand(text, history, spoken)
        if isinstance(understood, Act) and understood.intent == "answer" and understood.commands:
            names = listed([c.device.name for c in understood.commands])
            return f"{text} (the {names} {say_value(understood.commands[0].payload)})"
        if isinstance(understood, Declined):
            why = "the user said no" if understood.said_no else "this answers nothing you asked"
            return f"{text}\n(note: {why}; nothing was changed)"
        if isinstance(understood, Later):
            return f"{text}\n(note: you cannot do anything at a later time, only now; say so)"
        if isinstance(understood, CannotDo):
            takes = "; ".join(f"the {d.name} takes {', '.join(d.payloads)}" for d in understood.devices)
            return f"{text}\n(note: {takes}; say that you cannot do what was asked)"
        if isinstance(understood, AskState):  # asked: said even when nothing has come (then it is unknown)
            shown = tuple(d for d in understood.devices if d.state_topic)
        else:  # only mentioned: shown when its state is known
            shown = tuple(d for d in self.mentioned(text) if self.states.get(d.state_topic or ""))
        if not shown or isinstance(understood, Act):
            return text
        values = [self.states.get(d.state_topic or "", UNKNOWN) for d in shown]
        known = ", ".join(f"{d.name} = {value}" for d, value in zip(shown, values, strict=True))
        if isinstance(understood, AskState) and (said := self.state_reply(understood)) is not None:
            return f"{text}\n(state now: {known}; the answer: {said})"
        return f"{text}\n(state now: {known}{yes_or_no(text, values)})"

    def state_reply(self, asked: AskState) -> str | None:
        """The answer the state topics give to a question about state (voice/dialog/state_reply.py)."""
        return state_reply(asked, self.states)

    def mentioned(self, text: str) -> list[HomeDevice]:
        """The devices whose name or an alias stands in the words ("do you know if the kettle is on")."""
        said = f" {' '.join(words(text))} "
        return [d for d in self.devices if any(f" {' '.join(words(n))} " in said for n in (d.name, *d.aliases))]

    def ask(self, devices: Sequence[HomeDevice], values: Sequence[str] | None = None) -> str:
        """The question back (``ask_value``), after the state of a single device when one has come."""
        state = self.states.get(devices[0].state_topic or "", "").casefold() if len(devices) == 1 else ""
        name = devices[0].name
        said = f" The {name} {is_or_are(name)} {state_said(state)}." if state else ""
        return said + ask_value(devices, values)

    def grounding(self, heard: str, history: Sequence[dict] = (), spoken: bool = False) -> Grounding:
        """A check for ActionParser: None when the words ask for this action now, else why not. A strict reading's
        commands pass; a guess's, and any command of a named device the model proposes when nothing matched, are
        asked back; everything else is refused."""
        understood = self.understand(heard, history, spoken)
        by_topic = {d.topic: d for d in self.devices}

        def check(topic: str, payload: str) -> Refusal | None:
            if not self.grounded:
                return None
            if isinstance(understood, AskState):
                return Refusal("the user asked a question, not for a change (a question about state never acts)")
            if isinstance(understood, Later):
                return Refusal("the user asked for a later time; nothing is done now", LATER_SPEECH)
            if isinstance(understood, CannotDo | Declined):
                return Refusal(f"the user's words ask for nothing the devices can do ({understood})")
            if (device := by_topic.get(topic)) is None:
                return None  # an allow-listed topic without a name: the allow-list alone decides
            if isinstance(understood, Act):
                if (topic, payload) not in {(c.topic, c.payload) for c in understood.commands}:
                    return Refusal(f"the user's words ask for other commands ({understood.intent}), not {payload!r}")
                if understood.certain:
                    if self.reachable is False:
                        away = "the home is not reachable (the MQTT broker is away)"
                        return Refusal(away, " " + not_switched(device.name))
                    return None
                alike = [c.device for c in understood.commands if c.payload == payload]  # one question for all
                return Refusal(f"heard {heard!r}, not for certain: asked back", self.ask(alike, [payload]))
            return Refusal(
                f"nothing matched {heard!r}; the model proposed it: asked back", self.ask([device], [payload])
            )

        return check

    def opening(self, heard: str, history: Sequence[dict] = (), spoken: bool = False) -> list[Command]:
        """The commands the reply opens with: those of a reading that asks for them (done when certain; else the
        grounding turns the first into the question back, which names every device of its value). [] when the
        model decides."""
        understood = self.understand(heard, history, spoken) if self.grounded else NoMatch()
        return list(understood.commands) if isinstance(understood, Act) else []

    def set_state(self, state_topic: str, value: str) -> bool:
        """Keep a state topic's latest value; False when no device has that state topic."""
        if not any(d.state_topic == state_topic for d in self.devices):
            return False
        self.states[state_topic] = value.strip()
        return True


def _certain(reading: Reading) -> bool:
    return isinstance(reading, Act) and reading.certain


def _last_reply(history: Sequence[dict]) -> str:
    last = history[-1] if history else {}
    content = last.get("content") if last.get("role") == "assistant" else None
    return content if isinstance(content, str) else ""


def guessed_as(text: str, device: HomeDevice) -> str:
    """Words that name no device, with the one the audio chose for them: "Set the memory light 50 (the bedroom
    light)" (``Home.guess`` reads it back)."""
    return f"{text} (the {device.name})"


_GUESS = re.compile(r"(.*) \(the (.+)\)", re.DOTALL)  # ``guessed_as``'s form


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
    if not home.grounded:
        return home.allowed
    commands: dict[str, list[str]] = {}
    for command in home.opening(text, history, spoken):
        commands.setdefault(command.topic, []).append(command.payload)
    return commands


def marker_choices(
    home: Home | None, text: str, history: Sequence[dict] = (), spoken: bool = False
) -> tuple[list[str], list[str]]:
    """For the constrained format: what may follow "[ACTION" (``constrained_commands``), and what the reply must
    open with: the markers of ``Home.opening``, that nothing is done at a later time, that a question back left the
    device as it is (``Declined``), or the answer the state gives to a question about it (``Home.state_reply``);
    none: it opens freely."""
    commands = constrained_commands(home, text, history, spoken)
    opening = home.opening(text, history, spoken) if home is not None else []
    choices = [f" {topic} {p}]" for topic, payloads in commands.items() for p in payloads]
    understood = home.understand(text, history, spoken) if home is not None else None
    if isinstance(understood, Later):
        return choices, [LATER_SPEECH.strip()]
    if isinstance(understood, Declined):
        return choices, [understood.left_as_is]
    if home is not None and isinstance(understood, AskState) and (said := home.state_reply(understood)):
        return choices, [said]
    return choices, ["".join(f"[{KEYWORD} {c.topic} {c.payload}]" for c in opening)] if opening else []
