"""The named home (mqtt.devices): its system prompt, the grounding of a reply's actions in the user's words, the
state shown when the user asks about state, and a broken device entry refused with its fix. Real parts only: the
config loader, the marker parser and voice/dialog/home.py (no model: what the model writes is given here); and the
tool-call format (mqtt.action_format = "tools") through a real Turn, over a chat that replies with given text."""

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
from voice.dialog.actions import ACTION_TOOL, REFUSED_SPEECH, ActionParser, Refusal, action_tool
from voice.dialog.home import Home, constrained_commands, guessed_as
from voice.dialog.turn import EarlyReply, Turn, TurnContext
from voice.dialog.wording import asked_values, asks_state, words
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

[[mqtt.devices]]
name = "bedroom lamp"
topic = "home/bedroom/lamp/set"
payloads = ["ON", "OFF"]
area = "bedroom"
state_topic = "home/bedroom/lamp/state"

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


def test_a_command_acts_once_on_the_device_the_words_name(tmp_path):
    home = load(tmp_path)
    # the model copies the prompt's list: only the first command for the kitchen light goes out
    spoken, requests = reply(home, "turn on the kitchen light", f"[ACTION {KITCHEN} ON][ACTION {KITCHEN} OFF] Done.")
    assert spoken == " Done." and requests == [(KITCHEN, "ON", True)]


def test_an_area_and_a_kind_name_every_such_device_there(tmp_path):
    home = load(tmp_path)
    _, requests = reply(home, "switch off the lights in the kitchen", f"[ACTION {KITCHEN} OFF][ACTION {COUNTER} OFF]")
    assert requests == [(KITCHEN, "OFF", True), (COUNTER, "OFF", True)]


def test_one_device_named_in_full_does_not_name_its_neighbours_of_the_same_kind(tmp_path):
    home = load(tmp_path)
    spoken, requests = reply(home, "activate the kitchen light lamp", f"[ACTION {COUNTER} ON][ACTION {KITCHEN} ON]")
    assert spoken == REFUSED_SPEECH and requests == [(COUNTER, "ON", False), (KITCHEN, "ON", True)]


def test_an_action_on_a_device_the_user_did_not_name_is_refused_and_said(tmp_path):
    home = load(tmp_path)
    spoken, requests = reply(home, "turn off the nursery lamp", f"[ACTION {BEDROOM} OFF] Done, it is off.")
    assert spoken == REFUSED_SPEECH and requests == [(BEDROOM, "OFF", False)]


@pytest.mark.parametrize(
    "heard, raw, allowed",
    [
        ("Turn Coffee machine to light. kitchen light", f"[ACTION {KITCHEN} ON]", "ask"),  # tiny.en's "to off"
        ("This might look garage door closed at our garage.", f"[ACTION {GARAGE} OPEN]", False),
        ("Lower the garage door.", f"[ACTION {GARAGE} OPEN]", False),
        ("Lower the garage door.", f"[ACTION {GARAGE} CLOSE]", True),
        ("deactivate the bedroom lamp", f"[ACTION {BEDROOM} OFF]", True),
        ("light up the bedroom lamp", f"[ACTION {BEDROOM} ON]", True),
        ("set the kitchen light to 50%", f"[ACTION {KITCHEN} 50]", True),
        ("set the kitchen light to 25%", f"[ACTION {KITCHEN} 50]", False),
        # Home Assistant's "(close|shut|lower) [(up|down)]": "up" asks for nothing when "lower" asks for CLOSE
        ("lower up the garage door", f"[ACTION {GARAGE} OPEN]", False),
        ("lower up the garage door", f"[ACTION {GARAGE} CLOSE]", True),
        ("raise up the garage door", f"[ACTION {GARAGE} OPEN]", True),
        ("turn up the kitchen light to 50%", f"[ACTION {KITCHEN} ON]", False),
        ("turn up the kitchen light to 50%", f"[ACTION {KITCHEN} 50]", True),
    ],
)
def test_an_action_goes_out_only_with_a_value_the_words_ask_for(tmp_path, heard, raw, allowed):
    """``allowed``: True (done), False (refused), "ask" (refused, and asked back: the words name no value)."""
    spoken, requests = reply(load(tmp_path), heard, raw + " Done.")
    assert requests == [(*raw[len("[ACTION ") : -1].split(" "), allowed is True)]
    asked = " Do you want the kitchen light on or off?"
    assert spoken == {True: " Done.", False: REFUSED_SPEECH, "ask": asked}[allowed]


