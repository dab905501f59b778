"""Words heard wrong, heard again (voice/dialog/rehearing.py) on real audio with the real Whisper model: an
answer to a question back chosen from the answer grammar, a device name guessed, and the checks that keep a
yes or a value that may have been something else from acting."""

import numpy as np
import pytest

from voice.dialog.answers import Answer
from voice.dialog.devices import HomeDevice
from voice.dialog.home import Declined, Home
from voice.dialog.rehearing import ANSWER_MARGIN, CHOSEN_FLOOR, rehear
from voice.dialog.understanding import Act
from voice.hearing.stt import SpeechToText
from voice.models import resolve
from voice.roomset import parse
from voice.speechset import framed, voices

from speech import espeak, piper, silence, wer


@pytest.fixture(scope="module")
def stt(small_config):
    return SpeechToText(resolve(small_config.models.stt, "stt"), small_config.stt)


def _home() -> Home:
    lamp = HomeDevice("bedroom lamp", "home/bedroom/lamp/set", ("ON", "OFF"), "bedroom", domain="light")
    desk = HomeDevice("desk lamp", "home/office/desk_lamp/set", ("ON", "OFF", "50"), "office", domain="light")
    door = HomeDevice("garage door", "home/garage/door/set", ("OPEN", "CLOSE"), "garage", domain="cover")
    kitchen = HomeDevice("kitchen light", "home/kitchen/light/set", ("ON", "OFF"), "kitchen", domain="light")
    return Home([lamp, desk, door, kitchen])


async def test_an_expected_answer_is_chosen_only_when_the_audio_fits_it_about_as_well_as_whisper_s_own_words(stt):
    """After a question back, the recogniser may choose among the expected answers (Home.answers): an answer that
    Whisper wrote as something else is taken, the right one of two values; other speech keeps its own words."""
    home, asked = _home(), [{"role": "assistant", "content": "Do you want the bedroom lamp on or off?"}]
    stream = stt.stream()
    stream.add(np.concatenate([espeak("Turn it off, please."), silence(300)]))
    # words a voice might be heard as: the audio fits an answer of the answer grammar that says off far better
    chosen = await rehear(home, "Tommy tough, please.", asked, stream)
    assert home.grammar.answers.read(chosen, ["ON", "OFF"]) == Answer(True, "OFF"), chosen
    stream = stt.stream()
    stream.add(np.concatenate([piper("What time is it?"), silence(300)]))
    text = await stream.final()
    assert wer("What time is it?", text) <= 0.25, text
    assert await rehear(home, text, asked, stream) == text  # not an answer: no expected one fits it as well
    assert await rehear(home, text, [], stream) == text  # no question back: nothing expected


async def test_a_device_name_heard_wrong_is_guessed_from_the_audio_and_asked_back(stt):
    """tiny.en heard "the desk lamp" as "the clamp" and "this lamp": the words said with each device's name are
    scored against the audio, the desk lamp's fits clearly best, and the guess is asked back, never done."""
    home = _home()
    stream = stt.stream()
    stream.add(np.concatenate([espeak("Set the desk lamp to 50 percent."), silence(300)]))
    misheard = "Set the clamp to 50 percent."
    assert "Set the desk lamp to 50 percent." in home.renamings(misheard)
    heard = await rehear(home, misheard, [], stream)
    assert heard == "Set the clamp to 50 percent. (the desk lamp)"
    understood = home.understand(heard, [], spoken=True)
    assert isinstance(understood, Act) and not understood.certain and understood.commands[0].device == home.devices[1]
    refusal = home.grounding(heard, [], spoken=True)("home/office/desk_lamp/set", "50")
    assert refusal is not None and refusal.speech == " Do you want the desk lamp set to 50?"
    stream = stt.stream()
    stream.add(np.concatenate([piper("Turn on the garden lamp."), silence(300)]))  # no device of the home
    text = await stream.final()
    assert home.renamings(text) and wer("Turn on the garden lamp.", text) == 0, text  # "the desk lamp" is scored
    assert await rehear(home, text, [], stream) == text  # the audio fits its own words far better


