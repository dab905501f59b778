"""The named home (mqtt.devices): its system prompt, what the user's words ask as Home Assistant's matcher reads
them (hassil over home-assistant-intents), the grounding of a reply's actions in that reading, the question back
and its answer, the state shown when the user asks about state, and a broken device entry refused with its fix.
Real parts only: the config loader, the matcher, the marker parser and voice/dialog/home.py (no model: what the
model writes is given here); and the formats through a real Turn, over a chat that replies with given text."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from llm.history import ChatHistory
from llm.settings import DecodeSettings, Emission
from voice.config import ConfigError, load_config
from voice.config_speech import TTSConfig
from voice.dialog.actions import ACTION_TOOL, REFUSED_SPEECH, ActionParser, action_tool
from voice.dialog.home import Declined, Home, constrained_commands, guessed_as
from voice.dialog.turn import EarlyReply, Turn, TurnContext
from voice.dialog.understanding import Act, AskState, Later, NoMatch
from voice.events import ActionRequested, ToolCallRequested
from voice.latency import LatencyStats, LatencyTrace

KITCHEN = "home/kitchen/light/set"
COUNTER = "home/kitchen/counter/set"
BEDROOM = "home/bedroom/lamp/set"
GARAGE = "home/garage/door/set"

DEVICES = """
[llm]
mode = "target"

[[mqtt.devices]]
name = "kitchen light"
topic = "home/kitchen/light/set"
payloads = ["ON", "OFF", "50"]
area = "kitchen"
state_topic = "home/kitchen/light/state"

[[mqtt.devices]]
name = "counter lights"
topic = "home/kitchen/counter/set"
payloads = ["ON", "OFF"]
area = "kitchen"
domain = "light"

[[mqtt.devices]]
name = "bedroom lamp"
topic = "home/bedroom/lamp/set"
payloads = ["ON", "OFF"]
area = "bedroom"
state_topic = "home/bedroom/lamp/state"
domain = "light"
aliases = ["bedside light"]
floor = "upstairs"

