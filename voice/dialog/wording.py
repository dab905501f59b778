"""How a user's words ask for things: the words of Home Assistant's sentences that ask for a value, a deed or
a state, and the rules that read them (voice/dialog/home.py applies them to the home's devices).

Words, not a model, because the embedded model is a small coding model: these decide whether a reply may act at
all. Whisper's text comes in as it was heard; ``words`` makes it comparable (case, plurals, apostrophes).
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Sequence

# A sentence that opens with one of these asks something; one that opens with a request ("can you", "please",
# "turn") asks for a deed. "can"/"could"/"would" are requests in speech ("can you turn off the fan").
_QUESTION_OPENERS = frozenset(
    {"is", "are", "was", "were", "what", "whats", "which", "does", "do", "did", "has", "have", "how", "where"}
)
_STATE_WORDS = frozenset({"status", "state"})
_TOKEN = re.compile(r"[a-z0-9]+")
# The words that ask for a common value, as Home Assistant's sentences say them ("lower the blind", "deactivate the
# fan", "light up the lamp"); any other value ("50", "heat") is asked for by its own words. All 270 commands of
# configs/home_cases.json hold one for their value.
VALUE_WORDS = {
    "on": frozenset({"on", "activate", "enable", "start", "up"}),
    "off": frozenset({"off", "deactivate", "disable", "stop"}),
    "open": frozenset({"open", "raise", "lift", "up"}),
    "close": frozenset({"close", "closed", "shut", "lower", "down"}),
    "lock": frozenset({"lock", "locked"}),
    "unlock": frozenset({"unlock", "unlocked"}),
}
_ANY_VALUE_WORD = frozenset().union(*VALUE_WORDS.values())
YES_WORDS = frozenset({"yes", "yeah", "yep", "sure", "ok", "okay", "correct", "right"})
# Words that make a sentence a request (Home Assistant's command verbs, and asking politely); measured, 8 of the
# 270 commands of configs/home_cases.json hold none ("sprinkler on", "my tv socket to off").
REQUEST_WORDS = frozenset(
    {"turn", "switch", "set", "put", "make", "change", "bring", "activate", "deactivate", "enable", "disable"}
    | {"start", "stop", "open", "close", "shut", "lower", "raise", "lift", "lock", "unlock", "dim", "brighten"}
    | {"increase", "decrease", "reduce", "please", "can", "could", "would", "will", "want", "need", "let"}
)
# Particles that ask for a value only when no other word asks for one of the device's values: Home Assistant's
# "(close|shut|lower) [(up|down)]" says "lower up the garage door" for CLOSE, and "turn up the lamp to 50%" is 50.
WEAK_VALUE_WORDS = frozenset({"up", "down"})
# Words that make a command conditional, later or not wanted: the model reads those (``Home.opening``).
HEDGES = frozenset({"not", "dont", "never", "if", "when", "after", "before", "until", "later", "tomorrow", "tonight"})
PLACE_WORDS = frozenset({"the", "my", "our", "your", "a"})  # "on" before one is a place: "light on my bedroom"
# ``sounds_like``: how alike a misheard name must be (difflib's ratio), and how much more than any other device.
_LIKE, _LIKE_MARGIN = 0.75, 0.05
# ``said_as``: the spans of heard words worth scoring as a device's name, those spelled at least this like it, the
# best few per name. Measured on 150 spoken transcripts that named no device: every name the audio chose in the
# end ("memory light" for the bedroom light, ratio 0.56) is among them, at 12 spans per transcript (mean).
_SPELLED_LIKE, _SAID_AS = 0.5, 3
_SPOKEN_TOKEN = re.compile(r"[A-Za-z0-9'\u2019]+")  # a word as Whisper writes it, case and apostrophes kept


def words(text: str) -> list[str]:
    """Lower-case words without plural s ("lights" -> "light"), apostrophes dropped ("what's" -> "whats")."""
    return [_singular(w) for w in _TOKEN.findall(text.casefold().replace("'", "").replace("\u2019", ""))]


def plurals(text: str) -> set[str]:
    """The words said in the plural, in their singular form ("turn off the lights" -> {"light"})."""
    raw = _TOKEN.findall(text.casefold().replace("'", "").replace("\u2019", ""))
    return {_singular(w) for w in raw if _singular(w) != w}


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def asks_for(value: str, heard: set[str], strong: bool = False) -> bool:
    """The words ask for this value of a device: a word of VALUE_WORDS for it, else the value's own words.
    ``strong``: only by a word that is not one of WEAK_VALUE_WORDS."""
    cues = VALUE_WORDS.get(value.casefold())
    if cues is None:
        return bool(own := set(words(value))) and own <= heard
    return bool((cues - WEAK_VALUE_WORDS if strong else cues) & heard)


def asked_values(payloads: Iterable[str], said: Sequence[str]) -> list[str]:
    """The device's values the words (in order) ask for: those a strong word asks for ("lower" in "lower up the
    blind"), or, when there is none, those a weak one does ("light up the lamp"). Where they ask for more, an "on"
    before "the"/"my" and after no request verb is a place ("switch off the light on my bedroom": OFF), and a
    number is a brightness, which "on" does not contradict ("set brightness on kitchen light 50": 50), as Home
    Assistant's sentences say them."""
    payloads, heard = list(payloads), set(said) | _either_activate(said)
    found = [p for p in payloads if asks_for(p, heard, strong=True)] or [p for p in payloads if asks_for(p, heard)]
    places = _places(said)
    if len(found) > 1 and places and all(places):
        found = asked_values(payloads, [w for w in said if w != "on"]) or found
    if len(found) > 1 and any(p.isdigit() for p in found):
        found = [p for p in found if p.casefold() != "on"]
    return found


