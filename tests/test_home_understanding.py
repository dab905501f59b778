"""What the user's words ask of a named home, as Home Assistant's matcher reads them (hassil over
home-assistant-intents, voice/dialog/understanding.py): strict matches act, near matches and the model's proposals
are asked back, questions, later requests and values a device cannot take never act, and the answer to a question
back completes it. Real parts: the config loader, the matcher, the marker parser (what the model writes is given)."""

from __future__ import annotations

import json

import pytest

from voice.config import ConfigError, load_config
from voice.dialog.actions import REFUSED_SPEECH
from voice.dialog.devices import HomeDevice
from voice.dialog.home import Declined, Home, constrained_commands, guessed_as, marker_choices
from voice.dialog.understanding import Act, AskState, Later, NoMatch

from test_home import BEDROOM, COUNTER, DEVICES, GARAGE, KITCHEN, _write, load, reply


def commands(home: Home, said: str, history: list | None = None, spoken: bool = False) -> tuple[bool, set]:
    """(certain, {(topic, payload)}) of an ``Act`` reading; (False, set()) for anything else."""
    understood = home.understand(said, history or [], spoken)
    if not isinstance(understood, Act):
        return False, set()
    return understood.certain, {(c.topic, c.payload) for c in understood.commands}


@pytest.mark.parametrize(
    "said, expected",
    [
        ("turn on the kitchen light", {(KITCHEN, "ON")}),
        ("open the garage door", {(GARAGE, "OPEN")}),
        ("please close the garage door", {(GARAGE, "CLOSE")}),
        ("set the kitchen light to 50%", {(KITCHEN, "50")}),
        ("kill the kitchen light", {(KITCHEN, "OFF")}),  # our sentences, next to Home Assistant's
        ("switch the light of the kitchen on", {(KITCHEN, "ON")}),  # its name the other way round
        ("turn on the lights of the kitchen", {(KITCHEN, "ON"), (COUNTER, "ON")}),  # an area's lights
        ("turn on the bedside light", {(BEDROOM, "ON")}),  # an alias
        ("turn off the lights in the kitchen", {(KITCHEN, "OFF"), (COUNTER, "OFF")}),
        ("turn off all the lights", {(KITCHEN, "OFF"), (COUNTER, "OFF"), (BEDROOM, "OFF")}),
        ("turn everything off upstairs", {(BEDROOM, "OFF")}),  # a floor; never the garage door
        ("put on the kitchen light and the bedside light too", {(KITCHEN, "ON"), (BEDROOM, "ON")}),  # two names
        ("kill the kitchen light and the bedroom lamp", {(KITCHEN, "OFF"), (BEDROOM, "OFF")}),
    ],
)
def test_a_strict_match_acts_on_every_device_it_names_once(tmp_path, said, expected):
    assert commands(load(tmp_path), said) == (True, expected)


def test_the_kitchen_light_by_name_is_that_light_and_not_every_light_in_the_kitchen(tmp_path):
    home = load(tmp_path)
    spoken, requests = reply(home, "turn on the kitchen light", f"[ACTION {KITCHEN} ON][ACTION {COUNTER} ON] Done.")
    assert requests == [(KITCHEN, "ON", True), (COUNTER, "ON", False)] and spoken == REFUSED_SPEECH


@pytest.mark.parametrize(
    "said",
    [
        "I want to know whether the garage door is open.",  # an indirect question
        "why is the garage door open",
        "check whether the garage door is open",
        "is the garage door open?",
        "turn off the kitchen light in ten minutes",  # a later time
        "switch the bedroom lamp off at 10 pm",
        "don't open the garage door",  # a negation
        "don't open the garage door, the car is inside",
        "if it rains, close the garage door",  # a condition
        "close the garage door when I leave",
        "close the garage door at midnight",
        "every weekday at 8, open the garage door",
        "turn on the kitchen light, no wait",  # taken back
        "turn off the kitchen light, she said",  # someone else's words
        "I opened the garage door this morning",  # past tense
        "my sister loves the bedroom lamp",  # a mention
        "turn on the printer",  # no such device
        "what's the weather like",
    ],
)
def test_sentences_that_ask_for_no_action_now_never_act(tmp_path, said):
    """Whatever the model writes, a marker for such a sentence is refused or asked back: never done at once."""
    home = load(tmp_path)
    assert not commands(home, said)[0], said
    if any(word in said for word in ("don't", "wait", "said")):
        assert isinstance(home.understand(said), NoMatch), said  # not even a guess to ask back: the model's
    if any(word in said for word in ("if ", "when", "midnight", "weekday")):
        assert isinstance(home.understand(said), Later), said  # said as not done now
    for topic, payloads in home.allowed.items():
        for payload in payloads:
            refusal = home.grounding(said)(topic, payload)
            assert refusal is not None, (said, topic, payload)


