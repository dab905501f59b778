"""What a user's words ask of the home, read the way Home Assistant reads them.

Home Assistant's own sentences (``home-assistant-intents``) are matched by its own matcher (``hassil``), with slot
lists built from the configured devices: their names and aliases, areas and floors. A match is an intent with
slots; ``DEEDS`` turns it into commands through each device's domain and allow-listed payloads. Nothing here is
an English word list: the words live in the sentence data, Home Assistant's and ours (voice/dialog/sentences/).

How sure a reading is decides what happens (voice/dialog/home.py):
- a strict match of the whole sentence is ``certain``: it acts; so is one of a single clause said beside clauses
  that name nothing of the home and ask nothing ("switch the porch light on, the kids are coming home");
- a match after dropping a few words at either end, of one clause among others that name the home too, with a
  name said in part ("the side gate" for the side gate lock), or of a sentence that says nothing but a name, is a
  guess: the assistant asks back before anything is done;
- a sentence in one of the sentence data's shapes of "not now" (a condition, a later time, a negation, words taken
  back, someone else's words) and any sentence that matches nothing: the language model answers, and whatever
  command it proposes is asked back.
Questions about state, requests for a later time and values a device cannot take never act.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hassil import recognize_all
from hassil.expression import TextChunk
from hassil.intents import SlotList, TextSlotList, TextSlotValue
from hassil.parse_expression import parse_sentence
from hassil.recognize import RecognizeResult, is_match
from hassil.sample import sample_sentence
from hassil.util import remove_skip_words

from voice.dialog.answers import ANSWER_INTENTS, AnswerGrammar
from voice.dialog.devices import HomeDevice
from voice.dialog.name_forms import partial_names, said_otherwise, without_area
from voice.dialog.sentence_data import (
    DOMAINS,
    NEVER_SHAPE,
    intents_for,
    kind_words,
    language_data,
    not_now_for,
)

# Dropped from either end of a sentence that does not match as a whole, at most this many words in all: the
# matcher's tolerance for a clause it has no template for. Such a match is only ever asked back.
FUZZY_WORDS = 4

STATE_INTENTS = frozenset({"HassGetState", "HassClimateGetTemperature"})
# Home Assistant's rules for articles, places and quantities ("the", "in", "all", "everywhere", "here", "home"):
# they say where and how many, never what to do
PLACE_RULES = frozenset({"the", "in", "all", "everywhere", "here", "home"})
LATER_INTENT = "HassStartTimer"  # with a command: Home Assistant's delayed command ("... in ten minutes")


@dataclass(frozen=True)
class Command:
    """One command for one device: its command topic and an allow-listed payload."""

    device: HomeDevice
    payload: str

    @property
    def topic(self) -> str:
        return self.device.topic


@dataclass(frozen=True)
class Act:
    """The words ask for these commands now. ``certain``: a strict match (done at once); else asked back first."""

    commands: tuple[Command, ...]
    certain: bool
    intent: str
    terse: bool = False  # the sentence said only the name and the value ("garden lights off"): no verb


@dataclass(frozen=True)
class AskState:
    """The words ask how devices are ("is the back door locked?", "which lights are on?"): never acts. ``state``:
    the state the question names ("on"), if any; ``form``: Home Assistant's response for the sentence that
    matched ("one_yesno": is it so; "any", "all", "which", "how_many" of several; "one": how it is)."""

    devices: tuple[HomeDevice, ...]
    state: str | None = None
    form: str = "one"


@dataclass(frozen=True)
class Later:
    """The words ask for a command at a later time ("turn off the lamp in ten minutes"): not done now."""

    command: str


@dataclass(frozen=True)
class CannotDo:
    """The words ask something the named devices cannot do (a value off their allow-list): said, not done."""

    devices: tuple[HomeDevice, ...]
    intent: str


@dataclass(frozen=True)
class NoMatch:
    """No sentence matches: the language model answers (and any command it proposes is asked back)."""


Reading = Act | AskState | Later | CannotDo | NoMatch


# What each intent asks of a device of a domain: the payloads that say it, in order of preference; the first one
# the device allows is sent. ``None`` stands for any other domain.
_TURN_ON: dict[str | None, tuple[str, ...]] = {
    "cover": ("OPEN",),
    "valve": ("OPEN",),
    "lock": ("LOCK",),
    "media_player": ("PLAY", "ON"),
    "vacuum": ("START",),
    None: ("ON",),
}
_TURN_OFF: dict[str | None, tuple[str, ...]] = {
    "cover": ("CLOSE", "CLOSED"),
    "valve": ("CLOSE", "CLOSED"),
    "lock": ("UNLOCK",),
    "media_player": ("PAUSE", "OFF"),
    "vacuum": ("STOP", "DOCK"),
    None: ("OFF",),
}
DEEDS: dict[str, dict[str | None, tuple[str, ...]]] = {
    "HassTurnOn": _TURN_ON,
    "HassTurnOff": _TURN_OFF,
    "HassMediaPause": {None: ("PAUSE",)},
    "HassMediaUnpause": {None: ("PLAY", "RESUME")},
    "HassMediaNext": {None: ("NEXT",)},
    "HassMediaPrevious": {None: ("PREVIOUS",)},
    "HassMediaPlayerMute": {None: ("MUTE",)},
    "HassMediaPlayerUnmute": {None: ("UNMUTE",)},
    "HassVacuumStart": {None: ("START",)},
    "HassVacuumReturnToBase": {None: ("DOCK", "RETURN")},
    "HassLawnMowerStartMowing": {None: ("START",)},
    "HassLawnMowerDock": {None: ("DOCK",)},
}
# Intents whose value is a number in a slot: the payload is that number as the allow-list spells it.
NUMBERS = {
    "HassLightSet": "brightness",
    "HassSetPosition": "position",
    "HassClimateSetTemperature": "temperature",
    "HassSetVolume": "volume",
    "HassFanSetSpeed": "percentage",
}
# A position of 100 or 0 is also said as open or closed.
_ENDS = {100: _TURN_ON, 0: _TURN_OFF}


def infer_domain(payloads: Sequence[str], topic: str) -> str:
    """A device's Home Assistant domain when the config gives none: a topic level that names a domain, else what
    its payloads can do (lock/unlock: a lock; open/close: a cover; play/pause: a media player; on/off with numbers:
    a dimmable light; numbers alone: a thermostat; else a switch)."""
    levels = topic.casefold().split("/")
    if known := [level for level in levels if level in DOMAINS]:
        return known[-1]
    has = {p.casefold() for p in payloads}
    numbers = any(p.isdigit() for p in payloads)
    if {"lock", "unlock"} <= has:
        return "lock"
    if "open" in has and has & {"close", "closed"}:
        return "cover"
    if {"play", "pause"} <= has:
        return "media_player"
    if numbers and not has & {"on", "off"}:
        return "climate"
    return "light" if numbers else "switch"


def _text_list(name: str, pairs: Iterable[tuple[str, Any, dict[str, Any] | None]]) -> TextSlotList:
    values = [TextSlotValue(TextChunk(text), value, context) for text, value, context in pairs]
    return TextSlotList(name=name, values=values)


@dataclass
class HomeGrammar:
    """The home's devices as Home Assistant's matcher sees them; ``read`` says what a sentence asks."""

    devices: Sequence[HomeDevice]
    language: str = "en"
    here: str | None = None  # the area this assistant stands in: "turn on the light here"
    _slots: dict[str, SlotList] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.intents = intents_for(self.language)
        names = [
            (said, i, {"domain": d.domain, **({"area": d.area} if d.area else {})})
            for i, d in enumerate(self.devices)
            for said in dict.fromkeys([d.name, *d.aliases])
        ]
        areas = dict.fromkeys(d.area for d in self.devices if d.area)
        floors = dict.fromkeys(d.floor for d in self.devices if d.floor)
        kinds = kind_words(self.language)
        # a name without its last word when that word only says the device's kind ("lock the side gate" for the
        # side gate lock), or without its first words when they only say the device's own area ("the skylight"
        # for the loft skylight): the verb or the room says it again, so this is as sure as the whole name
        parts = partial_names(self.devices)
        sure = [(said, i, context) for said, i, context, dropped in parts if dropped in kinds]
        sure += without_area(self.devices, kinds, {p.casefold() for p in (*areas, *floors) if p})
        guessed = [(said, i, context) for said, i, context, dropped in parts if dropped not in kinds]
        self._slots = {
            "name": _text_list("name", [*names, *sure, *said_otherwise([*names, *sure], self.devices)]),
            "area": _text_list("area", ((a, a, None) for a in areas)),
            "floor": _text_list("floor", ((f, f, None) for f in floors)),
            "value": _text_list("value", ()),  # the answers' values: only while a question back is answered
        }
        # names said in part ("the side gate" for the side gate lock): only ever a guess, asked back
        self._partial_slots = {
            **self._slots,
            "name": _text_list("name", [*names, *sure, *said_otherwise([*names, *sure], self.devices), *guessed]),
        }
        # the words a sentence must hold to command anything here: its names, places, kinds, and the first word of
        # each way to say "everything" (not its "the" and "of")
        everything = str(language_data(self.language).get("expansion_rules", {}).get("everything", ""))
        firsts = [alternative.split()[0] for alternative in everything.strip("()").split("|") if alternative.split()]
        said = [*(n for n, _, _ in names), *areas, *floors, *(p for p, *_ in parts), *firsts]
        self._vocabulary = kinds | {w for text in said if text for w in _words(str(text))}
        # the ways to say "everything", whole ("it all", not "it"): a clause beside a request that says one of them
        # asks for more than that request
        rule = parse_sentence(everything) if everything else None
        forms = sample_sentence(rule, {}, {}, self.language) if rule is not None else []
        self._everything = {" ".join(form.casefold().split()) for form in forms if form.strip()}
        self._naming = kinds | {w for text in said[: len(said) - len(firsts)] if text for w in _words(str(text))}
        self.answers = AnswerGrammar(self.intents, self._slots, self.language)  # to a question back
        self._not_now = not_now_for(self.language)
        # the words that say a value ("on", "closed", "locked"): a sentence of nothing else says no verb
        forms = language_data(self.language).get("value_forms", {})
        self._value_words = {w for form in forms.values() for w in _words(str(form))}
        self._pronouns = {str(w).casefold() for w in language_data(self.language).get("pronouns", [])}

    # ---- commands, questions, later ----------------------------------------------------------------------------

    def read(self, text: str) -> Reading:
        """What ``text`` asks: the best strict reading of the whole sentence; else, unless it is in a shape of "not
        now", the one clause of it that asks something beside its reasons, or the best reading after dropping a few
        words at its ends (a guess: an ``Act`` that is not ``certain``); else ``NoMatch``."""
        reading = self._best(self._results(text), text)
        if not isinstance(reading, NoMatch):
            return reading
        if not _words(text) & self._vocabulary:
            return NoMatch()  # names nothing of this home: no part of it can command it (and the search is slow)
        shapes = self._not_now_shapes(text)
        if any(shape.intent.name == NEVER_SHAPE for shape in shapes):
            return NoMatch()  # a negation, words taken back, someone else's words: the model answers
        reading = self._request_in(text) or self._guess(text)
        if shapes:  # a condition or a later time: said as not done now when a command is in it
            parts = {str(e.value).strip() for shape in shapes for e in shape.entities_list if e.is_wildcard}
            commands = [part for part in parts if isinstance(self._best(self._results(part), part), Act)]
            return Later(text) if isinstance(reading, Act) or commands else NoMatch()
        return reading

    def _not_now_shapes(self, text: str) -> list[RecognizeResult]:
        """The shapes of "not now" the words are in, read without the words around a request that ask nothing
        ("mind if we turn the fan on" is no condition), and only where each part the shape leaves open is whole
        words (the matcher would find the "till" of "still")."""
        if self._not_now is None:
            return []
        said = remove_skip_words(text, self.intents.skip_words, self.intents.settings.ignore_whitespace)
        words = set(_words(said))
        return [
            shape
            for shape in recognize_all(said, self._not_now, language=self.language)
            if all(_words(str(e.value)) <= words for e in shape.entities_list if e.is_wildcard)
        ]

    def _guess(self, text: str) -> Act | AskState | NoMatch:
        """The best reading after dropping a few words at the ends, of a clause, or with a name said in part."""
        for shorter, slots in [(text, self._partial_slots), *((t, self._slots) for t in _trimmed(text, FUZZY_WORDS))]:
            guess = self._best(self._results(shorter, slots), shorter)
            if isinstance(guess, Act):
                return Act(guess.commands, certain=False, intent=guess.intent)
            if isinstance(guess, AskState):
                return guess
        return NoMatch()

    def _request_in(self, text: str) -> Act | AskState | None:
        """A sure reading of the words said another way round: a name said first and then the request with a
        pronoun for it ("the velux, open it 75 percent"), or a request beside its reasons (``_with_reason``)."""
        for said in dict.fromkeys([text, self._undislocated(text)]):
            if said != text:
                whole = self._best(self._results(said), said)
                if isinstance(whole, AskState) or (isinstance(whole, Act) and whole.certain):
                    return whole
            if (clause := self._with_reason(said)) is not None:
                return clause
        return None

    def _undislocated(self, text: str) -> str:
        """The words with a clause that says nothing but a name put in place of the pronoun of the clause after it
        ("the bunk bed light, flick it on" -> "flick the bunk bed light on"); else the words as they are."""
        clauses = _clauses(text)
        for i in range(len(clauses) - 1):
            name, rest = clauses[i], clauses[i + 1]
            pronoun = next((w for w in rest.split() if w.casefold() in self._pronouns), None)
            if pronoun is None or not self._says_a_name(name):
                continue
            merged = re.sub(rf"\b{re.escape(pronoun)}\b", name, rest, count=1)
            return ", ".join([*clauses[:i], merged, *clauses[i + 2 :]])
        return text

    def _says_a_name(self, clause: str) -> bool:
        """The clause says a device's name and nothing else ("the roller shutter", "ok so the velux")."""
        slots = {**self.intents.slot_lists, **self._slots}
        rules, skip = self.intents.expansion_rules, self.intents.skip_words
        return bool(is_match(clause, _NAME_ALONE, slots, rules, skip, language=self.language))

    def _with_reason(self, text: str) -> Act | AskState | None:
        """A whole request said in one clause, beside clauses that name nothing of this home and ask nothing ("switch
        the porch light on, the kids are coming home", "I'm off to bed, lights off upstairs"): read as that clause
        alone. A clause that is a question, or names a device, place or kind, leaves the sentence to the guesses."""
        clauses = [c.strip() for c in re.findall(r"[^,;:.!?]+[,;:.!?]*", text) if c.strip(" ,;:.!?")]
        naming = [c for c in clauses if _words(c) & self._naming or self._says_everything(c)]
        others = [c for c in clauses if c is not naming[0]] if len(naming) == 1 else []
        # a question beside it is not a reason; a number beside it may be a time or a value ("at 8, open the blinds")
        if len(clauses) < 2 or not others or any(c.endswith("?") or re.search(r"\d", c) for c in others):
            return None
        clause = naming[0].rstrip(",;:.!? ")
        reading = self._best(self._results(clause), clause)
        if isinstance(reading, AskState) or (isinstance(reading, Act) and reading.certain):
            return reading
        return None

    def _says_everything(self, clause: str) -> bool:
        words = " ".join(re.findall(r"[^\W_]+", clause.casefold()))
        words = f" {words} "
        return any(f" {form} " in words for form in self._everything)

    def _results(self, text: str, slots: dict[str, SlotList] | None = None) -> list[RecognizeResult]:
        context = {"area": {"value": self.here, "text": self.here}} if self.here else None
        slots = self._slots if slots is None else slots
        found = recognize_all(text, self.intents, slot_lists=slots, intent_context=context, language=self.language)
        return [r for r in found if r.intent.name not in ANSWER_INTENTS]

    def _best(self, results: list[RecognizeResult], text: str) -> Reading:
        """The reading of the best result, as Home Assistant ranks them: a device named by name before an area or a
        kind ("the kitchen light" is that light, not every light in the kitchen), then more literal words matched."""
        readings = [(self._rank(r), self._reading(r, text)) for r in results]
        readings = [(rank, reading) for rank, reading in readings if not isinstance(reading, NoMatch)]
        if not readings:
            return NoMatch()
        return min(readings, key=lambda pair: pair[0])[1]

    @staticmethod
    def _rank(result: RecognizeResult) -> tuple[int, int, int]:
        wildcards = sum(1 for e in result.entities_list if e.is_wildcard)
        return ("name" not in result.entities, wildcards, -result.text_chunks_matched)

    def _terse(self, result: RecognizeResult, text: str) -> bool:
        """The words match their sentence with its optional verbs left out and need none ("[<turn>] [<the>] {name}
        [to] off" read "Our garden lights off."): a recogniser that lost a question's first word ("are our garden
        lights off") gives just that, so heard words of this shape are asked back (typed ones are taken as written)."""
        if (result.intent_metadata or {}).get("terse"):
            return True  # our sentence data marks its forms without a verb ("all the lights off upstairs")
        template = (result.intent_sentence.text if result.intent_sentence is not None else None) or ""
        optional = re.findall(r"\[<(?!the>)([^>\]]*)>\]", template)
        bare = re.sub(r"\[<(?!the>)[^>\]]*>\]", "", template)  # the optional rule references, <the> kept
        needed = re.sub(r"\[[^\]]*\]", "", bare)
        if any(not self._names_things(rule) for rule in re.findall(r"<([^>]*)>", needed)):
            return False  # a verb it cannot do without: "<turn> off [<the>] {name}"
        verb_left_out = any(not self._names_things(rule) for rule in optional)
        if not verb_left_out and _words(re.sub(r"<[^>]*>|\{[^}]*\}", " ", needed)) - self._value_words:
            return False  # a word of its own that says no value: a verb ("raise [<the>] {name}")
        slots = {**self.intents.slot_lists, **self._slots}
        return bool(
            is_match(
                text,
                parse_sentence(bare),
                slots,
                self.intents.expansion_rules,
                self.intents.skip_words,
                language=self.language,
            )
        )

    def _names_things(self, rule: str) -> bool:
        """A rule of the sentence data that says which devices or where, never what to do: an article, place or
        quantity (``PLACE_RULES``), or one whose words all say a kind of device (<light>: "light", "lamps")."""
        if rule in PLACE_RULES:
            return True
        said = str(language_data(self.language).get("expansion_rules", {}).get(rule, ""))
        words = _words(re.sub(r"<[^>]*>|\{[^}]*\}|\[s\]", " ", said))
        return bool(words) and words <= kind_words(self.language)

    def _reading(self, result: RecognizeResult, text: str) -> Reading:
        intent, slots = result.intent.name, {k: e.value for k, e in result.entities.items()}
        if intent == LATER_INTENT:
            command = slots.get("conversation_command")
            return Later(str(command)) if command else NoMatch()
        targets = self._targets(slots)
        if not targets:
            return NoMatch()
        if intent in STATE_INTENTS:
            state = slots.get("state")
            return AskState(tuple(targets), str(state) if state else None, result.response or "one")
        commands = [c for d in targets if (c := self._command(intent, slots, d)) is not None]
        if commands:
            return Act(tuple(commands), certain=not _bare(result), intent=intent, terse=self._terse(result, text))
        return CannotDo(tuple(targets), intent) if intent in DEEDS or intent in NUMBERS else NoMatch()

    def _targets(self, slots: dict[str, Any]) -> list[HomeDevice]:
        """The devices a match's slots select: the one named, or those of the area/floor/domain/class named."""
        if not slots.keys() & {"name", "area", "floor", "domain", "device_class", "everything"}:
            return []
        chosen = list(self.devices)
        if "name" in slots:  # and a second name: "the kitchen light and the hallway light"
            named = [slots[key] for key in ("name", "name_2") if isinstance(slots.get(key), int)]
            chosen = [self.devices[i] for i in named]
        if "area" in slots:
            chosen = [d for d in chosen if d.area == slots["area"]]
        if "floor" in slots:
            chosen = [d for d in chosen if d.floor == slots["floor"]]
        if slots.get("everything"):  # "everything" is each device of the domains off and on are safe for
            chosen = [d for d in chosen if d.domain in slots.get("domain", ())]
        elif "domain" in slots and "name" not in slots:
            domains = slots["domain"] if isinstance(slots["domain"], list) else [slots["domain"]]
            chosen = [d for d in chosen if d.domain in domains]
        if "device_class" in slots and "name" not in slots:  # and a second: "the blinds and the curtains"
            classes = {slots[key] for key in ("device_class", "device_class_2") if key in slots}
            chosen = [d for d in chosen if d.device_class in classes]
        return chosen

    def _command(self, intent: str, slots: dict[str, Any], device: HomeDevice) -> Command | None:
        if intent in DEEDS:
            by_domain = DEEDS[intent]
            return _first(device, by_domain.get(device.domain, by_domain.get(None, ())))
        if (slot := NUMBERS.get(intent)) is None or not isinstance(number := slots.get(slot), int | float):
            return None
        value = round(number)
        if value != number:
            return None
        if (exact := _first(device, (str(value),))) is not None:
            return exact
        return _first(device, _ENDS[value].get(device.domain, ())) if value in _ENDS else None