def _places(said: Sequence[str]) -> list[bool]:
    """For each "on" of the words: is it a place ("the lamp on the hallway"), not a value? Before "the"/"my"/...
    and after no request verb ("turn on the lamp": a verb's "on" is a value)."""
    around = zip(["", *said[:-1]], said, [*said[1:], ""], strict=True)
    return [nxt in PLACE_WORDS and before not in REQUEST_WORDS for before, w, nxt in around if w == "on"]


def _either_activate(said: Sequence[str]) -> set[str]:
    """tiny.en hears an American "deactivate" as "The activate" (every run of `bench home`, switching the device
    ON): an "activate" after "the" or "de" may be either word, so it asks for both values (asked back, spoken)."""
    pairs = zip(["", *said[:-1]], said, strict=True)
    return {"deactivate"} if any(w == "activate" and before in ("the", "de", "d") for before, w in pairs) else set()


def only_by_a_place(value: str, said: Sequence[str]) -> bool:
    """The words ask for ``value`` only by an "on" that reads as a place: "Turn the Hallway light lamp on the
    Hallway door." (heard for "... on the hallway to off") asks for ON by no word the user meant as a value."""
    places = _places(said)
    if value.casefold() != "on" or not places or not all(places):
        return False
    return not asks_for(value, {w for w in said if w != "on"} | _either_activate(said))


@functools.lru_cache(maxsize=32)  # a turn asks for the same words several times (``Home.hear``): ~10 ms for 30 words
def sounds_like(said: tuple[str, ...], names: tuple[str, ...]) -> int | None:
    """The index of the name some of the words are spelled most like, as Whisper mishears a name ("garbage door",
    "Tb socket", "best lamp" for the desk lamp): clearly the closest (``_LIKE``, ``_LIKE_MARGIN``), the span at most
    two letters shorter than the name and, for a name of several words, ending in a word like its last ("the
    living room in" is no "living room curtains"). None when no name is that close."""

    def likeness(spelled: str) -> float:
        name = words(spelled)
        whole, best = "".join(name), 0.0
        for n in range(1, len(name) + 3):
            for span in (said[i : i + n] for i in range(len(said) - n + 1)):
                if len("".join(span)) < len(whole) - 2 or (len(name) > 1 and _ratio(span[-1], name[-1]) < 0.6):
                    continue
                best = max(best, _ratio("".join(span), whole))
        return best

    ranked = sorted(((likeness(name), i) for i, name in enumerate(names)), key=lambda pair: -pair[0])
    if not ranked or ranked[0][0] < _LIKE or (len(ranked) > 1 and ranked[0][0] - ranked[1][0] < _LIKE_MARGIN):
        return None
    return ranked[0][1]


def said_as(text: str, name: str) -> list[str]:
    """``text`` with one span of its words said as ``name`` instead: the ``_SAID_AS`` spans spelled most like it
    ("Set the memory light 50" -> "Set the bedroom light 50"), for the recogniser to score against the audio
    (voice/dialog/rehearing.py). A span whose words are all the name's is left: "hallway" -> "hallway light"
    would only add words no one said."""
    name_words = words(name)
    whole, tokens = "".join(name_words), list(_SPOKEN_TOKEN.finditer(text))
    spans = []
    for n in range(1, len(name_words) + 2):
        for i in range(len(tokens) - n + 1):
            span = words(" ".join(t.group() for t in tokens[i : i + n]))
            if not set(span) <= set(name_words) and (ratio := _ratio("".join(span), whole)) >= _SPELLED_LIKE:
                spans.append((ratio, tokens[i].start(), tokens[i + n - 1].end()))
    best = sorted(spans, key=lambda span: -span[0])[:_SAID_AS]
    return [text[:start] + name + text[end:] for _, start, end in best]


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def requests(text: str, device: str, payloads: Iterable[str]) -> bool:
    """The words ask for a deed on the device named ``device`` with a word of REQUEST_WORDS ("turn", "please",
    "can"), or "light up": a heard command without one ("Or our bedside lamp off.") may be a question that lost
    its first word. A word that is also a value ("open", "lower") requests only before the device's name and only
    a value the device has: "open the curtains", but not "It's my living room curtains open." nor "Add the lower
    office light off." (measured: "is my ... curtains open" and "are there our office light off" heard so)."""
    said, name = words(text), words(device)
    at = next((i for i in range(len(said)) if said[i : i + len(name)] == name), len(said))
    own = frozenset().union(*(VALUE_WORDS.get(p.casefold(), frozenset()) for p in payloads))
    asked = any(w in REQUEST_WORDS and (w not in _ANY_VALUE_WORD or (i < at and w in own)) for i, w in enumerate(said))
    return asked or "light up" in " ".join(said)


def asks_state(text: str) -> bool:
    """The words ask how things are ("is the garage door open", "which lights are on"), not for a change."""
    w = words(text)
    return bool(w) and (w[0] in _QUESTION_OPENERS or bool(_STATE_WORDS & set(w)))