def test_a_later_request_is_said_as_not_supported_and_a_question_shows_the_state(tmp_path):
    home = load(tmp_path)
    assert isinstance(home.understand("turn off the kitchen light in ten minutes"), Later)
    spoken, requests = reply(home, "turn off the kitchen light in ten minutes", f"[ACTION {KITCHEN} OFF] Done.")
    assert requests == [(KITCHEN, "OFF", False)] and "not at a later time" in spoken
    assert isinstance(home.understand("is the garage door open?"), AskState)
    home.set_state("home/garage/door/state", "open")
    assert "(state now: garage door = open" in home.annotate("I want to know whether the garage door is open.")


def test_a_guess_is_asked_back_never_done(tmp_path):
    home = load(tmp_path)
    # a request beside a clause that names more of the home: which of them is meant is not sure
    for said, expected in [
        ("Switch the bedroom lamp on, the kitchen is dark.", (BEDROOM, "ON")),
        ("close the garage door, the bedroom is cold", (GARAGE, "CLOSE")),
    ]:
        assert commands(home, said) == (False, {expected}), said
        refusal = home.grounding(said)(*expected)
        assert refusal is not None and refusal.asks_back and "Do you want the" in refusal.speech
        assert home.opening(said) == [c for c in home.understand(said).commands]  # type: ignore[union-attr]


def test_a_command_the_model_proposes_when_nothing_matched_is_asked_back(tmp_path):
    home = load(tmp_path)
    assert isinstance(home.understand("it's dark in the bedroom"), NoMatch)
    spoken, requests = reply(home, "it's dark in the bedroom", f"[ACTION {BEDROOM} ON] Done.")
    assert requests == [(BEDROOM, "ON", False)] and spoken == " Do you want the bedroom lamp on?"
    history = [{"role": "user", "content": "it's dark in the bedroom"}, {"role": "assistant", "content": spoken}]
    for answer in ["yes", "Yep, go ahead.", "sure thing", "yes please", "switch it on", "on please"]:
        assert commands(home, answer, history) == (True, {(BEDROOM, "ON")}), answer
        assert home.grounding(answer, history)(BEDROOM, "ON") is None, answer
    for answer in ["no", "nah, leave it", "never mind", "no thanks"]:
        assert isinstance(home.understand(answer, history), Declined), answer
        assert home.grounding(answer, history)(BEDROOM, "ON") is not None, answer
    for answer in ["Okay, go home then.", "what's the weather like?"]:  # words that answer nothing
        understood = home.understand(answer, history)
        assert isinstance(understood, Declined) and not understood.said_no, answer
        assert home.grounding(answer, history)(BEDROOM, "ON") is not None, answer
    assert commands(home, "turn it off", history) == (True, {(BEDROOM, "OFF")})  # another of its values
    assert commands(home, "open the garage door", history) == (True, {(GARAGE, "OPEN")})  # a command of its own
    assert home.annotate("yes", history) == "yes (the bedroom lamp on)"


def test_a_device_with_several_values_is_asked_which_and_the_answer_completes_it(tmp_path):
    home = load(tmp_path)
    history = [{"role": "assistant", "content": "Do you want the garage door open or closed?"}]
    assert home.asked_back(history) == ([home.devices[3]], ["OPEN", "CLOSE"])
    assert commands(home, "Closed, please.", history) == (True, {(GARAGE, "CLOSE")})
    assert not commands(home, "yes", history)[1]  # which one: not said
    assert constrained_commands(home, "Closed.", history) == {GARAGE: ["CLOSE"]}
    assert constrained_commands(None, "Unlock the front door.") == {}
    proposed = [{"role": "assistant", "content": "Do you want the kitchen light set to 50?"}]
    assert commands(home, "fifty percent", proposed) == (True, {(KITCHEN, "50")})
    assert home.asked_back([{"role": "assistant", "content": "The garage door is open."}]) is None