[[mqtt.devices]]
name = "garage door"
topic = "home/garage/door/set"
payloads = ["OPEN", "CLOSE"]
area = "garage"
state_topic = "home/garage/door/state"
"""


def load(tmp_path: Path, text: str = DEVICES) -> Home:
    path = tmp_path / "home.toml"
    path.write_text(text)
    home = Home.from_config(load_config(path, environ={}).mqtt)
    assert home is not None
    return home


def reply(home: Home, heard: str, text: str) -> tuple[str, list[tuple[str, str, bool]]]:
    parser = ActionParser(home.allowed, home.grounding(heard), once_per_topic=True)
    spoken = parser.push(text) + parser.flush()
    return spoken, [(r.topic, r.payload, r.allowed) for r in parser.requests]


def test_the_prompt_names_devices_by_area_and_does_not_change_with_state(tmp_path):
    home = load(tmp_path)
    prompt = home.prompt()
    kitchen, bedroom = prompt.index("\nkitchen:"), prompt.index("\nbedroom:")
    assert kitchen < prompt.index(f"kitchen light: [ACTION {KITCHEN} ON] (values: ON, OFF, 50)") < bedroom
    assert "not a request" in prompt and "cannot control it" in prompt
    home.set_state("home/garage/door/state", "open")
    assert home.prompt() == prompt  # the cached prefix of every turn stays the same


def test_devices_join_the_allow_list_next_to_plain_allowed_actions(tmp_path):
    config = load_config(_write(tmp_path, DEVICES + '\n[mqtt.allowed_actions]\n"home/tv/set" = ["ON"]\n'), environ={})
    assert config.mqtt.allow_list[GARAGE] == ["OPEN", "CLOSE"] and config.mqtt.allow_list["home/tv/set"] == ["ON"]
    home = Home.from_config(config.mqtt)
    assert home is not None and "[ACTION home/tv/set ON]" in home.prompt()


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ('name = "lamp"\ntopic = "home/lamp/set"\npayloads = []', "payloads"),
        ('name = "lamp"\ntopic = "home/lamp/#"\npayloads = ["ON"]', "wildcards"),
        ('name = "lamp"\ntopic = "home/lamp/set"\npayloads = ["ON"]\nstate_topic = "home/+/state"', "state_topic"),
        ('topic = "home/lamp/set"\npayloads = ["ON"]', "name"),
        ('name = "kitchen light"\ntopic = "home/kitchen/light/set"\npayloads = ["ON"]', "listed twice"),
        ('name = "lamp"\ntopic = "home/lamp/set"\npayloads = ["ON", "+"]', "no letter or digit"),
    ],
)
def test_a_broken_device_entry_names_the_problem_and_the_fix(tmp_path, entry, said):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, DEVICES + "\n[[mqtt.devices]]\n" + entry + "\n"), environ={})
    assert said in str(err.value) and "mqtt.devices" in str(err.value)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "home.toml"
    path.write_text(text)
    return path


# ---- the tool-call format (mqtt.action_format = "tools"): a real Turn over a chat that replies with fixed text ----


class ScriptedChat(ChatHistory):
    """Replies with the given text, a few characters per emission (as tokens come), and keeps the history."""

    def __init__(self, text: str) -> None:
        super().__init__("system")
        self.text = text
        self.last_stats = None
        self.constrained: tuple[str, list[str]] | None = None  # what the turn asked ``constrain`` for
        self.opening: list[str] = []  # ... and what it had the reply open with

    def constrain(self, trigger: str, choices: list[str], opening: list[str] = ()) -> None:  # type: ignore[assignment]
        self.constrained, self.opening = (trigger, choices), list(opening)

    async def reply(self, user_text, settings=None, *, commit=True):
        self._pending = [*self.messages, {"role": "user", "content": user_text}]
        for i in range(0, len(self.text), 3):
            yield Emission(self.text[i : i + 3], [], time.monotonic())


def tool_turn(
    home: Home,
    heard: str,
    text: str,
    tools: list | None = None,
    action_format: str = "tools",
    chat: ScriptedChat | None = None,
) -> tuple[str, list, ScriptedChat]:
    """One turn in the tool-call (or another) format: what was spoken, the events, and the chat (``chat``: go on
    with this one's history)."""
    events: list = []
    if chat is None:
        chat = ScriptedChat(text)
    chat.text = text

    async def run():
        ctx = context(home, chat, events.append, action_format, tools)
        return await Turn(ctx, heard, LatencyTrace(1), speak=False).start().wait()

    done = asyncio.run(run())
    assert done is not None
    return done.reply, events, chat


def context(home: Home, chat: ScriptedChat, emit, action_format: str = "tools", tools: list | None = None):
    """A text-only turn's context over ``chat``, with ``home``'s devices allowed."""
    return TurnContext(
        conversation=chat,
        decode=DecodeSettings(),
        tts=None,  # type: ignore[arg-type]  # text only: nothing is synthesized
        tts_config=TTSConfig(),
        sink=None,
        emit=emit,
        set_state=lambda state: None,
        generation_lock=asyncio.Lock(),
        stats=LatencyStats(),
        turn_timeout_s=30,
        stt_timeout_s=30,
        allowed_actions=home.allowed,
        home=home,
        resolve_device=home.resolve if action_format == "tools" else None,
        constrained=action_format == "constrained",
        tools=tools,
    )


def actions(events: list) -> list[tuple[str, str, bool]]:
    return [(e.topic, e.payload, e.allowed) for e in events if isinstance(e, ActionRequested)]


def call(device: str, value: str) -> str:
    body = json.dumps({"name": ACTION_TOOL, "arguments": {"device": device, "value": value}})
    return f"<tool_call>\n{body}\n</tool_call>"


def test_the_tools_prompt_lists_names_and_values_and_no_marker(tmp_path):
    home = load(tmp_path)
    prompt = home.prompt("tools")
    assert "kitchen light: ON, OFF, 50" in prompt and ACTION_TOOL in prompt and "[ACTION" not in prompt
    assert home.resolve("Garage Door") == GARAGE and home.resolve(GARAGE) == GARAGE
    assert home.resolve("Bedside Light") == BEDROOM  # an alias
    assert home.resolve("kitchen light and counter lights") == "kitchen light and counter lights"  # no one name
    assert home.resolve("nursery lamp") == "nursery lamp"  # no device: no topic, refused
    assert action_tool()["function"]["name"] == ACTION_TOOL


def test_a_tool_call_for_the_named_device_acts_and_is_not_spoken(tmp_path):
    home = load(tmp_path)
    raw = call("Kitchen Light", "on") + "\nDone, it is on."
    spoken, events, chat = tool_turn(home, "turn on the kitchen light", raw)
    assert spoken == "Done, it is on." and actions(events) == [(KITCHEN, "ON", True)]  # the allow-list's spelling
    assert not any(isinstance(e, ToolCallRequested) for e in events)  # no client's call
    assert chat.messages[-1] == {"role": "assistant", "content": raw}  # the history shows the model its own call


def test_a_bare_json_call_counts_too_and_a_topic_for_a_name_is_taken(tmp_path):
    home = load(tmp_path)
    raw = f'{{"name": "{ACTION_TOOL}", "arguments": {{"device": "{GARAGE}", "value": "OPEN"}}}} Opening it.'
    spoken, events, _ = tool_turn(home, "open the garage door", raw)
    assert spoken.strip() == "Opening it." and actions(events) == [(GARAGE, "OPEN", True)]


@pytest.mark.parametrize(
    "heard, raw, refused, said",
    [
        ("turn off the nursery lamp", call("nursery lamp", "OFF"), ("nursery lamp", "OFF"), REFUSED_SPEECH),  # unlisted
        # nothing matched: what the model proposes is asked back, never done
        (
            "turn off the nursery lamp",
            call("bedroom lamp", "OFF"),
            (BEDROOM, "OFF"),
            " Do you want the bedroom lamp off?",
        ),
        ("is the garage door open?", call("garage door", "OPEN"), (GARAGE, "OPEN"), REFUSED_SPEECH),  # never acts
        ("dim the kitchen light", call("kitchen light", "30"), (KITCHEN, "30"), REFUSED_SPEECH),  # no such value
    ],
)
def test_a_tool_call_passes_the_same_checks_as_a_marker_and_a_refusal_is_said(tmp_path, heard, raw, refused, said):
    home = load(tmp_path)
    spoken, events, _ = tool_turn(home, heard, raw + "\nDone, all set.")
    assert actions(events) == [(*refused, False)] and spoken == said.strip()  # the lie is not spoken


def test_a_clients_own_tool_is_still_the_clients_next_to_a_home_call(tmp_path):
    home = load(tmp_path)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    raw = call("kitchen light", "OFF") + '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    _, events, _ = tool_turn(home, "turn off the kitchen light", raw, [weather])
    assert actions(events) == [(KITCHEN, "OFF", True)]
    assert [e.name for e in events if isinstance(e, ToolCallRequested)] == ["get_weather"]


def test_the_tools_format_is_a_config_key_with_constrained_markers_the_default(tmp_path):
    assert load_config(_write(tmp_path, DEVICES), environ={}).mqtt.action_format == "constrained"
    config = load_config(_write(tmp_path, DEVICES + '\n[mqtt]\naction_format = "tools"\n'), environ={})
    assert config.mqtt.action_format == "tools"
    with pytest.raises(ConfigError, match="action_format"):
        load_config(_write(tmp_path, DEVICES + '\n[mqtt]\naction_format = "json"\n'), environ={})


# ---- what the words ask: Home Assistant's matcher over the configured devices ------------------------------------


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
        ("switch the light of the kitchen on", {(KITCHEN, "ON"), (COUNTER, "ON")}),  # an area's lights
        ("turn on the bedside light", {(BEDROOM, "ON")}),  # an alias
        ("turn off the lights in the kitchen", {(KITCHEN, "OFF"), (COUNTER, "OFF")}),
        ("turn off all the lights", {(KITCHEN, "OFF"), (COUNTER, "OFF"), (BEDROOM, "OFF")}),
        ("turn everything off upstairs", {(BEDROOM, "OFF")}),  # a floor; never the garage door
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
    # a clause the matcher has no template for, a name said in part, a value a device takes said oddly
    for said, expected in [
        ("Switch the bedroom lamp on, the kids are coming home.", (BEDROOM, "ON")),
        ("close the garage door, the car is out", (GARAGE, "CLOSE")),
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
        assert home.grammar.answer(answer, ["ON", "OFF"]) is not None, answer
    assert home.answers("Yes.", history) == [] and home.answers("Tommy tongue.", []) == []


def test_the_constrained_format_opens_the_reply_with_the_commands_the_words_decide(tmp_path):
    home = load(tmp_path)
    raw = f"[ACTION {GARAGE} CLOSE] Closing it."
    spoken, events, chat = tool_turn(home, "close the garage door", raw, action_format="constrained")
    assert chat.opening == [f"[ACTION {GARAGE} CLOSE]"] and chat.constrained == ("[ACTION", [f" {GARAGE} CLOSE]"])
    assert spoken == "Closing it." and actions(events) == [(GARAGE, "CLOSE", True)]
    raw = f"[ACTION {KITCHEN} OFF][ACTION {COUNTER} OFF] Done."
    spoken, events, chat = tool_turn(home, "turn off the lights in the kitchen", raw, action_format="constrained")
    assert chat.opening == [f"[ACTION {KITCHEN} OFF][ACTION {COUNTER} OFF]"]
    assert actions(events) == [(KITCHEN, "OFF", True), (COUNTER, "OFF", True)]
    _, _, chat = tool_turn(home, "is the garage door open?", "It is open.", action_format="constrained")
    assert chat.constrained == ("[ACTION", []) and chat.opening == []
    _, _, chat = tool_turn(home, "turn off the kitchen light in ten minutes", "Sorry.", action_format="constrained")
    assert chat.opening == ["Sorry, I can only do that now, not at a later time."]

    # a reply begun early on the pause's transcript (the eager end of turn) is constrained the same way
    async def early(heard: str) -> ScriptedChat:
        chat = ScriptedChat(raw)
        reply = EarlyReply(context(home, chat, lambda event: None, "constrained"), heard)
        await reply.generated()
        await reply.discard()
        return chat

    chat = asyncio.run(early("Close the garage door."))
    assert chat.opening == [f"[ACTION {GARAGE} CLOSE]"]
    _, _, chat = tool_turn(home, "close the garage door", raw, action_format="markers")
    assert chat.constrained is None  # the markers format is the model's alone


def test_a_question_back_is_the_history_and_the_next_turns_answer_completes_it(tmp_path):
    home = load(tmp_path)
    spoken, events, chat = tool_turn(home, "Garage door.", f"[ACTION {GARAGE} OPEN] Done.", action_format="markers")
    assert spoken == "Do you want the garage door open?" and actions(events) == [(GARAGE, "OPEN", False)]
    assert chat.messages[-1] == {"role": "assistant", "content": spoken}  # what was said, not the refused marker
    spoken, events, chat = tool_turn(
        home, "Yes.", f"[ACTION {GARAGE} OPEN] Done.", action_format="constrained", chat=chat
    )
    assert spoken == "Done." and actions(events) == [(GARAGE, "OPEN", True)]
    assert chat.messages[-2] == {"role": "user", "content": "Yes. (the garage door open)"}  # as the model saw it


EVERYDAY = """
[llm]
mode = "target"

[[mqtt.devices]]
name = "kitchen light"
topic = "home/kitchen/light/set"
payloads = ["ON", "OFF", "50"]
area = "kitchen"
floor = "downstairs"

[[mqtt.devices]]
name = "garage door"
topic = "home/garage/door/set"
payloads = ["OPEN", "CLOSE"]
area = "garage"
floor = "downstairs"

[[mqtt.devices]]
name = "coffee machine"
topic = "home/kitchen/coffee/set"
payloads = ["ON", "OFF"]
area = "kitchen"
floor = "downstairs"

[[mqtt.devices]]
name = "living room blinds"
topic = "home/living_room/blinds/set"
payloads = ["OPEN", "CLOSE", "50"]
area = "living room"
floor = "downstairs"

[[mqtt.devices]]
name = "porch light"
topic = "home/porch/light/set"
payloads = ["ON", "OFF"]
area = "porch"
domain = "light"
floor = "downstairs"

[[mqtt.devices]]
name = "front door lock"
topic = "home/hall/lock/set"
payloads = ["LOCK", "UNLOCK"]
area = "hall"
floor = "downstairs"

[[mqtt.devices]]
name = "bedroom fan"
topic = "home/bedroom/fan/set"
payloads = ["ON", "OFF"]
area = "bedroom"
domain = "fan"
floor = "upstairs"
"""
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
        # asked back: a clause it has no sentence for, a name said in part
        ("Switch the porch light on, the kids are coming home.", False, {(PORCH, "ON")}),
        ("lock the front door", False, {(LOCK, "LOCK")}),
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
    said = "switch off the lights in the kitchen, it's late"
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