def test_a_device_named_without_a_value_is_asked_back_and_the_answer_completes_it(tmp_path):
    home = load(tmp_path)
    spoken, requests = reply(home, "Garage door.", f"[ACTION {GARAGE} OPEN] Done.")  # tiny.en lost "open"
    assert requests == [(GARAGE, "OPEN", False)] and spoken == " Do you want the garage door open or closed?"
    history = [{"role": "user", "content": "Garage door."}, {"role": "assistant", "content": spoken.strip()}]
    assert home.follow_up("Closed, please.", history) == "Closed, please. (the garage door)"
    parser = ActionParser(home.allowed, home.grounding("Closed, please.", history), once_per_topic=True)
    assert parser.push(f"[ACTION {GARAGE} CLOSE] Done.") == " Done." and parser.requests[0].allowed
    # an answer that is no value, names a device of its own, or follows some other reply is taken as it is
    assert home.follow_up("What time is it?", history) == "What time is it?"
    assert home.follow_up("open the bedroom lamp", history) == "open the bedroom lamp"
    assert home.follow_up("Closed.", [*history, {"role": "user", "content": "x"}]) == "Closed."
    assert home.follow_up("Closed.", [{"role": "assistant", "content": "The garage door is open."}]) == "Closed."
    # in the constrained format only the answer's value of the asked device can be decoded
    assert constrained_commands(home, "Closed.", history) == {GARAGE: ["CLOSE"]}
    # without named devices nothing is constrained: forcing the allow-list would turn a refusal into a command
    assert constrained_commands(None, "Unlock the front door.") == {}


def test_a_question_about_state_never_acts(tmp_path):
    home = load(tmp_path)
    spoken, requests = reply(home, "is the garage door open?", f"[ACTION {GARAGE} OPEN] It is open now.")
    assert spoken == REFUSED_SPEECH and requests == [(GARAGE, "OPEN", False)]
    assert asks_state("What's the state of the printer") and asks_state("which lights are on")
    assert not asks_state("can you open the garage door") and not asks_state("turn on the kitchen light")


def test_state_is_shown_with_a_question_only(tmp_path):
    home = load(tmp_path)
    assert home.set_state("home/garage/door/state", " open\n") and not home.set_state("home/other/state", "x")
    assert home.annotate("is the garage door open") == (
        "is the garage door open\n(state now: garage door = open; so the answer is yes)"
    )
    assert home.annotate("Is the garage door closed?").endswith("(state now: garage door = open; so the answer is no)")
    assert home.annotate("is the garage door open or closed").endswith("(state now: garage door = open)")
    assert home.annotate("open the garage door") == "open the garage door"
    # a kind without a place: every such device with a state topic; nothing heard yet is said as unknown
    assert home.annotate("which lights are on?").endswith("(state now: kitchen light = unknown)")


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
    assert home.resolve("the bedroom lamp light") == BEDROOM  # the one device whose name's words were all written
    assert home.resolve("kitchen light and counter lights") == "kitchen light and counter lights"  # two fit: none
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
    "heard, raw, refused",
    [
        ("turn off the nursery lamp", call("nursery lamp", "OFF"), ("nursery lamp", "OFF")),  # not on the list
        ("turn off the nursery lamp", call("bedroom lamp", "OFF"), (BEDROOM, "OFF")),  # not what the user named
        ("is the garage door open?", call("garage door", "OPEN"), (GARAGE, "OPEN")),  # a question never acts
        ("dim the kitchen light", call("kitchen light", "30"), (KITCHEN, "30")),  # no such value
    ],
)
def test_a_tool_call_passes_the_same_checks_as_a_marker_and_a_refusal_is_said(tmp_path, heard, raw, refused):
    home = load(tmp_path)
    spoken, events, _ = tool_turn(home, heard, raw + "\nDone, all set.")
    assert actions(events) == [(*refused, False)] and spoken == REFUSED_SPEECH.strip()  # the lie is not spoken