def test_a_value_a_device_cannot_take_is_said_and_not_done(tmp_path):
    home = load(tmp_path)
    spoken, requests = reply(home, "set the kitchen light to 25%", f"[ACTION {KITCHEN} 50] Done.")
    assert requests == [(KITCHEN, "50", False)] and spoken == REFUSED_SPEECH
    assert "takes ON, OFF, 50" in home.annotate("set the kitchen light to 25%")


def test_a_language_home_assistant_has_no_sentences_for_is_a_clear_error(tmp_path):
    config = load_config(_write(tmp_path, DEVICES), environ={})
    with pytest.raises(ValueError, match="no sentences for language 'xx'.*fix"):
        Home.from_config(config.mqtt, "xx")


def test_the_home_device_here_and_floors_come_from_the_config(tmp_path):
    text = DEVICES.replace("[llm]", '[mqtt]\narea = "kitchen"\n\n[llm]')
    home = load(tmp_path, text)
    assert home.here == "kitchen"
    assert commands(home, "turn off the lights here") == (True, {(KITCHEN, "OFF"), (COUNTER, "OFF")})
    with pytest.raises(ConfigError, match="mqtt.area"):
        load(tmp_path, DEVICES.replace("[llm]", '[mqtt]\narea = "attic"\n\n[llm]'))
    with pytest.raises(ConfigError, match="domain"):
        load(
            tmp_path,
            DEVICES + '\n[[mqtt.devices]]\nname = "x"\ntopic = "home/x/set"\npayloads = ["ON"]\ndomain = "toaster"\n',
        )


def test_a_spoken_name_heard_wrong_is_guessed_and_asked_back_typed_never(tmp_path):
    home = load(tmp_path)
    assert commands(home, "Close my garbage door.", spoken=True) == (False, {(GARAGE, "CLOSE")})
    assert commands(home, "Close my garbage door.", spoken=False) == (False, set())  # typed: no guess
    guess = guessed_as("Turn off the bedroom lump.", home.devices[2])  # the audio chose it
    assert commands(home, guess, spoken=True) == (False, {(BEDROOM, "OFF")})
    assert home.grounding(guess, [], spoken=True)(BEDROOM, "OFF").asks_back  # type: ignore[union-attr]


def test_after_a_question_back_the_recogniser_may_choose_among_answers_the_grammar_makes(tmp_path):
    home = load(tmp_path)
    history = [{"role": "assistant", "content": "Do you want the bedroom lamp on?"}]
    answers = home.answers("Tommy tongue, please.", history)
    assert any(a.startswith("Yes") for a in answers) and "On." in answers and "No." in answers
    for answer in answers:  # every one of them reads as an answer
        assert home.grammar.answers.read(answer, ["ON", "OFF"]) is not None, answer
    assert home.answers("Yes.", history) == [] and home.answers("Tommy tongue.", []) == []


# name, topic, payloads, area, floor, domain (None: inferred) of a home of everyday devices
_EVERYDAY = [
    ("kitchen light", "home/kitchen/light/set", ["ON", "OFF", "50"], "kitchen", "downstairs", None),
    ("garage door", "home/garage/door/set", ["OPEN", "CLOSE"], "garage", "downstairs", None),
    ("coffee machine", "home/kitchen/coffee/set", ["ON", "OFF"], "kitchen", "downstairs", None),
    ("living room blinds", "home/living_room/blinds/set", ["OPEN", "CLOSE", "50"], "living room", "downstairs", None),
    ("porch light", "home/porch/light/set", ["ON", "OFF"], "porch", "downstairs", "light"),
    ("front door lock", "home/hall/lock/set", ["LOCK", "UNLOCK"], "hall", "downstairs", None),
    ("bedroom fan", "home/bedroom/fan/set", ["ON", "OFF"], "bedroom", "upstairs", "fan"),
]
EVERYDAY = '[llm]\nmode = "target"\n' + "".join(
    f'\n[[mqtt.devices]]\nname = "{name}"\ntopic = "{topic}"\npayloads = {json.dumps(payloads)}\n'
    f'area = "{area}"\nfloor = "{floor}"\n' + (f'domain = "{domain}"\n' if domain else "")
    for name, topic, payloads, area, floor, domain in _EVERYDAY
)
LIGHT, DOOR, COFFEE = "home/kitchen/light/set", "home/garage/door/set", "home/kitchen/coffee/set"
BLINDS, PORCH, LOCK = "home/living_room/blinds/set", "home/porch/light/set", "home/hall/lock/set"


