"""Did the user interrupt, or only show they are listening?

People say "mhm", "yeah", "okay", "right" while someone talks to them, and they cough and laugh; none of that
asks the speaker to stop. "Stop", "wait", "no, I meant the other one" do. The session holds the reply's audio
the moment speech starts (so a real interruption still silences it at once), then asks this module about the
words it heard: a backchannel resumes the reply from the sample where it stopped, anything else is a barge-in.

Two rules, in order. Words: if every word is an acknowledgement on the list (Whisper writes sounds as annotations,
"(coughs)", "[laughter]"; those and nothing at all count as sounds), it is a backchannel. Length: Whisper guesses at
a half-second "mhm" ("Hmm", "Uh...", but also "And may Chen."), so a short sound of one word at most (``SHORT_S`` of
voice or less) is a backchannel too, unless the word asks the speaker to stop ("stop", "wait", "no", a question
word); and so is an acknowledgement Whisper ran on from ("Yeah. That's", "I see. See you") when the voice was too
short (``RUN_ON_S``) to hold the extra words. Measured (`specvoice bench backchannel`): allowing more words in a
short sound keeps more "mhm"s but lets misheard "stop"s ("Stuff...", "Sit up.") through, and a missed "stop" costs
more. Anything longer with a word off the list is an interruption: an unknown word fails toward the old behaviour
(the reply stops), never toward a reply that talks over the user.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from voice.dialog.turn import Turn
from voice.hearing.utterance import Utterance, UtteranceEnded
from voice.tasks import cancel_and_wait

# Acknowledgements, in the words Whisper writes them; multi-word ones are matched as phrases.
BACKCHANNELS: frozenset[str] = frozenset(
    {
        "mhm",
        "mm",
        "mmm",
        "hmm",
        "hm",
        "mm hmm",
        "uh huh",
        "uh",
        "um",
        "ah",
        "oh",
        "ooh",
        "aha",
        "ha",
        "haha",
        "ha ha",
        "okay",
        "ok",
        "yeah",
        "yes",
        "yep",
        "yup",
        "right",
        "sure",
        "alright",
        "all right",
        "cool",
        "nice",
        "wow",
        "great",
        "i see",
        "got it",
        "interesting",
        "really",
        "true",
    }
)
# Words that ask the speaker to stop or change course, however short the utterance that holds them.
INTERRUPTIONS: frozenset[str] = frozenset(
    {
        "stop",
        "wait",
        "no",
        "nope",
        "hold",
        "pause",
        "quiet",
        "shh",
        "shush",
        "enough",
        "cancel",
        "hey",
        "sorry",
        "excuse",
        "actually",
        "but",
        "what",
        "why",
        "how",
        "who",
        "when",
        "where",
        "which",
        "repeat",
        "again",
    }
)
SHORT_S = 0.8  # voiced seconds: "mhm", "yeah okay", a cough; "stop" is as short, but says so
LONG_S = 1.5  # voiced seconds: "yeah, okay" takes ~1.2; a longer "mm-hmm" is Whisper's guess at real words
SHORT_WORDS = 1  # Whisper's guess at a short sound may be one word off the list, not a phrase
RUN_ON_S = 0.5  # voiced seconds: room for "yeah" or "I see", not for more words after it
RUN_ON_WORDS = 2  # "I see. See you": Whisper running on past a short acknowledgement, at most this many words
PARTIAL_WORDS = 3  # "actually, tell me about ..." stops the reply before its end of turn; "and may" waits
_LONGEST = max(len(p.split()) for p in BACKCHANNELS)
_SOUND = re.compile(r"\([^)]*\)|\[[^\]]*\]|\*[^*]*\*")  # (coughs) [laughter] *sigh*
_WORD = re.compile(r"[a-z]+")


def is_backchannel(text: str, voiced_s: float | None = None) -> bool:
    """True when ``text`` is only acknowledgements and sounds ("Mm-hmm.", "Yeah, okay.", "(coughs)", "") said in
    at most ``LONG_S``; or, when ``voiced_s`` (the speech's length, if known) is short and no word asks to stop,
    when it is one word, or an acknowledgement Whisper ran on from ("Yeah. That's" in 0.3 s of voice)."""
    words = _words(text)
    lead = _acknowledged(words)
    if lead == len(words):
        return voiced_s is None or voiced_s <= LONG_S
    if voiced_s is None or INTERRUPTIONS.intersection(words):
        return False
    run_on = lead > 0 and voiced_s <= RUN_ON_S and len(words) - lead <= RUN_ON_WORDS
    return run_on or (voiced_s <= SHORT_S and len(words) <= SHORT_WORDS)


def clearly_interrupts(partial: str, speaking_s: float) -> bool:
    """For a partial transcript, while the speech goes on (``speaking_s`` so far): stop now on a word that asks
    to stop, or on more than ``PARTIAL_WORDS`` words off the list once the speech is longer than a backchannel
    (Whisper's guess at a half-second hum can be a whole sentence)."""
    words = _words(partial)
    if _acknowledged(words) == len(words):
        return False
    return bool(INTERRUPTIONS.intersection(words)) or (len(words) > PARTIAL_WORDS and speaking_s > SHORT_S)


def _words(text: str) -> list[str]:
    return _WORD.findall(_SOUND.sub(" ", text.lower()).replace("-", " "))


def _acknowledged(words: list[str]) -> int:
    """How many of the leading words are acknowledgements (all of them: a backchannel)."""
    i = 0
    while i < len(words):
        for n in range(min(_LONGEST, len(words) - i), 0, -1):
            if " ".join(words[i : i + n]) in BACKCHANNELS:
                i += n
                break
        else:
            return i
    return i


@dataclass
class Hold:
    """A reply's audio held while the session finds out whether the user's speech was only a backchannel."""

    turn: Turn
    since: float  # monotonic time the speech started
    start_t: float  # audio time the speech started (its length decides a short sound Whisper guessed at)
    ended: UtteranceEnded | None = None  # the speech, once it ended; its transcript decides
    before: list[Utterance] = field(default_factory=list)  # earlier bursts of this hold ("ha", "ha", "ha")
    deciding: asyncio.Task[object] | None = None
    timer: asyncio.Task[object] | None = None  # dialog.backchannel_hold_s without a decision: a barge-in

    async def goes_on(self) -> None:
        """More speech while the last burst is being decided ("ha ... ha"): the bursts are judged together."""
        deciding, self.deciding = self.deciding, None
        await cancel_and_wait(deciding)
        if self.ended is not None:
            self.before.append(self.ended.utterance)
            self.ended = None

    async def stop_timer(self) -> None:
        timer, self.timer = self.timer, None
        await cancel_and_wait(timer)
