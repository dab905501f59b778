"""Turn a stream of text pieces (LLM tokens) into speakable fragments for TTS.

Piper speaks a whole fragment or nothing, so the first fragment should be short (sound starts sooner) and
later ones natural (better prosody). Rules, applied to the text seen so far, so the result does not depend
on how the stream was split into pieces:
  - a boundary is punctuation followed by whitespace (closing quotes/brackets stay with their sentence); a
    boundary is only decided once the next character is seen, so "3.14", "1,000" and "e.g." are never split;
    a period after a known abbreviation or a single letter ("Dr.", "e.g.", "J.") is not a boundary;
    a line break is a sentence end;
  - the first fragment ends at the first boundary of any kind (. ! ? ; : ,) once it has
    ``first_fragment_chars`` characters, or, when punctuation is slow to come, at the space after its
    ``first_fragment_words``-th word (never right after a word with a digit: "21 | million" stays whole);
  - later fragments end at sentence ends (. ! ? ; :) once they have ``first_fragment_chars`` characters, and at
    commas once they have ``clause_words`` words;
  - any fragment is cut at a word boundary once it reaches ``max_fragment_words`` words.
Fragments are stripped of surrounding whitespace; joined with spaces they give back every word of the input.
"""

from __future__ import annotations

from typing import Any

ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc", "e.g", "i.e", "eg", "ie", "approx",
    "fig", "inc", "ltd", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct",
    "nov", "dec", "tue", "thu", "fri", "a.m", "p.m", "u.s", "u.k",
}
_SENTENCE = ".!?;:"
_CLOSERS = "\"')]}’”»"


class Chunker:
    """Feed text with ``push``; it returns the fragments that are complete; ``flush`` returns the rest."""

    def __init__(self, first_fragment_chars: int = 12, max_fragment_words: int = 30, clause_words: int = 8,
                 first_fragment_words: int = 0) -> None:
        self.first_chars = first_fragment_chars
        self.first_words = first_fragment_words  # 0: the first fragment waits for punctuation
        self.max_words = max_fragment_words
        self.clause_words = clause_words
        self._buf = ""  # text not yet emitted
        self.fragments_out = 0

    @classmethod
    def from_config(cls, tts: Any) -> Chunker:
        """The chunker the ``[tts]`` config section describes (the one every spoken path uses)."""
        return cls(tts.first_fragment_chars, tts.max_fragment_words, first_fragment_words=tts.first_fragment_words)

    def push(self, text: str) -> list[str]:
        self._buf += text
        out = []
        while (cut := self._next_cut()) is not None:
            fragment, self._buf = self._buf[:cut].strip(), self._buf[cut:]
            if fragment:
                out.append(fragment)
                self.fragments_out += 1
        return out

    def flush(self) -> list[str]:
        """End of the stream: whatever is left is the last fragment."""
        rest, self._buf = self._buf.strip(), ""
        self.fragments_out = 0
        return [rest] if rest else []

    def _next_cut(self) -> int | None:
        """Index just past the first boundary in the buffer where a fragment should end, or None."""
        buf = self._buf
        lead = len(buf) - len(buf.lstrip())
        words = 0
        in_word = False
        word_start = lead
        for i in range(lead, len(buf) - 1):  # the last character has no lookahead yet
            c = buf[i]
            if not c.isspace():
                if not in_word:
                    word_start = i
                in_word = True
            elif in_word:
                in_word = False
                words += 1
                if words >= self.max_words:
                    return i
                if (self.fragments_out == 0 and self.first_words and words >= self.first_words
                        and i - lead >= self.first_chars and not buf[i + 1].isspace()
                        and not any(ch.isdigit() for ch in buf[word_start:i])):
                    return i
            if c == "\n":
                return i + 1
            if c not in _SENTENCE + ",":
                continue
            end = i + 1
            while end < len(buf) and buf[end] in _CLOSERS:
                end += 1
            if end >= len(buf):
                return None  # need to see what follows the closers
            if not buf[end].isspace():
                continue
            if c == "." and self._abbreviation(buf, i):
                continue
            length = len(buf[lead:end].strip())
            first = self.fragments_out == 0
            if first and length >= self.first_chars:
                return end
            if not first and c in _SENTENCE and length >= self.first_chars:
                return end
            if not first and c == "," and words + 1 >= self.clause_words:
                return end
        return None

    @staticmethod
    def _abbreviation(buf: str, dot: int) -> bool:
        start = dot
        while start > 0 and not buf[start - 1].isspace() and buf[start - 1] not in "(\"'":
            start -= 1
        word = buf[start:dot].lower()
        return word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())