@pytest.mark.parametrize(
    "said, certain, expected",
    [
        # what a home of everyday phrasings asks: done at once
        ("open the living room blinds halfway", True, {(BLINDS, "50")}),  # a position, not OPEN
        ("kill the kitchen light", True, {(LIGHT, "OFF")}),
        ("turn everything off downstairs", True, {(LIGHT, "OFF"), (COFFEE, "OFF"), (PORCH, "OFF")}),  # no lock, door
        ("turn off all the lights", True, {(LIGHT, "OFF"), (PORCH, "OFF")}),
        ("switch the light of the kitchen on", True, {(LIGHT, "ON")}),
        ("Switch the porch light on, the kids are coming home.", True, {(PORCH, "ON")}),  # with its reason
        ("I'm off to bed, switch the porch light off", True, {(PORCH, "OFF")}),
        # asked back: a clause it has no sentence for, a name said in part, a reason that names a device
        ("Switch the porch light on, the kitchen light is too dim.", False, {(PORCH, "ON")}),
        ("lock the front door", True, {(LOCK, "LOCK")}),  # the name without "lock", which the verb says
        # never acts now: questions (direct and indirect), a later time, a past deed
        ("I want to know whether the garage door is open.", False, set()),
        ("why is the garage door open", False, set()),
        ("check whether the garage door is open", False, set()),
        ("turn off the kitchen light in ten minutes", False, set()),
        ("switch the coffee machine off at 10 pm", False, set()),
        ("make it brighter in here", False, set()),  # no sentence for it: the model's, asked back
    ],
)
def test_everyday_phrasings_act_ask_back_or_stay_still(tmp_path, said, certain, expected):
    home = load(tmp_path, EVERYDAY)
    assert commands(home, said) == (certain, expected), said
    if not certain:  # whatever the model writes, nothing is done at once
        assert all(home.grounding(said)(t, p) is not None for t, payloads in home.allowed.items() for p in payloads)


def test_a_guess_for_several_devices_is_one_question_and_yes_does_them_all(tmp_path):
    home = load(tmp_path)
    said = "switch off the lights in the kitchen, I'm done in the bedroom"
    assert commands(home, said) == (False, {(KITCHEN, "OFF"), (COUNTER, "OFF")})
    spoken, requests = reply(home, said, f"[ACTION {KITCHEN} OFF][ACTION {COUNTER} OFF] Done.")
    assert spoken == " Do you want the kitchen light and the counter lights off?"
    assert requests == [(KITCHEN, "OFF", False), (COUNTER, "OFF", False)]  # asked once, nothing done
    history = [{"role": "assistant", "content": spoken.strip()}]
    assert home.asked_back(history) == ([home.devices[0], home.devices[1]], ["OFF"])
    assert commands(home, "yes please", history) == (True, {(KITCHEN, "OFF"), (COUNTER, "OFF")})
    assert home.annotate("yes please", history) == "yes please (the kitchen light and the counter lights off)"


def test_heard_words_without_a_verb_are_asked_back_typed_ones_taken_as_written(tmp_path):
    """Whisper drops a question's first word ("are our bedroom lamp off" heard as "Our bedroom lamp off."): a
    sentence that matches with its optional verb left out is confirmed first when heard."""
    home = load(tmp_path)
    for said, expected in [("Our bedroom lamp off.", (BEDROOM, "OFF")), ("the kitchen light to 50", (KITCHEN, "50"))]:
        assert commands(home, said) == (True, {expected}), said
        assert commands(home, said, spoken=True) == (False, {expected}), said
    for said in ["turn off the bedroom lamp", "set the kitchen light to 50%", "open the garage door"]:
        assert commands(home, said, spoken=True)[0], said  # a verb was said: done at once


def _yard() -> Home:
    """A home whose device names end in the word for their kind, two of them the only ones of their first words."""
    return Home(
        [
            HomeDevice("side gate lock", "home/yard/gate/set", ("LOCK", "UNLOCK"), "yard", None, "lock"),
            HomeDevice(
                "porch light", "home/porch/light/set", ("ON", "OFF"), "porch", "home/porch/light/state", "light"
            ),
            HomeDevice("shed light", "home/yard/shed/set", ("ON", "OFF"), "yard", "home/yard/shed/state", "light"),
            HomeDevice("garden fan", "home/yard/fan/set", ("ON", "OFF"), "yard", "home/yard/fan/state", "fan"),
        ]
    )