_NAME_ALONE = parse_sentence("[<the>] {name}")


def _bare(result: RecognizeResult) -> bool:
    """The sentence that matched says nothing but the slots ("[<the>] {name}": "Kitchen light, please."): Home
    Assistant turns the device on, but the words may be a fragment of anything, so it is only a guess."""
    template = (result.intent_sentence.text if result.intent_sentence is not None else None) or ""
    return not re.sub(r"\[[^\]]*\]|\{[^}]*\}|<the>|[^\w<>]", "", template)


def _first(device: HomeDevice, spellings: Sequence[str]) -> Command | None:
    """The command of the first spelling the device allows (any case), in the allow-list's own spelling."""
    by_case = {p.casefold(): p for p in device.payloads}
    for spelling in spellings:
        if (payload := by_case.get(spelling.casefold())) is not None:
            return Command(device, payload)
    return None


def _trimmed(text: str, most: int) -> list[str]:
    """``text`` with up to ``most`` words dropped from its ends, and never more than a third of them, fewest first
    (the end before the start): what is left must still be most of what was said; then each of its clauses alone
    and so trimmed, the first first (a command said before or after its reason: "switch it on, the kids are home",
    "I'm done in here, you can turn the fan off"), and two clauses the other way round ("the fan, switch it on")."""
    clauses = _clauses(text)
    if len(clauses) < 2:
        return _shortened(text, most)
    swapped = [f"{clauses[1]} {clauses[0]}"] if len(clauses) == 2 else []
    return [*_shortened(text, most), *(t for c in clauses for t in (c, *_shortened(c, most))), *swapped]


def _clauses(text: str) -> list[str]:
    """The parts of the words between punctuation marks, each stripped."""
    return [c.strip() for c in re.split(r"[,;:.!?]", text) if c.strip()]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[^\W_]+", text.casefold()))


def _shortened(text: str, most: int) -> list[str]:
    words = text.split()
    out = []
    for dropped in range(1, min(most, len(words) // 3) + 1):
        for front in range(dropped + 1):
            back = dropped - front
            out.append(" ".join(words[front : len(words) - back]))
    return out
