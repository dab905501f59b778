"""The named home (mqtt.devices): its system prompt, its allow-list, a broken device entry refused with its fix,
and the action formats (markers, tool calls, constrained markers) through a real Turn over a chat that replies with
given text. What the words ask is tests/test_home_understanding.py."""

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
from voice.dialog.home import LATER_SPEECH, Home
from voice.dialog.turn import EarlyReply, Turn, TurnContext
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
        local=chat,  # it can be constrained, as a local model's chat can
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
    assert chat.opening == [LATER_SPEECH.strip()]

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
