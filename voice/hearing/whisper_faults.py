"""What Whisper writes that nobody said, and the checks that take it out of a pass (voice.hearing.stt says
when each applies). Most weigh a pass's words and their timing against the audio under them, because
Whisper's text alone cannot tell a user's "thank you" from its own sign-off."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np

from audio.frames import SPEECH_RATE

log = logging.getLogger("specvoice.stt")

# What Whisper writes on silence or noise (from its YouTube training data). Dropped only when the segment
# also looks like non-speech (quiet audio or a high no-speech probability), so a user's real "thank you" stays.
HALLUCINATIONS = {
    "thank you",
    "thanks for watching",
    "thank you for watching",
    "thank you so much for watching",
    "please subscribe",
    "like and subscribe",
    "you",
    "bye",
    "bye bye",
    "so",
    "okay",
    "subtitles by the amara org community",
    "thank you very much",
    "the end",
}
SIGN_OFF = {"thank", "thanks", "bye", "so"}  # how Whisper's run-ons begin ("Thank you for watching, ...")
QUIET_RMS = 0.003  # about -50 dBFS
_MAX_WORDS_PER_S = 5.0  # fast speech is about 3 words a second: a pass with far more words ran on
_WORD_END_SLACK_S = 0.15  # Whisper's word timing may end a word this early (a final "s" still sounding)
_FRAME_S = 0.02


@dataclass(frozen=True)
class Word:
    text: str  # as Whisper writes it, usually with a leading space
    start: float  # seconds from the start of the current buffer
    end: float

    @property
    def key(self) -> str:
        return re.sub(r"[^\w']", "", self.text.lower())


def piled_up(words: list[Word], n: int = 3) -> bool:
    """The last ``n`` words share one instant: Whisper wrote text with no audio under it (a run-on after the
    speech, "Thanks for watching, ..."), which word timing places at a single point."""
    tail = words[-n:]
    return len(tail) == n and tail[-1].end - tail[0].start < 0.02


def cut_pile(words: list[Word]) -> list[Word]:
    """The words before a pile-up: a run-on ("France? Thank you for watching, I'll see you in the next video.",
    9 of 30 pause passes over piper's questions with a fitted window) is placed after the speech, its words all
    at one instant; what came before it is what was said. Only a sign-off word is taken from before the pile:
    the last spoken word too may stretch to the end of the audio ("Why is the sky blue?"). Cutting is a
    fraction of the cost of decoding again."""
    if not piled_up(words):
        return words
    end, pile_t = len(words), words[-1].end  # the end of the audio, where Whisper puts text it did not hear
    while end and words[end - 1].end - words[end - 1].start < 0.02:
        end -= 1
    if end and words[end - 1].key in SIGN_OFF and words[end - 1].end >= pile_t - 0.05:
        end -= 1  # the run-on's first word, stretched from the speech into the pile ("Thank", 1.86-2.20 s)
    log.debug("cut a run-on", extra={"text": join_words(words[end:])})
    return words[:end]


def drop_goodbye(words: list[Word]) -> list[Word]:
    """Without a "bye" tacked on after a comma ("Play some music, bye!" for the fragment "Play some music by"):
    Whisper's sign-off again, and it hides that the words before it trail off."""
    if len(words) >= 2 and words[-1].key == "bye" and words[-2].text.rstrip().endswith(","):
        return words[:-1]
    return words


def ran_on(words: list[Word], audio_s: float) -> bool:
    """A pass wrote more than the audio can hold: words piled up at its end, or more words than anyone says
    in that time (a hinted pass looped on a hint: "garage door, garage door, ...")."""
    return piled_up(words) or len(words) > _MAX_WORDS_PER_S * audio_s + 4


def span_rms(audio: np.ndarray, start: float, end: float) -> float:
    span = audio[int(start * SPEECH_RATE) : max(int(end * SPEECH_RATE), int(start * SPEECH_RATE) + 1)]
    return float(np.sqrt(np.mean(np.square(span)))) if len(span) else 0.0


def quiet_after(audio: np.ndarray, t: float) -> bool:
    """Nothing but quiet from ``t`` (plus the slack of word timing) to the end: no 20 ms frame of it reaches
    QUIET_RMS."""
    tail = audio[int((t + _WORD_END_SLACK_S) * SPEECH_RATE) :]
    frame = int(_FRAME_S * SPEECH_RATE)
    frames = tail[: len(tail) // frame * frame].reshape(-1, frame)
    return not len(frames) or float(np.sqrt(np.mean(np.square(frames), axis=1)).max()) < QUIET_RMS


def drop_unheard_tail(words: list[Word], audio: np.ndarray) -> list[Word]:
    """A pass without its last words that lie over quiet audio: with a prompt Whisper sometimes goes on
    into the silence after the request ("... to on. Music.", "... hallway. Thanks for watching, ..."), words
    with nothing under them (spoken words measured 0.04-0.2 RMS, quiet is below QUIET_RMS)."""
    end = len(words)
    while end and span_rms(audio, words[end - 1].start, words[end - 1].end) < QUIET_RMS:
        end -= 1
    if end < len(words):
        log.debug("dropped words over quiet audio", extra={"text": join_words(words[end:])})
    return words[:end]


def once(words: list[Word]) -> list[Word]:
    """The words up to a sentence that Whisper wrote twice in a row, once: a short window makes it write a short
    reply twice ("No... No...", "Five minutes. Five minutes.": 24 of 140 one- and two-word replies in 14
    voices), and a run-on may start with a copy of the request ("What is the capital of France? What is the
    capital of France? I'll", seen with one core kept busy); what follows the copy is the run-on."""
    keys = [w.key for w in words]
    for n in range(1, len(words) // 2 + 1):
        if words[n - 1].text.rstrip().endswith((".", "?", "!")) and keys[n : 2 * n] == keys[:n]:
            log.debug("dropped a repeat of the text", extra={"text": join_words(words[n:])})
            return words[:n]
    return words


def hallucinated(seg, audio: np.ndarray) -> bool:
    """A faster-whisper segment that is one of HALLUCINATIONS over what looks like non-speech."""
    if _norm(seg.text) not in HALLUCINATIONS:
        return False
    return seg.no_speech_prob >= 0.3 or span_rms(audio, seg.start, seg.end) < QUIET_RMS


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w' ]", " ", text.lower()).split())


def join_words(words: list[Word]) -> str:
    return "".join(w.text for w in words).strip()