@pytest.mark.parametrize(
    "said, certain, expected",
    [
        ("lock the side gate", True, {("home/yard/gate/set", "LOCK")}),  # "lock": what the name leaves out
        ("turn on the shed", True, {("home/yard/shed/set", "ON")}),
        ("unlock the gate lock", False, {("home/yard/gate/set", "UNLOCK")}),  # its first word left out: a guess
        ("turn on the porch", False, set()),  # the porch is an area: all its lights, never a name said in part
    ],
)
def test_a_name_without_the_word_for_its_kind_is_that_device(said, certain, expected):
    understood = _yard().understand(said)
    if not expected:
        assert not isinstance(understood, Act) or understood.certain is False or understood.intent != "HassTurnOn"
        return
    assert isinstance(understood, Act) and understood.certain is certain, understood
    assert {(c.topic, c.payload) for c in understood.commands} == expected


@pytest.mark.parametrize(
    "question, answer",
    [
        ("is the porch light on?", "No, the porch light is off."),
        ("which lights are on?", "The shed light is on."),
        ("are any lights off?", "Yes, the porch light is off."),
        ("are all the lights on?", "No, the porch light is off."),
        ("how many fans are on?", "1 is on: the garden fan."),
        ("what is the state of the shed light", "The shed light is at 60."),
    ],
)
def test_a_question_about_state_is_answered_from_the_state_topics(question, answer):
    """The reply opens with what the state says (the small model once said "yes" to any such question)."""
    home = _yard()
    for topic, value in [
        ("home/porch/light/state", "OFF"),
        ("home/yard/shed/state", "60"),
        ("home/yard/fan/state", "on"),
    ]:
        home.set_state(topic, value)
    assert marker_choices(home, question)[1] == [answer]
    assert home.annotate(question).endswith(f"the answer: {answer})")


def test_a_question_about_a_device_whose_state_has_not_come_is_left_to_the_model():
    home = _yard()
    assert marker_choices(home, "is the porch light on?")[1] == []
    assert "porch light = unknown" in home.annotate("is the porch light on?")


@pytest.mark.parametrize(
    "said, certain, expected",
    [
        ("lock all the doors", True, {"side gate lock"}),  # every lock; never another kind of device
        ("unlock both locks", True, {"side gate lock"}),
        ("in the yard, turn on the lights", True, {"shed light"}),  # a place said first
        ("the shed light, switch it on", True, {"shed light"}),  # the device said first, then "it"
        ("it's dark out, turn on the porch light", True, {"porch light"}),  # the reason first
        ("it's dark, turn on the porch light?", True, {"porch light"}),
        ("is it dark? turn on the porch light", False, {"porch light"}),  # a question beside it: asked back
        ("once the baby's asleep, turn it off", None, set()),  # no device: the model's
    ],
)
def test_places_and_clauses_said_first_and_all_the_locks(said, certain, expected):
    understood = _yard().understand(said)
    if certain is None:
        assert isinstance(understood, NoMatch), understood
        return
    assert isinstance(understood, Act) and understood.certain is certain, understood
    assert {c.device.name for c in understood.commands} == expected


def _loft() -> Home:
    """A room's name at the start of a device's name, and names people say the other way round."""
    cover = ("OPEN", "CLOSE", "50")
    return Home(
        [
            HomeDevice("loft skylight", "h/loft/skylight/set", cover, "loft", None, "cover"),
            HomeDevice("loft lamp", "h/loft/lamp/set", ("ON", "OFF"), "loft", None, "light"),
            HomeDevice("desk lamp", "h/study/lamp/set", ("ON", "OFF"), "study", None, "light"),
            HomeDevice("cellar door lock", "h/cellar/door/set", ("LOCK", "UNLOCK"), "cellar", None, "lock"),
            HomeDevice("dining chandelier", "h/dining/chandelier/set", ("ON", "OFF"), "dining room", None, "light"),
        ]
    )


@pytest.mark.parametrize(
    "said, certain, expected",
    [
        ("open the skylight", True, {"loft skylight"}),  # the room's name left out: still one device
        ("put the chandelier on", True, {"dining chandelier"}),  # a word of the room's name left out
        ("turn on the lamp", False, set()),  # "lamp" alone is a kind, not the loft lamp
        ("lock the door of the cellar", True, {"cellar door lock"}),  # head word first, with "of"
        ("switch on the lamp of the desk", True, {"desk lamp"}),
        ("turn on the study desk lamp", True, {"desk lamp"}),  # its room said before its name
        ("turn on the loft desk lamp", None, set()),  # a room it is not in
    ],
)
def test_names_said_without_their_room_or_the_other_way_round(said, certain, expected):
    understood = _loft().understand(said)
    if not expected:
        assert not (isinstance(understood, Act) and understood.certain), understood
        return
    assert isinstance(understood, Act) and understood.certain is certain, understood
    assert {c.device.name for c in understood.commands} == expected