def test_a_clients_own_tool_is_still_the_clients_next_to_a_home_call(tmp_path):
    home = load(tmp_path)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    raw = call("kitchen light", "OFF") + '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    _, events, _ = tool_turn(home, "turn off the kitchen light and what is the weather", raw, [weather])
    assert actions(events) == [(KITCHEN, "OFF", True)]
    assert [e.name for e in events if isinstance(e, ToolCallRequested)] == ["get_weather"]


def test_the_tools_format_is_a_config_key_with_constrained_markers_the_default(tmp_path):
    assert load_config(_write(tmp_path, DEVICES), environ={}).mqtt.action_format == "constrained"
    config = load_config(_write(tmp_path, DEVICES + '\n[mqtt]\naction_format = "tools"\n'), environ={})
    assert config.mqtt.action_format == "tools"
    with pytest.raises(ConfigError, match="action_format"):
        load_config(_write(tmp_path, DEVICES + '\n[mqtt]\naction_format = "json"\n'), environ={})


def test_the_constrained_format_decodes_only_the_named_devices_commands_after_the_keyword(tmp_path):
    home = load(tmp_path)
    raw = f"[ACTION {GARAGE} OPEN] Opening it."
    spoken, events, chat = tool_turn(home, "open the garage door", raw, action_format="constrained")
    assert spoken == "Opening it." and actions(events) == [(GARAGE, "OPEN", True)]  # markers, as ever
    assert chat.constrained == ("[ACTION", [f" {GARAGE} OPEN]"])  # the named device's values that were asked for
    _, _, chat = tool_turn(home, "lower the garage door", f"[ACTION {GARAGE} CLOSE]", action_format="constrained")
    assert chat.constrained == ("[ACTION", [f" {GARAGE} CLOSE]"])
    _, _, chat = tool_turn(home, "lower up the garage door", f"[ACTION {GARAGE} CLOSE]", action_format="constrained")
    assert chat.constrained == ("[ACTION", [f" {GARAGE} CLOSE]"])  # "up" is part of Home Assistant's close
    _, _, chat = tool_turn(home, "is the garage door open?", "It is open.", action_format="constrained")
    assert chat.constrained == ("[ACTION", [])  # a question: nothing to choose (the parser refuses any marker)
    assert chat.opening == []


