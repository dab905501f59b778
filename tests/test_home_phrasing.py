"""Requests said the many ways people say them, read by the home's matcher (voice/dialog/understanding.py over
Home Assistant's and our sentence data): valves, players and covers with their own verbs, names with their room,
a name said first and then "it", reasons beside a request, and conditions and negations that never act now."""

from __future__ import annotations

import pytest

from voice.dialog.devices import HomeDevice
from voice.dialog.home import Home
from voice.dialog.understanding import Act, Later, NoMatch


def _patio() -> Home:
    """A valve, an awning and a light outside, a speaker and a lamp inside."""
    return Home(
        [
            HomeDevice(
                "sprinkler valve", "h/patio/valve/set", ("OPEN", "CLOSE"), "patio", None, "valve", ("sprinklers",)
            ),
            HomeDevice("patio awning", "h/patio/awning/set", ("OPEN", "CLOSE", "50"), "patio", None, "cover"),
            HomeDevice("string lights", "h/patio/lights/set", ("ON", "OFF"), "patio", None, "light"),
            HomeDevice("lounge speaker", "h/lounge/speaker/set", ("PLAY", "PAUSE"), "lounge", None, "media_player"),
            HomeDevice("reading lamp", "h/lounge/lamp/set", ("ON", "OFF"), "lounge", None, "light"),
        ]
    )


@pytest.mark.parametrize(
    "said, expected",
    [
        ("fire up the sprinklers", {("sprinkler valve", "OPEN")}),  # on and off verbs open and close a valve
        ("shut the sprinklers off", {("sprinkler valve", "CLOSE")}),
        ("play the lounge speaker", {("lounge speaker", "PLAY")}),
        ("kill the music in the lounge", {("lounge speaker", "PAUSE")}),
        ("patio awning halfway out", {("patio awning", "50")}),
        ("close everything on the patio", {("sprinkler valve", "CLOSE"), ("patio awning", "CLOSE")}),  # no light
        ("pop the reading lamp on in the lounge", {("reading lamp", "ON")}),  # a name with its own room
        ("make sure the patio awning is closed", {("patio awning", "CLOSE")}),
    ],
)
def test_valves_media_covers_and_names_with_their_room(said, expected):
    understood = _patio().understand(said)
    assert isinstance(understood, Act) and understood.certain, understood
    assert {(c.device.name, c.payload) for c in understood.commands} == expected


@pytest.mark.parametrize("said", ["turn on the reading lamp in the patio", "check the awning is closed"])
def test_a_name_in_a_room_it_is_not_in_or_a_check_never_acts(said):
    understood = _patio().understand(said)
    assert not (isinstance(understood, Act) and understood.certain), understood


def _laundry() -> Home:
    """A dryer and a printer (switches), a shutter, a speaker and a light."""
    return Home(
        [
            HomeDevice("tumble dryer", "h/laundry/dryer/set", ("ON", "OFF"), "laundry", None, "switch"),
            HomeDevice("printer", "h/office/printer/set", ("ON", "OFF"), "office", None, "switch"),
            HomeDevice(
                "roller shutter", "h/dining/shutter/set", ("OPEN", "CLOSE", "25", "75"), "dining", None, "cover"
            ),
            HomeDevice("gym speaker", "h/gym/speaker/set", ("PLAY", "PAUSE"), "gym", None, "media_player"),
            HomeDevice("bunk bed light", "h/kids/bunk/set", ("ON", "OFF", "60"), "kids room", None, "light"),
        ]
    )


@pytest.mark.parametrize(
    "said, expected",
    [
        ("start the tumble dryer", {("tumble dryer", "ON")}),  # "start" of a switch: never a media command
        ("disconnect the printer please", {("printer", "OFF")}),
        ("close the bunk bed light", {("bunk bed light", "OFF")}),  # open and close for on and off, as many say
        ("put some music on the gym speaker", {("gym speaker", "PLAY")}),
        ("ok so the roller shutter, put it at 75 percent", {("roller shutter", "75")}),  # the name first, then "it"
        ("the bunk bed light, flick it on, they're scared of the dark", {("bunk bed light", "ON")}),
        ("kick the tumble dryer on, the towels are still damp", {("tumble dryer", "ON")}),  # no "till" in "still"
        ("mind if we turn the printer on? it's cold", {("printer", "ON")}),  # "if" of a request, no condition
        ("is it possible to lower the roller shutter halfway", set()),  # 50 is not among its payloads
    ],
)
def test_requests_said_other_ways_round_or_with_other_verbs_act(said, expected):
    understood = _laundry().understand(said)
    if not expected:
        assert not isinstance(understood, Act), understood
        return
    assert isinstance(understood, Act) and understood.certain, understood
    assert {(c.device.name, c.payload) for c in understood.commands} == expected


@pytest.mark.parametrize(
    "said, reading",
    [
        ("turn off the printer when the job is done", Later),
        ("if the printer is still on at nine, switch off the printer", Later),
        ("if the printer is still on at nine, switch it off", NoMatch),  # no device in the request: the model
        ("the printer, don't switch it off", NoMatch),
        ("start the tumble dryer, she told me", NoMatch),
    ],
)
def test_conditions_and_negations_said_other_ways_round_never_act(said, reading):
    assert isinstance(_laundry().understand(said), reading), said
