"""The chunker: a short first fragment, sentences after it, numbers and abbreviations intact, and the same
fragments, with nothing lost or duplicated, however the token stream is split."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from voice.speaking.chunker import Chunker

REPLY = (
    "Sure, the kitchen light is on now. It costs 3.14 dollars, about 1,000 yen. Dr. Smith said e.g. the "
    "U.S. office opens at 9 a.m. on Monday! Is that right? Yes: it is."
)


def run(pieces, **kw):
    chunker = Chunker(**kw)
    out = []
    for piece in pieces:
        out += chunker.push(piece)
    return out + chunker.flush()


def tokens(text):
    """Split like an LLM stream: each word with the space that follows it."""
    return re.findall(r"\S+\s*|\s+", text)


def split_at(text, cuts):
    """``text`` in pieces, cut at the given positions (modulo its length)."""
    bounds = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]


def words_of(text):
    return text.split()


def test_first_fragment_comes_at_the_first_comma_once_long_enough():
    chunker = Chunker(first_fragment_chars=12)
    assert chunker.push("Sure, the light") == []  # "Sure," is shorter than 12 characters
    assert chunker.push(" is on, and") == ["Sure, the light is on,"]  # out before the sentence ends


def test_later_fragments_end_at_sentences_not_short_clauses():
    out = run(tokens(REPLY))
    assert out == [
        "Sure, the kitchen light is on now.",
        "It costs 3.14 dollars, about 1,000 yen.",
        "Dr. Smith said e.g. the U.S. office opens at 9 a.m. on Monday!",
        "Is that right?",
        "Yes: it is.",
    ]


def test_numbers_decimals_and_abbreviations_stay_whole_whatever_the_split():
    for pieces in (list(REPLY), tokens(REPLY), [REPLY[:40], REPLY[40:41], REPLY[41:]]):
        out = run(pieces)
        joined = " | ".join(out)
        for intact in ("3.14", "1,000", "Dr. Smith", "e.g. the", "U.S. office", "9 a.m. on"):
            assert intact in joined, (intact, out)


def test_a_sentence_ending_in_a_number_is_still_a_sentence():
    assert run(["It was built in 2024. ", "Then it moved."]) == ["It was built in 2024.", "Then it moved."]


def test_long_text_without_punctuation_is_cut_at_the_word_limit():
    text = " ".join(f"word{i}" for i in range(70))
    out = run([text], max_fragment_words=30)
    assert [len(f.split()) for f in out] == [30, 30, 10]


def test_line_break_ends_a_fragment_and_closing_quotes_stay():
    assert run(['He said "Hello there." and left.\nNext line here']) == [
        'He said "Hello there."',
        "and left.",
        "Next line here",
    ]


def test_flush_returns_the_rest_and_resets_for_the_next_reply():
    chunker = Chunker()
    assert chunker.push("Hello") == []
    assert chunker.flush() == ["Hello"]
    assert chunker.flush() == []
    assert chunker.push("Okay, that is fine, thanks. ") == ["Okay, that is fine,"]  # a first fragment again


alphabet = st.sampled_from(list("abc XYZ019") + [".", ",", "!", "?", ";", ":", "\n", '"', ")", "Dr.", "e.g.", "3.5"])
texts = st.lists(alphabet, max_size=80).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    text=texts,
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=20),
    first=st.integers(min_value=1, max_value=20),
    max_words=st.integers(min_value=4, max_value=12),
    first_words=st.integers(min_value=0, max_value=6),
)
def test_any_split_gives_the_same_fragments_and_keeps_every_word(text, cuts, first, max_words, first_words):
    pieces = split_at(text, cuts)
    kw = dict(first_fragment_chars=first, max_fragment_words=max_words, first_fragment_words=first_words)
    whole = run([text], **kw)
    split = run(pieces, **kw)
    assert split == whole
    assert words_of(" ".join(split)) == words_of(text)  # nothing lost, nothing duplicated, order kept
    assert all(f and f == f.strip() for f in split)
    assert all(len(f.split()) <= max_words for f in split)


def test_first_fragment_needs_no_punctuation_when_words_are_enough():
    got = run(tokens("The capital of France is Paris. It is lovely."), first_fragment_chars=12, first_fragment_words=4)
    assert got == ["The capital of France", "is Paris. It is lovely."]  # a short sentence joins the next


def test_word_cut_of_the_first_fragment_never_follows_a_number():
    got = run(tokens("About 21 million people live there."), first_fragment_chars=5, first_fragment_words=2)
    assert got[0] == "About 21 million"


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(st.sampled_from(list("ab ") + [".", ",", ")", "\n", "e.g."]), max_size=120).map("".join),
    cuts=st.lists(st.integers(min_value=0, max_value=500), max_size=30),
    max_chars=st.integers(min_value=14, max_value=40),
)
def test_character_cap_holds_however_the_text_is_split(text, cuts, max_chars):
    """A client may send text without spaces, one character at a time: fragments stay under the cap (piper's
    memory grows with its input) and the same, and no character is lost or duplicated."""
    pieces = split_at(text, cuts)
    whole = run([text], max_fragment_chars=max_chars)
    assert run(pieces, max_fragment_chars=max_chars) == whole
    assert run(list(text), max_fragment_chars=max_chars) == whole
    assert all(len(f) <= max_chars for f in whole)
    assert "".join(whole).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")


def test_a_long_word_is_cut_at_the_cap_and_a_long_line_at_its_last_space():
    assert run(["x" * 25], max_fragment_chars=14) == ["x" * 14, "x" * 11]
    assert run(["aaaa bbbb cccc dddd"], max_fragment_chars=14, max_fragment_words=30) == ["aaaa bbbb", "cccc dddd"]