def _house() -> Home:
    """Two floors, lights in two rooms, two fans, a blind and a curtain, two locks."""
    light = ("ON", "OFF", "50")
    cover = ("OPEN", "CLOSE", "50")
    return Home(
        [
            HomeDevice("ceiling light", "h/kitchen/ceiling/set", light, "kitchen", None, "light", (), "downstairs"),
            HomeDevice("cabinet lights", "h/kitchen/cabinet/set", light, "kitchen", None, "light", (), "downstairs"),
            HomeDevice("bedside lamp", "h/bedroom/lamp/set", light, "bedroom", None, "light", (), "upstairs"),
            HomeDevice("extractor fan", "h/bath/fan/set", ("ON", "OFF"), "bathroom", None, "fan", (), "upstairs"),
            HomeDevice("desk fan", "h/study/fan/set", ("ON", "OFF"), "study", None, "fan", (), "downstairs"),
            HomeDevice(
                "bedroom blind", "h/bedroom/blind/set", cover, "bedroom", None, "cover", (), "upstairs", "blind"
            ),
            HomeDevice(
                "study curtains", "h/study/curtains/set", cover, "study", None, "cover", (), "downstairs", "curtain"
            ),
            HomeDevice("front door lock", "h/hall/front/set", ("LOCK", "UNLOCK"), "hall", None, "lock"),
            HomeDevice("shed lock", "h/yard/shed/set", ("LOCK", "UNLOCK"), "yard", None, "lock"),
        ]
    )


@pytest.mark.parametrize(
    "said, expected",
    [
        ("put every light in the house on", {"ceiling light", "cabinet lights", "bedside lamp"}),
        ("turn the lights in the kitchen off", {"ceiling light", "cabinet lights"}),  # the place inside the verb
        ("kill the lights upstairs", {"bedside lamp"}),
        ("in the kitchen, turn on the lights", {"ceiling light", "cabinet lights"}),
        ("all the fans off please", {"extractor fan", "desk fan"}),
        ("close all the blinds and curtains", {"bedroom blind", "study curtains"}),  # two kinds of cover
        ("close the blinds", {"bedroom blind"}),  # a kind of cover: never the curtains
        ("lock everything up", {"front door lock", "shed lock"}),  # every lock, and nothing else
        ("switch it all off downstairs", {"ceiling light", "cabinet lights", "desk fan"}),  # never a cover or lock
    ],
)
def test_devices_chosen_by_kind_and_place_each_get_the_command_once(said, expected):
    understood = _house().understand(said)
    assert isinstance(understood, Act) and understood.certain, understood
    assert sorted(c.device.name for c in understood.commands) == sorted(expected)


@pytest.mark.parametrize("said", ["are all the fans off", "is everything off", "I left all the lights on upstairs"])
def test_questions_and_statements_about_kinds_and_places_never_act(said):
    understood = _house().understand(said)
    assert not (isinstance(understood, Act) and understood.certain), understood


def test_a_question_back_left_without_a_yes_opens_the_reply_by_saying_so(tmp_path):
    """Left to itself the model has answered an unreadable answer with "Done." although nothing was done: the reply
    to a no, or to words that answer nothing, opens with what was left as it is."""
    home = load(tmp_path)
    history = [{"role": "assistant", "content": "Do you want the bedroom lamp on?"}]
    assert marker_choices(home, "No, thanks.", history) == ([], ["Okay, I left the bedroom lamp as it is."])
    not_caught = "Sorry, I didn't catch that. I left the bedroom lamp as it is."
    assert marker_choices(home, "Okay, go home then.", history) == ([], [not_caught])
    assert "this answers nothing you asked; nothing was changed" in home.annotate("Okay, go home then.", history)
    assert marker_choices(home, "Yes, please.", history)[1] == [f"[ACTION {BEDROOM} ON]"]
    assert marker_choices(home, "Okay, go home then.")[1] == []  # no question back: the model answers freely