def test_a_command_the_words_decide_alone_opens_the_reply(tmp_path):
    """One device named, one of its values asked for (let through, or asked back), nothing hedging it: the reply
    opens with its marker (the model writes it, constrained, then goes on freely). Named with no value: one of its
    values opens the reply, and the grounding makes it the question back. Anything else is the model's to decide."""
    home = load(tmp_path)
    assert home.opening("lower up the garage door") == [(GARAGE, "CLOSE")]
    assert home.opening("Bedroom lamp off.") == [(BEDROOM, "OFF")]  # typed: taken as written
    assert home.opening("Bedroom lamp off.", spoken=True) == [(BEDROOM, "OFF")]  # heard: the grounding asks back
    assert home.grounding("Bedroom lamp off.", spoken=True)(BEDROOM, "OFF").asks_back  # type: ignore[union-attr]
    assert home.opening("Garage door, please.") == [(GARAGE, "OPEN"), (GARAGE, "CLOSE")]  # the question back
    history = [{"role": "assistant", "content": "Do you want the bedroom lamp off?"}]
    assert home.opening("Yes.", history, spoken=True) == [(BEDROOM, "OFF")]  # the answer to a question back
    for free in [
        "Could you turn the bedroom lamp off?",  # "?": the model reads it
        "is the garage door open",  # a question about state
        "don't open the garage door",
        "open the garage door when I'm home",
        "turn on the kitchen light and the bedroom lamp",  # two devices
        "switch the garage door open or closed",  # two values
        "turn on the printer",  # no such device
        "set the kitchen light to 25%",  # a value it cannot take: refused, no question
    ]:
        assert home.opening(free) == [], free
    # through a real Turn: the opening is the whole marker, the choices after "[ACTION" are as before
    raw = f"[ACTION {GARAGE} CLOSE] Closing it."
    spoken, events, chat = tool_turn(home, "lower the garage door", raw, action_format="constrained")
    assert chat.opening == [f"[ACTION {GARAGE} CLOSE]"] and chat.constrained == ("[ACTION", [f" {GARAGE} CLOSE]"])
    assert spoken == "Closing it." and actions(events) == [(GARAGE, "CLOSE", True)]
    _, _, chat = tool_turn(home, "don't open the garage door", "I won't.", action_format="constrained")
    assert chat.opening == [] and chat.constrained == ("[ACTION", [f" {GARAGE} OPEN]"])

    # a reply begun early on the pause's transcript (the eager end of turn) is constrained the same way, as spoken
    async def early(heard: str) -> ScriptedChat:
        chat = ScriptedChat(raw)
        reply = EarlyReply(context(home, chat, lambda event: None, "constrained"), heard)
        await reply.generated()
        await reply.discard()
        return chat

    chat = asyncio.run(early("Lower the garage door."))
    assert chat.opening == [f"[ACTION {GARAGE} CLOSE]"] and chat.constrained == ("[ACTION", [f" {GARAGE} CLOSE]"])
    assert asyncio.run(early("Do you want the garage door closed?")).opening == []
    # the markers format is the model's alone
    _, _, chat = tool_turn(home, "lower the garage door", raw, action_format="markers")
    assert chat.constrained is None


def test_a_question_back_is_the_history_and_the_next_turns_value_completes_it(tmp_path):
    home = load(tmp_path)
    spoken, events, chat = tool_turn(home, "Garage door.", f"[ACTION {GARAGE} OPEN] Done.", action_format="markers")
    assert spoken == "Do you want the garage door open or closed?" and actions(events) == [(GARAGE, "OPEN", False)]
    assert chat.messages[-1] == {"role": "assistant", "content": spoken}  # what was said, not the refused marker
    spoken, events, chat = tool_turn(
        home, "Closed.", f"[ACTION {GARAGE} CLOSE] Done.", action_format="constrained", chat=chat
    )
    assert spoken == "Done." and actions(events) == [(GARAGE, "CLOSE", True)]
    assert chat.messages[-2] == {"role": "user", "content": "Closed. (the garage door)"}  # as the model saw it
    assert chat.constrained == ("[ACTION", [f" {GARAGE} CLOSE]"])


