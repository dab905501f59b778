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
  - any fragment is cut at a word boundary once it reaches ``max_fragment_words`` words, and once it reaches
    ``max_fragment_chars`` characters (at its last space; inside a "word" only when it has none): piper's memory
    grows with the length of what it is given (40 KB of text without a space took 19 GB).
Fragments are stripped of surrounding whitespace; joined with spaces they give back every word of the input
(a "word" longer than ``max_fragment_chars`` is split).

Cost is linear in the text however it arrives (a client may stream it one character at a time): the scan resumes
where the last push left it undecided instead of starting again from the front of the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ABBREVIATIONS = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "prof",
    "sr",
    "jr",
    "st",
    "mt",
    "vs",
    "etc",
    "e.g",
    "i.e",
    "eg",
    "ie",
    "approx",
    "fig",
    "inc",
    "ltd",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "tue",
    "thu",
    "fri",
    "a.m",
    "p.m",
    "u.s",
    "u.k",
}
_SENTENCE = ".!?;:"
_BOUNDARY = _SENTENCE + ","
_CLOSERS = "\"')]}’”»"


@dataclass(frozen=True)
class _Scan:
    """Where a scan stopped undecided: the next index to look at and the word state just before it."""

    at: int
    lead: int
    words: int
    in_word: bool
    word_start: int
    space: int

    def shifted(self, by: int) -> _Scan:
        return _Scan(
            self.at + by,
            self.lead + by,
            self.words,
            self.in_word,
            self.word_start + by,
            self.space + by if self.space >= 0 else -1,
        )


class Chunker:
    """Feed text with ``push``; it returns the fragments that are complete; ``flush`` returns the rest."""

    def __init__(
        self,
        first_fragment_chars: int = 12,
        max_fragment_words: int = 30,
        clause_words: int = 8,
        first_fragment_words: int = 0,
        max_fragment_chars: int = 250,
    ) -> None:
        self.first_chars = first_fragment_chars
        self.first_words = first_fragment_words  # 0: the first fragment waits for punctuation
        self.max_words = max_fragment_words
        self.max_chars = max(max_fragment_chars, first_fragment_chars + 1)
        self.clause_words = clause_words
        self._buf = ""  # text not yet emitted
        self._scan: _Scan | None = None  # how far the buffer was scanned without finding a cut
        self.fragments_out = 0

    @classmethod
    def from_config(cls, tts: Any) -> Chunker:
        """The chunker the ``[tts]`` config section describes (the one every spoken path uses)."""
        return cls(tts.first_fragment_chars, tts.max_fragment_words, first_fragment_words=tts.first_fragment_words)

    def push(self, text: str) -> list[str]:
        buf = self._buf + text
        out = []
        base = 0  # start of the text not yet emitted: cut by offsets, copied once at the end (linear)
        while (cut := self._next_cut(buf, base)) is not None:
            fragment, base = buf[base:cut].strip(), cut
            self._scan = None
            if fragment:
                out.append(fragment)
                self.fragments_out += 1
        if self._scan is None:
            self._buf = ""  # nothing but whitespace left, which no fragment starts with
        else:
            self._buf, self._scan = buf[base:], self._scan.shifted(-base)
        return out

    def flush(self) -> list[str]:
        """End of the stream: whatever is left is the last fragment."""
        rest, self._buf, self._scan = self._buf.strip(), "", None
        self.fragments_out = 0
        return [rest] if rest else []

    def _next_cut(self, buf: str, base: int) -> int | None:
        """Index just past the first boundary after ``base`` where a fragment should end, or None (then
        ``self._scan`` remembers where the decision is still open, for the next push)."""
        scan = self._scan
        if scan is None:
            lead = base
            while lead < len(buf) and buf[lead].isspace():
                lead += 1
            if lead >= len(buf):
                return None  # only whitespace so far: nothing to scan from
            scan = _Scan(lead, lead, 0, False, lead, -1)
        lead, words, in_word, word_start, last_space = scan.lead, scan.words, scan.in_word, scan.word_start, scan.space
        i = scan.at
        while i < len(buf) - 1:  # the last character has no lookahead yet
            c = buf[i]
            if i - lead + 1 >= self.max_chars:  # too long for piper: cut at the last space, else right here
                return last_space if last_space > lead else i + 1
            if not c.isspace():
                if not in_word:
                    word_start = i
                in_word = True
            else:
                last_space = i
                if in_word:
                    in_word = False
                    words += 1
                    if words >= self.max_words:
                        return i
                    if (
                        self.fragments_out == 0
                        and self.first_words
                        and words >= self.first_words
                        and i - lead >= self.first_chars
                        and not buf[i + 1].isspace()
                        and not any(ch.isdigit() for ch in buf[word_start:i])
                    ):
                        return i
            if c == "\n":
                return i + 1
            if c in _BOUNDARY:
                end = i + 1
                while end < len(buf) and buf[end] in _CLOSERS and end - lead < self.max_chars:
                    end += 1
                if end >= len(buf):  # need to see what follows the closers: decide at the next push, from here
                    # (looking at this character again leaves the word state as it is now)
                    self._scan = _Scan(i, lead, words, in_word, word_start, last_space)
                    return None
                if buf[end].isspace() and not (c == "." and self._abbreviation(buf, i, lead)):
                    length = end - lead  # buf[lead] and buf[end - 1] are not whitespace
                    first = self.fragments_out == 0
                    if first and length >= self.first_chars:
                        return end
                    if not first and c in _SENTENCE and length >= self.first_chars:
                        return end
                    if not first and c == "," and words + 1 >= self.clause_words:
                        return end
            i += 1
        self._scan = _Scan(i, lead, words, in_word, word_start, last_space)
        return None

    @staticmethod
    def _abbreviation(buf: str, dot: int, lead: int = 0) -> bool:
        start = dot
        while start > lead and not buf[start - 1].isspace() and buf[start - 1] not in "(\"'":
            start -= 1
        word = buf[start:dot].lower()
        return word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())
