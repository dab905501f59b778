"""Words heard wrong, heard again: where the home knows the few things a user may have said, the recogniser scores
those against the utterance's audio (teacher-forced, ``Transcription.fits``), as a closed grammar would, and one
that the audio fits about as well as Whisper's own words replaces them.

Three such places, all only for speech: an answer to a question back that the words heard do not read as one
(``Home.answers``: a short answer in an accent Whisper knows little is often heard as other words; one chosen so
that would act must also fit the audio well in itself, ``CHOSEN_FLOOR``, or the words heard stand); a yes or a
value answering a question back, weighed against the noes and the other values (``Home.rivals``: such an answer
acts, so one that may have been something else must not); and a command whose device name was heard as other
words (``Home.renamings``). A name chosen so is a guess: the grounding asks back before anything is done
(``Home.hear``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from voice.dialog.home import Home, guessed_as
from voice.ports import Transcription

log = logging.getLogger(__name__)

# An expected answer is taken when its mean token log-probability is at most this far under that of Whisper's own
# words. Measured on 7 voices (piper, 6 espeak-ng accents) after a question back: at 1.5, 16 of 19 answers Whisper
# had heard wrong were recovered, none to a wrong value, and no other utterance of 49 ("No, leave it.", "What time
# is it?", "Forget it.") was taken for an answer; the closest of those was 1.9 under.
ANSWER_MARGIN = 1.5
# A device name is guessed when the words said with it fit at most NAME_MARGIN under Whisper's own and at least
# NAME_APART above the best with any other device's name. Measured on 150 spoken transcripts of `bench home` runs
# that named no device: 16 of the 21 commands no spelling guessed got their own device, none another, and 4 of 120
# other utterances got a guess (asked back, never done: mostly state questions heard without their question word).
NAME_MARGIN, NAME_APART = 1.0, 0.5
# An answer chosen for words that answered nothing acts only when the audio fits it at least this well (mean
# token log-probability): a garbled answer in a noisy room was otherwise taken for a yes it was not. Set on the
# tuning half of the case file's answers in the tuning rooms (docs/benchmarks.md, "An answer the audio fits
# loosely"); a chosen no is kept whatever its fit, as it does nothing.
CHOSEN_FLOOR = -2.0
# A heard yes or value is taken for a no when the audio fits a no, or another value, at most this far under the
# words heard: set on the tuning half of the case file's answers so that answers really said keep their words
# (docs/benchmarks.md, "A value the audio cannot tell from another").
DOUBT_MARGIN = 0.5


async def rehear(home: Home | None, text: str, history: Sequence[dict], transcription: Transcription) -> str:
    """``text`` (the final transcript), or what the audio says about as well: a chosen answer to the question
    back, or the words with the device they name guessed (``guessed_as``)."""
    if home is None or not text:
        return text
    if expected := home.answers(text, history):
        scores = await transcription.fits([text, *expected])
        if not scores:
            return text
        own, fits = scores[0], scores[1:]
        best = fits.index(max(fits))
        log.debug("answers scored", extra={"text": text, "own": own, "best": expected[best]})
        if fits[best] < own - ANSWER_MARGIN:
            return text
        noes, others = home.rivals(expected[best], history)
        if noes and fits[best] < CHOSEN_FLOOR:
            # the words heard stand: they answer nothing, so nothing is done and the reply says it did not catch them
            log.info("an answer the audio fits loosely: not taken", extra={"text": expected[best], "fit": fits[best]})
            return text
        text = expected[best]  # an answer chosen so is weighed against its rivals too, as one heard
    else:
        noes, others = home.rivals(text, history)
    if noes:
        return await _undoubted(text, noes, others, transcription)
    if not (renamed := home.renamings(text, history)):
        return text
    scores = await transcription.fits([text, *renamed])
    if not scores:
        return text
    by_device: dict[str, float] = {}
    for device, score in zip(renamed.values(), scores[1:], strict=True):
        by_device[device.name] = max(score, by_device.get(device.name, score))
    ranked = sorted(by_device.items(), key=lambda pair: -pair[1])
    name, score = ranked[0]
    apart = score - ranked[1][1] if len(ranked) > 1 else NAME_APART
    log.debug("names scored", extra={"text": text, "own": scores[0], "best": name, "score": score, "apart": apart})
    if score < scores[0] - NAME_MARGIN or apart < NAME_APART:
        return text
    return guessed_as(text, next(d for d in renamed.values() if d.name == name))


async def _undoubted(text: str, noes: list[str], others: list[str], transcription: Transcription) -> str:
    """``text``, an answer that acts, or the no answer that fits the audio best when a no or another value fits
    it about as well (``DOUBT_MARGIN``)."""
    scores = await transcription.fits([text, *noes, *others])
    if not scores or max(scores[1:]) < scores[0] - DOUBT_MARGIN:
        return text
    no_scores = scores[1 : 1 + len(noes)]
    said = noes[no_scores.index(max(no_scores))]
    log.info("an answer the audio fits about as well as another: taken as no", extra={"text": text, "no": said})
    return said