def test_a_heard_command_without_a_request_word_is_confirmed_first_and_yes_does_it(tmp_path):
    """tiny.en can lose a question's first word ("are our bedside lamp off" heard as "Or our Bedside lamp off."):
    spoken without a request word, a command is asked back; typed (an MQTT ask), it is done; "Yes." does it."""
    home = load(tmp_path)
    check = home.grounding("Or our bedroom lamp off.", [], spoken=True)
    assert check(BEDROOM, "OFF") == Refusal(
        "heard no request word in 'Or our bedroom lamp off.': asked back", " Do you want the bedroom lamp off?"
    )
    assert home.grounding("Or our bedroom lamp off.", [], spoken=False)(BEDROOM, "OFF") is None
    assert home.grounding("Please, bedroom lamp off.", [], spoken=True)(BEDROOM, "OFF") is None
    assert home.grounding("Light up the bedroom lamp.", [], spoken=True)(BEDROOM, "ON") is None
    # a value word requests only before the device's name: "is my ... garage door open" heard as "It's my ..."
    assert home.grounding("Open the garage door.", [], spoken=True)(GARAGE, "OPEN") is None
    assert home.grounding("It's my garage door open.", [], spoken=True)(GARAGE, "OPEN").asks_back  # type: ignore[union-attr]
    # ... and only for a value the device has: "are there our office light off" heard as "Add the lower office ..."
    assert home.grounding("Add the lower bedroom lamp off.", [], spoken=True)(BEDROOM, "OFF").asks_back  # type: ignore[union-attr]
    assert home.grounding("Lower the garage door.", [], spoken=True)(GARAGE, "CLOSE") is None
    history = [{"role": "assistant", "content": "Do you want the bedroom lamp off?"}]
    assert home.follow_up("Yes.", history) == "Yes. (the bedroom lamp off)"
    assert home.grounding("Yes.", history, spoken=True)(BEDROOM, "OFF") is None
    assert home.grounding("Yes.", history, spoken=True)(BEDROOM, "ON") is not None
    assert home.follow_up("No, on.", history) == "No, on. (the bedroom lamp)"
    assert home.follow_up("No.", history) == "No."  # nothing is done
    choice = [{"role": "assistant", "content": "Do you want the garage door open or closed?"}]
    assert home.follow_up("Yes.", choice) == "Yes."  # a yes to a choice chooses nothing


def test_a_spoken_name_that_only_sounds_like_a_device_is_asked_back_and_yes_does_it(tmp_path):
    """Whisper mishears names ("Close my garbage door.", "Tb socket"): spoken, the words that name no device but are
    spelled like one name it, and the command is asked back; typed, or not like any one device, they name none."""
    home = load(tmp_path)
    heard = home.hear("Close my garbage door.", [], spoken=True)
    assert heard.text == "Close my garbage door. (the garage door)" and heard.guessed is not None
    check = home.grounding("Close my garbage door.", [], spoken=True)
    assert check(GARAGE, "CLOSE") == Refusal(
        "heard 'Close my garbage door. (the garage door)', not for certain: asked back",
        " Do you want the garage door closed?",
    )
    assert home.opening("Close my garbage door.", [], spoken=True) == [(GARAGE, "CLOSE")]  # opens with the question
    history = [{"role": "assistant", "content": "Do you want the garage door closed?"}]
    assert home.grounding("Yes.", history, spoken=True)(GARAGE, "CLOSE") is None
    assert home.grounding("Close my garbage door.", [], spoken=False)(GARAGE, "CLOSE") is not None  # typed: no guess
    assert home.opening("Close my garbage door.", [], spoken=False) == []
    for said in (
        "The kitchen is a mess.",  # an area is no device
        "Switch the aquarium light in my living room on.",  # not like any one device
        "Is my garbage door closed?",  # a question never acts
        "The garbage truck came.",  # asks for nothing
    ):
        assert not home.hear(said, [], spoken=True).guessed, said


@pytest.mark.parametrize(
    "said, values",
    [
        ("switch off our garage light on my garage", ["OFF"]),  # Home Assistant's "[in|on] <area>"
        ("turn the kitchen light lamp on the kitchen to off", ["OFF"]),
        ("set brightness on kitchen light 50", ["50"]),  # a number is a brightness: "on" is no other value
        ("turn on the kitchen light", ["ON"]),
        ("turn the kitchen light on and off", ["ON", "OFF"]),
        ("turn on the kitchen light and turn off the fan", ["ON", "OFF"]),  # a verb's "on" is no place
    ],
)
def test_on_before_a_place_asks_for_no_value(said, values):
    assert asked_values(["ON", "OFF", "50"], words(said)) == values


def test_spoken_words_that_ask_for_two_values_are_asked_back_typed_ones_left_to_the_model(tmp_path):
    home = load(tmp_path)
    said = "Turn the bedroom lamp on and off."
    assert home.grounding(said, [], spoken=True)(BEDROOM, "OFF") == Refusal(
        f"heard {said!r}, not for certain: asked back", " Do you want the bedroom lamp on or off?"
    )
    assert home.opening(said, [], spoken=True) == [(BEDROOM, "ON"), (BEDROOM, "OFF")]
    assert home.opening(said, [], spoken=False) == [] and home.grounding(said)(BEDROOM, "OFF") is None