async def test_a_yes_the_audio_fits_about_as_well_as_a_no_is_taken_as_the_no(stt):
    """A yes to a question back acts, so a yes that was said as a no must not get through: the words are weighed
    against the no answers on the audio. Real audio of a no, with the words a recogniser might have written for
    it; and a yes really said, which stays a yes."""
    home, asked = _home(), [{"role": "assistant", "content": "Do you want the bedroom lamp on?"}]
    stream = stt.stream()
    stream.add(np.concatenate([espeak("No, leave it."), silence(300)]))
    chosen = await rehear(home, "Yes, please.", asked, stream)
    assert home.grammar.answers.read(chosen, ["ON", "OFF"]) == Answer(False), chosen
    stream = stt.stream()  # a no said with another polite word than the answers are sampled with
    stream.add(np.concatenate([espeak("No, thanks."), silence(300)]))
    chosen = await rehear(home, "Yes, please.", asked, stream)
    assert home.grammar.answers.read(chosen, ["ON", "OFF"]) == Answer(False), chosen
    stream = stt.stream()  # words that answer nothing, chosen as an answer: weighed against the noes too
    stream.add(np.concatenate([voices("espeak-caribbean")[0].speak("no thanks"), silence(300)]))
    chosen = await rehear(home, "Low bags.", asked, stream)  # as the listener heard it in this voice
    assert isinstance(home.understand(chosen, asked, spoken=True), Declined), chosen  # a no, or words that stand
    stream = stt.stream()
    stream.add(np.concatenate([piper("Yes, please."), silence(300)]))
    heard = await stream.final()
    assert home.grammar.answers.read(heard, ["ON", "OFF"]) == Answer(True), heard
    assert await rehear(home, heard, asked, stream) == heard  # the audio fits its yes far better than any no
    assert await rehear(home, heard, [], stream) == heard  # no question back: nothing to weigh


async def test_an_answer_chosen_for_garbled_words_that_the_audio_fits_loosely_does_nothing(stt):
    """In a room, "yeah close it" to "Do you want the garage door open?" was heard as words that answer nothing;
    "Yes, please." fitted the audio closest of the expected answers, and the door was opened. A chosen answer
    that acts must fit the audio at least ``CHOSEN_FLOOR``: this one does not, so the words heard stand, and
    they leave the door as it is with a reply that says they were not caught."""
    home, asked = _home(), [{"role": "assistant", "content": "Do you want the garage door open?"}]
    voice = voices("espeak-caribbean")[0]
    heard = parse("kitchen-3m").hear(framed("close", voice, "yeah close it", voice.speak("yeah close it")))
    stream = stt.stream()
    stream.add(heard.audio)
    text = await stream.final()
    assert home.grammar.answers.read(text, ["OPEN", "CLOSE"]) is None, text  # heard as no answer at all
    expected = home.answers(text, asked)
    own, *fits = await stream.fits([text, *expected])
    assert max(fits) >= own - ANSWER_MARGIN and expected[fits.index(max(fits))] == "Yes, please.", (text, own, fits)
    assert max(fits) < CHOSEN_FLOOR  # before the floor this yes was chosen, and it opened the door
    assert await rehear(home, text, asked, stream) == text
    understood = home.understand(text, asked, spoken=True)
    assert isinstance(understood, Declined) and not understood.said_no, understood
    assert understood.left_as_is == "Sorry, I didn't catch that. I left the garage door as it is."


async def test_a_value_the_audio_fits_about_as_well_as_another_value_does_nothing(stt):
    """A value answering a question back acts too: words heard as one value ("Turn it on.") on audio that said
    the other ("Turn it off.") are weighed against the answers naming the device's other values, not only the
    noes, and taken as a no, so nothing is done; a value really said keeps its words."""
    home, asked = _home(), [{"role": "assistant", "content": "Do you want the bedroom lamp on?"}]
    noes, others = home.rivals("Turn it on.", asked)
    assert noes and "Turn it off." in others and not any(" on" in other for other in others)
    stream = stt.stream()
    stream.add(np.concatenate([espeak("Turn it off."), silence(300)]))
    chosen = await rehear(home, "Turn it on.", asked, stream)
    assert home.grammar.answers.read(chosen, ["ON", "OFF"]) == Answer(False), chosen
    stream = stt.stream()
    stream.add(np.concatenate([piper("Turn it on, please."), silence(300)]))
    heard = await stream.final()
    assert home.grammar.answers.read(heard, ["ON", "OFF"]) == Answer(True, "ON"), heard
    assert await rehear(home, heard, asked, stream) == heard  # the audio fits its own value far better
