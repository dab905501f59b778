"""The named home (mqtt.devices): its system prompt, the grounding of a reply's actions in the user's words, the
state shown when the user asks about state, and a broken device entry refused with its fix. Real parts only: the
config loader, the marker parser and voice/dialog/home.py (no model: what the model writes is given here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from voice.config import ConfigError, load_config
from voice.dialog.actions import REFUSED_SPEECH, ActionParser
from voice.dialog.home import Home, asks_state

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