def test_after_a_question_back_the_recogniser_may_choose_among_its_answers(tmp_path):
    home = load(tmp_path)
    choice = [{"role": "assistant", "content": "Done. Do you want the garage door open or closed?"}]
    assert home.asked_back(choice) == (home.devices[3], ["OPEN", "CLOSE"])
    proposed = [{"role": "assistant", "content": "Do you want the kitchen light set to 50?"}]
    assert home.asked_back(proposed) == (home.devices[0], ["50"])
    assert home.follow_up("Yes.", proposed) == "Yes. (the kitchen light set to 50)"
    assert home.asked_back([{"role": "assistant", "content": "The garage door is open."}]) is None
    # heard as nothing that answers: the question's values said the common ways, and no
    answers = home.answers("Go say it, please.", choice)
    assert answers[:3] == ["Open.", "Open, please.", "Open it."] and "Close it, please." in answers
    assert "Closed." in answers and answers[-2:] == ["No.", "No, thanks."] and "Yes." not in answers
    assert "Yes, please." in home.answers("Yet peace.", proposed)
    assert "Set it to 50 percent." in home.answers("Yet peace.", proposed)
    assert "Turn it off, please." in home.answers("Yet peace.", proposed)  # another of its values answers it too
    for heard in ("Close it.", "No, leave it.", "Open the kitchen light."):  # an answer, a no, a new command
        assert home.answers(heard, choice) == [], heard
    assert home.answers("Go say it, please.", []) == []


def test_a_spoken_command_that_names_another_area_is_asked_back(tmp_path):
    """Whisper, hinted with the device names, heard "switch on the living room aquarium light" (not listed) as
    "Switch on the Living room, Bedroom light light.": a device and another area's name are confirmed first."""
    home = load(tmp_path)
    said = "Switch on the kitchen, bedroom lamp lamp."
    refusal = home.grounding(said, [], spoken=True)(BEDROOM, "ON")
    assert refusal is not None and refusal.speech == " Do you want the bedroom lamp on?"
    assert home.grounding("Switch on the bedroom lamp in the bedroom.", [], spoken=True)(BEDROOM, "ON") is None
    assert home.grounding(said, [], spoken=False)(BEDROOM, "ON") is None  # typed: as written
    both = "Turn on the kitchen light. And the bedroom lamp too."  # two devices: both their areas
    assert home.grounding(both, [], spoken=True)(BEDROOM, "ON") is None
    mixed = "Turn on the kitchen light and turn off the bedroom lamp."  # two values, one for each device
    assert home.grounding(mixed, [], spoken=True)(KITCHEN, "ON") is None
    assert home.grounding(mixed, [], spoken=True)(BEDROOM, "OFF") is None


def test_a_question_back_says_the_devices_state_first_when_one_has_come(tmp_path):
    """ "are our bedroom lamp off" heard as "Or our bedroom lamp off." is confirmed as a command; the state it may
    have asked for is said first, and "Yes." still does the command."""
    home = load(tmp_path)
    home.set_state("home/bedroom/lamp/state", "ON")
    question = " The bedroom lamp is on. Do you want the bedroom lamp off?"
    assert home.grounding("Or our bedroom lamp off.", [], spoken=True)(BEDROOM, "OFF") == Refusal(
        "heard no request word in 'Or our bedroom lamp off.': asked back", question
    )
    history = [{"role": "assistant", "content": question.strip()}]
    assert home.grounding("Yes.", history, spoken=True)(BEDROOM, "OFF") is None
    assert home.ask(home.devices[1]) == " Do you want the counter lights on or off?"  # no state has come
    home.set_state("home/kitchen/light/state", "OFF")
    assert home.ask(home.devices[0], ["ON"]) == " The kitchen light is off. Do you want the kitchen light on?"
    home.set_state("home/kitchen/light/state", "50")  # a brightness
    assert home.ask(home.devices[0], ["ON"]) == " The kitchen light is at 50. Do you want the kitchen light on?"


