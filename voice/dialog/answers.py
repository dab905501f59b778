"""The short answers to the assistant's question back ("Do you want the reading light on?"): yes, no, or the value
wanted ("switch it on", "50 percent please"), read by Home Assistant's matcher over our answer sentences
(voice/dialog/sentences/), and sampled from them for the recogniser to score against what was said
(voice/dialog/rehearing.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hassil import recognize_all
from hassil.intents import Intents, SlotList, TextSlotList, TextSlotValue
from hassil.parse_expression import parse_sentence
from hassil.sample import sample_sentence
from unicode_rbnf import RbnfEngine

from voice.dialog.sentence_data import language_data

YES, NO, VALUE = "SpecvoiceYes", "SpecvoiceNo", "SpecvoiceValue"  # the answers' intents (our sentences)
ANSWER_INTENTS = (YES, NO, VALUE)


@dataclass(frozen=True)
class Answer:
    """A short answer to the assistant's question back: ``yes``, ``no``, or the ``value`` wanted."""

    yes: bool
    value: str | None = None


@dataclass
class AnswerGrammar:
    """The answer sentences of ``intents``, with the home's slot lists (``slots``: names, areas, floors); the
    values an answer may name are the question's, given to each call."""

    intents: Intents
    slots: dict[str, SlotList]
    language: str = "en"
    _numbers: RbnfEngine = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._numbers = RbnfEngine.for_language(self.language.split("_")[0].split("-")[0])

    def read(self, text: str, values: Sequence[str]) -> Answer | None:
        """``text`` as an answer to a question back that offered ``values`` (payloads of one device): yes, no, or
        one of the values ("switch it on", "50 percent please"); None when it is no such answer."""
        slots = {**self.slots, "value": self._value_slot(values)}
        found = recognize_all(text, self.intents, slot_lists=slots, language=self.language)
        for result in sorted(found, key=lambda r: -r.text_chunks_matched):
            if result.intent.name == YES:
                return Answer(True)
            if result.intent.name == NO:
                return Answer(False)
            if result.intent.name == VALUE and "value" in result.entities:
                return Answer(True, str(result.entities["value"].value))
        return None

    def value_forms(self, payload: str) -> list[str]:
        """How a payload is said: its own word, the state word Home Assistant's lists have for it ("closed" for
        CLOSE, "locked" for LOCK), a number also spelled out and with its unit."""
        if payload.isdigit():
            spelled = self._numbers.format_number(int(payload)).text
            return [f"{n}{unit}" for n in (payload, spelled) for unit in ("", " percent", "%", " degrees")]
        word = payload.casefold()
        return list(dict.fromkeys([word, *self._state_words(word)]))

    def _state_words(self, word: str) -> list[str]:
        """The state words of Home Assistant's lists (cover, lock, on/off states) that begin like ``word``."""
        lists = language_data(self.language).get("lists", {})
        found = []
        for name in ("on_off_states", "cover_states", "lock_states"):
            for value in lists.get(name, {}).get("values", []):
                out = str(value.get("out", ""))
                if out.startswith(word) and len(out) <= len(word) + 2:
                    found.append(out)
        return found

    def sample(
        self,
        values: Sequence[str],
        limit: int = 60,
        intents: Sequence[str] = (YES, NO, VALUE),
        every_polite: bool = False,
    ) -> list[str]:
        """Sentences of the answer grammar (of the answer ``intents``: YES, NO, VALUE) for a question back offering
        ``values``: each answer template at its shortest (its optional words left out, each rule its most common
        word), alone and with the polite word after it ("Turn it on.", "Turn it on, please."): what the recogniser
        scores against the audio when the words it heard answer nothing, or to weigh a yes against the noes
        (voice/dialog/rehearing.py). ``every_polite``: with each short polite word of the grammar instead ("No,
        thanks.", "No, thank you."): a no is weighed against a heard yes, and a yes must not win only because
        the no it was weighed against was said with another polite word."""
        data = language_data(self.language)
        rules = {name: parse_sentence(rule) for name, rule in data.get("sample_rules", {}).items()}
        slots = {**self.slots, "value": self._value_slot(values, forms=1)}
        shortest = [
            " ".join(said.split())
            for name in intents
            for intent_data in self.intents.intents[name].data
            for sentence in intent_data.sentences
            for said in sample_sentence(sentence, slots, rules, self.language, skip_optionals=True)
        ]
        endings = [".", *(f", {word}." for word in self._polite_words(every_polite))]
        found = dict.fromkeys(f"{s.capitalize()}{end}" for s in shortest if s for end in endings)
        return list(found)[:limit]

    def _polite_words(self, every: bool) -> list[str]:
        """The polite word the answers are sampled with (the sample rules'), or every short one of the grammar's
        polite rule (at most two words: "thank you", not "if you could")."""
        data = language_data(self.language)
        if not every:
            return [str(data.get("sample_rules", {}).get("polite", "")).strip("()").split("|")[0]]
        rule = parse_sentence(str(data["expansion_rules"]["polite"]))
        said = sample_sentence(rule, {}, {}, self.language)
        return [w for w in dict.fromkeys(" ".join(s.split()) for s in said) if 0 < len(w.split()) <= 2]

    def _value_slot(self, values: Sequence[str], forms: int | None = None) -> TextSlotList:
        """The values as an answer may say them: their forms (``value_forms``) and, whole, the sentence data's
        other words for them ("stop" for PAUSE)."""
        pairs = [(form, v) for v in values for form in self.value_forms(v)[:forms]]
        if forms is None:
            other = language_data(self.language).get("value_forms", {})
            pairs += [(str(other[v.upper()]), v) for v in values if v.upper() in other]
        values_in = [TextSlotValue.from_tuple(pair) for pair in pairs]
        return TextSlotList(name="value", values=values_in)
