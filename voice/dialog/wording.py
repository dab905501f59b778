"""Words as the home compares them: case, plurals and apostrophes folded (``words``), and how alike two spellings
are, for a device name the recogniser heard wrong (``sounds_like``, ``said_as``). What the words *ask* is read by
Home Assistant's matcher (voice/dialog/understanding.py), not here.
"""

from __future__ import annotations

import difflib
import functools
import re

_TOKEN = re.compile(r"[a-z0-9]+")
# ``sounds_like``: how alike a misheard name must be (difflib's ratio), and how much more than any other device.
_LIKE, _LIKE_MARGIN = 0.75, 0.05
# ``said_as``: the spans of heard words worth scoring as a device's name, those spelled at least this like it, the
# best few per name (the recogniser scores each against the audio: voice/dialog/rehearing.py).
_SPELLED_LIKE, _SAID_AS = 0.5, 3
_SPOKEN_TOKEN = re.compile(r"[A-Za-z0-9'\u2019]+")  # a word as Whisper writes it, case and apostrophes kept


def words(text: str) -> list[str]:
    """Lower-case words without plural s ("lights" -> "light"), apostrophes dropped ("what's" -> "whats")."""
    return [_singular(w) for w in _TOKEN.findall(text.casefold().replace("'", "").replace("\u2019", ""))]


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


@functools.lru_cache(maxsize=32)  # a turn asks for the same words several times
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