def test_heard_words_whose_value_may_be_a_mishearing_are_asked_back(tmp_path):
    """tiny.en hears "deactivate the bedroom lamp" as "The activate the bedroom lamp." and "... lamp on the bedroom
    to off" as "... lamp on the bedroom door.": both had switched the device ON in `bench home`; now they ask."""
    home = load(tmp_path)
    assert asked_values(["ON", "OFF"], words("The activate the bedroom lamp.")) == ["ON", "OFF"]
    assert asked_values(["ON", "OFF"], words("Activate the bedroom lamp.")) == ["ON"]
    refusal = home.grounding("The activate the bedroom lamp.", [], spoken=True)(BEDROOM, "ON")
    assert refusal is not None and refusal.speech == " Do you want the bedroom lamp on or off?"
    said = "Turn the bedroom lamp on the bedroom door."
    refusal = home.grounding(said, [], spoken=True)(BEDROOM, "ON")
    assert refusal is not None and refusal.speech == " Do you want the bedroom lamp on?"
    assert home.opening(said, [], spoken=True) == [(BEDROOM, "ON")]  # opens with the question back
    assert home.grounding(said, [], spoken=False)(BEDROOM, "ON") is None  # typed: as written
    for meant in ("Turn the bedroom lamp on.", "Turn on the bedroom lamp.", "Switch the bedroom lamp on, please."):
        assert home.grounding(meant, [], spoken=True)(BEDROOM, "ON") is None, meant
    assert home.grounding("Turn the bedroom lamp off on the bedroom.", [], spoken=True)(BEDROOM, "OFF") is None


def test_spoken_words_that_name_no_device_are_offered_said_with_each_name_the_audio_may_have_held(tmp_path):
    """Home.renamings: what the recogniser scores against the audio (voice/dialog/rehearing.py, tested on real
    audio in tests/test_stt.py); a name it chooses comes back as a guess, which is asked back."""
    home = load(tmp_path)
    offered = home.renamings("Turn off the memory lamp.")
    assert offered == {"Turn off bedroom lamp.": home.devices[2]}  # "the memory lamp" spelled most like it
    for said in (
        "Turn off the bedroom lamp.",  # names a device
        "Is the memory lamp on?",  # a question about state
        "Don't turn off the memory lamp.",  # hedged: the model reads it
        "The memory lamp.",  # asks nothing
    ):
        assert home.renamings(said) == {}, said
    history = [{"role": "assistant", "content": "Do you want the bedroom lamp on or off?"}]
    assert home.renamings("Off.", history) == {}  # an answer to the question back
    guess = guessed_as("Turn off the memory lamp.", home.devices[2])
    assert home.hear(guess, [], spoken=True).guessed == home.devices[2]
    assert home.grounding(guess, [], spoken=True)(BEDROOM, "OFF").asks_back  # type: ignore[union-attr]
    assert home.hear(guess, [], spoken=False).guessed is None  # typed words are never guessed


def test_a_name_is_its_words_in_a_row_or_the_one_device_of_its_kind_in_the_area_named(tmp_path):
    """ "Light up minor, Ceiling lamp in nursery." (a nursery lamp, not listed) had switched the ceiling light on:
    its words were all there, not in a row. "the lamp in the bedroom" still names the bedroom's one lamp."""
    home = load(tmp_path)
    assert home.named("Lamp up the bedroom, please.") == []
    assert home.named("Turn off the lamp in the bedroom.") == [home.devices[2]]
    assert home.named("Turn off the reading lamp in the bedroom.") == []  # another lamp, not listed
    assert home.named("Turn off the light in the kitchen.") == []  # two lights there: which one?
    assert home.named("Turn off the lights in the kitchen.") == home.devices[:2]  # both
    assert home.grounding("Lamp up the bedroom, please.", [], spoken=True)(BEDROOM, "ON") is not None
