"""`specvoice bench home`: the case file is checked with errors that say the fix, the default cases come from Home
Assistant's sentences and stay on the device list, and a real run writes one honest record per case."""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from voice.app.cli import main as cli
from voice.events import ActionRequested
from voice.home_casefile import (
    DEFAULT_CASES,
    HELD_OUT_CASES,
    Case,
    CaseFile,
    CaseFileError,
    Device,
    Result,
    answer_for,
    load_cases,
    parse_cases,
    published_actions,
    state_answered,
)

GOOD = {
    "devices": [
        {
            "name": "kitchen light",
            "topic": "home/kitchen/light/set",
            "payloads": ["ON", "OFF"],
            "area": "kitchen",
            "state_topic": "home/kitchen/light/state",
        },
        {"name": "garage door", "topic": "home/garage/door/set", "payloads": ["OPEN", "CLOSE"]},
    ],
    "cases": [
        {"say": "turn on the kitchen light", "expect": {"topic": "home/kitchen/light/set", "payload": "ON"}},
        {"say": "what's the weather like", "expect": None, "intent": "chitchat"},
        {
            "say": "is the kitchen light on",
            "expect": None,
            "intent": "HassGetState",
            "state": {"home/kitchen/light/state": "OFF"},
        },
    ],
}


def test_a_good_file_loads_with_its_allow_list(tmp_path):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(GOOD))
    cases = load_cases(path)
    assert cases.allowed == {"home/kitchen/light/set": ["ON", "OFF"], "home/garage/door/set": ["OPEN", "CLOSE"]}
    assert cases.devices[0].area == "kitchen" and cases.devices[1].state_topic is None
    assert cases.cases[0].intent == "other"  # no intent given
    assert cases.cases[0].expect == {"topic": "home/kitchen/light/set", "payload": "ON"}
    assert cases.cases[2].state == {"home/kitchen/light/state": "OFF"}


def _broken(change) -> dict:
    data = copy.deepcopy(GOOD)
    change(data)
    return data


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda d: d.pop("devices"), "lacks ['devices']"),
        (lambda d: d.update(cases=[]), "'cases' must be a non-empty list"),
        (lambda d: d["devices"][0].pop("payloads"), "devices[0] lacks ['payloads']"),
        (lambda d: d["devices"][0].update(payloads="ON"), "'payloads' must be a list of strings"),
        (lambda d: d["devices"][1].update(topic="home/kitchen/light/set"), "is listed twice"),
        (lambda d: d["devices"][1].update(topic="home/+/door/set"), "wildcards"),
        (lambda d: d["devices"][0].update(colour="red"), "unknown key(s) ['colour']"),
        (lambda d: d["cases"][0].pop("expect"), "cases[0] lacks ['expect']"),
        (lambda d: d["cases"][0].update(say=""), "cases[0].say must be a non-empty string"),
        (lambda d: d["cases"][0]["expect"].update(topic="home/attic/fan/set"), "is no device's topic"),
        (lambda d: d["cases"][0]["expect"].update(payload="DIM"), "payload 'DIM' is not one of"),
        (lambda d: d["cases"][2].update(state={"home/garage/door/state": "open"}), "is no device's state_topic"),
        (lambda d: d["cases"][1].update(intent=3), "cases[1].intent must be a non-empty string"),
    ],
)
def test_each_kind_of_bad_file_names_the_problem_and_the_fix(change, said):
    with pytest.raises(CaseFileError) as caught:
        parse_cases(_broken(change), "cases.json")
    message = str(caught.value)
    assert said in message and "fix:" in message and message.startswith("cases.json")


def test_an_unreadable_or_non_json_file_is_a_clear_error(tmp_path):
    with pytest.raises(CaseFileError, match="cannot read case file .*fix: give an existing file"):
        load_cases(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{devices: []")
    with pytest.raises(CaseFileError, match="not JSON .*fix:"):
        load_cases(tmp_path / "bad.json")


@functools.cache
def generate(*options: str) -> dict:
    """The generator's output, through its command (tests never import benchmark code)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "cases.json"
        command = [sys.executable, "-m", "voice.bench.home_cases", "--out", str(out), *options]
        subprocess.run(command, check=True, timeout=300)
        return json.loads(out.read_text())


def test_the_generator_covers_every_intent_with_actions_on_the_device_list():
    data = generate()
    cases = parse_cases(data, "generated")  # every expect names a device's topic and one of its payloads
    assert len(cases.cases) >= 400
    intents = {c.intent for c in cases.cases}
    assert {"HassTurnOn", "HassTurnOff", "HassLightSet", "HassGetState", "NotOnList", "chitchat"} <= intents
    assert len(cases.devices) >= 20 and len({d.area for d in cases.devices}) >= 8
    by_topic = {d.topic: d for d in cases.devices}
    for case in cases.cases:
        if case.intent in ("HassGetState", "NotOnList", "chitchat"):
            assert case.expect is None, case
            continue
        assert case.expect is not None, case
        device = by_topic[case.expect["topic"]]
        assert device.name in case.say  # the sentence names the device it expects switched
        if case.intent == "HassLightSet":
            assert case.expect["payload"] in case.say.split()  # the brightness asked for is the one expected
    covers = [c for c in cases.cases if c.expect and by_topic[c.expect["topic"]].payloads == ["OPEN", "CLOSE"]]
    assert {c.expect["payload"] for c in covers if c.expect} == {"OPEN", "CLOSE"}
    assert all(c.state for c in cases.cases if c.intent == "HassGetState")


def test_the_committed_case_file_is_what_the_generator_makes():
    """Stable seeded sampling: regenerating gives the committed file (else regenerate it and commit)."""
    assert json.loads(DEFAULT_CASES.read_text()) == generate()


@pytest.mark.parametrize("devices, areas", [(10, range(5, 6)), (40, range(12, 20))])
def test_the_generator_makes_a_home_of_any_size_the_same_way_each_time(devices, areas):
    """``--devices N``: a small flat or a big house, seeded (twice the same file), its cases valid for its devices."""
    data = generate("--devices", str(devices))
    with tempfile.TemporaryDirectory() as folder:  # a second run, not the cached first one
        out = Path(folder) / "again.json"
        again = [sys.executable, "-m", "voice.bench.home_cases", "--devices", str(devices), "--out", str(out)]
        subprocess.run(again, check=True, timeout=300)
        assert json.loads(out.read_text()) == data
    cases = parse_cases(data, f"{devices} devices")
    assert len(cases.devices) == devices and len({d.area for d in cases.devices}) in areas
    assert len(cases.cases) == len(generate()["cases"])  # the same mix of requests over a different home
    by_topic = {d.topic: d for d in cases.devices}
    commanded = {c.expect["topic"] for c in cases.cases if c.expect}
    assert all(by_topic[c.expect["topic"]].name in c.say for c in cases.cases if c.expect)
    assert len(commanded) == devices  # every device is asked for
    shipped = {d["name"] for d in generate()["devices"]}
    names = {d.name for d in cases.devices}
    assert names < shipped if devices < len(shipped) else shipped < names  # smaller homes keep the common devices


def test_a_home_size_the_generator_does_not_make_is_a_usage_error(tmp_path):
    command = [sys.executable, "-m", "voice.bench.home_cases", "--devices", "2", "--out", str(tmp_path / "x.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--devices: 2 is not in" in done.stderr and not (tmp_path / "x.json").exists()


def test_only_allowed_requests_count_as_published_and_the_reply_must_match_the_deed():
    allowed = {"home/a/set": ["ON", "OFF"]}
    requests = [
        ActionRequested("home/a/set", "ON", True),
        ActionRequested("home/b/set", "ON", True),  # claimed allowed, but not on the list: the bridge refuses it
        ActionRequested("home/a/set", "DIM", False, "payload not allowed"),
    ]
    assert published_actions(requests, allowed) == [{"topic": "home/a/set", "payload": "ON"}]
    refused = Result("x", None, "other", [], [{"topic": "t", "payload": "p"}], "Sorry, I can't do that.", False)
    assert refused.consistent and refused.right
    lied = Result("x", None, "other", [], [{"topic": "t", "payload": "p"}], "Done, it is on.", False)
    assert not lied.consistent
    done = Result("x", {"topic": "t", "payload": "ON"}, "other", [{"topic": "t", "payload": "ON"}], [], "Done.", False)
    assert done.right and done.consistent


def test_a_question_back_is_answered_with_the_wanted_value_and_scored_after_the_answer():
    fan = {"topic": "home/fan/set", "payload": "ON"}
    asked = Result("fan", fan, "HassTurnOn", [], [fan], " Do you want the fan on or off?", False)
    assert asked.consistent and not asked.right and not asked.right_after_answer
    # the answers are the held-out file's varied phrasings (written apart from the code), drawn by the seed
    devices = [Device("fan", "home/fan/set", ["ON", "OFF"]), Device("lamp", "home/lamp/set", ["ON", "OFF", "50"])]
    cases = CaseFile(devices, [], {"yes": ["yep", "sure"], "no": ["nah"], "ON": ["on please"], "number": ["{n} pls"]})
    assert answer_for(Case("fan", fan, "HassTurnOn", {}), asked, cases) == "on please"  # which one: the value
    yes = Result("fan", fan, "HassTurnOn", [], [fan], " Do you want the fan on?", False)
    assert answer_for(Case("fan", fan, "HassTurnOn", {}), yes, cases) in ("yep", "sure")  # the one offered: yes
    fifty = Case("x", {"topic": "home/lamp/set", "payload": "50"}, "HassLightSet", {})
    assert answer_for(fifty, Result("x", None, "x", [], [], " Do you want the lamp on?", False), cases) == "50 pls"
    assert answer_for(Case("x", None, "chitchat", {}), asked, cases) is None  # no command wanted: nothing to answer
    done = Result("fan", fan, "x", [], [], "Done.", False)
    assert answer_for(Case("fan", fan, "HassTurnOn", {}), done, cases) is None
    # a question about another device than the one meant (a misheard name, guessed) is answered no
    lamp = Result("fan", fan, "HassTurnOn", [], [], " Do you want the lamp on?", False)
    assert answer_for(Case("fan", fan, "HassTurnOn", {}), lamp, cases) == "nah"
    both = Result("fan", fan, "HassTurnOn", [], [], " Do you want the fan and the lamp on?", False)
    assert answer_for(Case("fan", fan, "HassTurnOn", {}), both, cases) == "nah"  # more devices than meant
    for held_out in (HELD_OUT_CASES, HELD_OUT_CASES.with_name("home_phrasings_fresh.json")):
        assert set(load_cases(held_out).answers) >= {"yes", "no", "number", "ON", "OFF"}, held_out
    asked.answer, asked.answer_published = "Turn it on, please.", [fan]
    assert asked.right_after_answer and not asked.right
    asked.published = [{"topic": "home/fan/set", "payload": "OFF"}]  # a wrong command at once is not mended
    assert not asked.right_after_answer


def test_a_real_run_writes_one_record_per_case_and_publishes_nothing_unallowed(tmp_path):
    """SmolLM2-135M over four cases, one also spoken, across the living room over a fan: the records' shape, and
    the allow-list holds. The small model's accuracy is not asserted (it seldom writes a marker at all)."""
    data = copy.deepcopy(GOOD)
    data["cases"].append(
        {"say": "open the garage door", "expect": {"topic": "home/garage/door/set", "payload": "OPEN"}}
    )
    (tmp_path / "cases.json").write_text(json.dumps(data))
    out = tmp_path / "home.json"
    argv = ["-c", "configs/small.toml", "bench", "home", "--cases", str(tmp_path / "cases.json")]
    assert cli([*argv, "--json", str(out), "--spoken", "1", "--condition", "living-room-3m+fan@10"]) == 0
    report = json.loads(out.read_text())
    assert report["spoken_condition"] == "living-room-3m+fan@10"
    records = report["cases"]
    assert [r["spoken"] for r in records] == [False] * 4 + [True]
    allowed = {d["topic"]: d["payloads"] for d in data["devices"]}
    for record, case in zip(records, [*data["cases"], data["cases"][0]], strict=True):
        assert record["say"] == case["say"] and record["expect"] == case["expect"]
        assert isinstance(record["reply"], str) and record["reply"].strip()
        for action in record["published"]:
            assert set(action) == {"topic", "payload"} and action["payload"] in allowed[action["topic"]]
    assert records[-1]["transcript"]  # the listener heard the spoken case
    for part in ("text", "spoken"):
        assert report["summary"][part]["total"]["unallowed_published"] == 0
    assert report["summary"]["text"]["total"]["cases"] == 4


def test_a_bad_case_file_exits_2_before_loading_any_model(tmp_path, capsys):
    (tmp_path / "cases.json").write_text(json.dumps({"devices": []}))
    assert cli(["-c", "configs/small.toml", "bench", "home", "--cases", str(tmp_path / "cases.json")]) == 2
    assert "fix:" in capsys.readouterr().err


def test_a_nonsense_limit_is_a_usage_error_before_any_model_loads(capsys):
    with pytest.raises(SystemExit) as caught:
        cli(["-c", "configs/small.toml", "bench", "home", "--limit", "0"])
    assert caught.value.code == 2 and "--limit: 0 is below 1" in capsys.readouterr().err


def test_an_unknown_listening_condition_is_a_usage_error_before_any_model_loads(capsys):
    with pytest.raises(SystemExit) as caught:
        cli(["-c", "configs/small.toml", "bench", "home", "--condition", "living-room+drums@10"])
    assert caught.value.code == 2 and "no noise 'drums'" in capsys.readouterr().err


def test_default_cases_path_is_inside_the_repository():
    assert DEFAULT_CASES.is_relative_to(Path(__file__).resolve().parent.parent)


def test_a_state_answer_must_say_the_state_first_and_a_yes_or_no_must_fit_the_question():
    door = {"home/garage/door/state": "open"}
    assert state_answered(door, "No, the garage door is open.", "is the garage door closed?")
    assert not state_answered(door, "Yes, the garage door is open.", "is the garage door closed?")
    assert not state_answered(door, "The garage door is closed, not open.", "is the garage door open")
    assert state_answered(door, "Yes, it is open.", "is the garage door open on my drive")  # "on": not its pair
    assert state_answered({"t": "half"}, "It is half open.", "is it open") is None  # no known opposite
    result = Result("is the garage door closed", None, "HassGetState", [], [], "No, it is open.", False, state=door)
    assert result.state_right is True


def test_the_spoken_sample_mixes_piper_and_espeak_voices_the_same_way_every_run():
    from voice.home_casefile import PIPER, SPOKEN_VOICES, speak_case, spoken_voices

    mixed = spoken_voices(64, 0, "mixed")
    assert mixed == spoken_voices(64, 0, "mixed") and mixed != spoken_voices(64, 1, "mixed")
    espeak_names = {v.name for v in SPOKEN_VOICES}
    assert 20 <= mixed.count(PIPER) <= 44 and set(mixed) - {PIPER} <= espeak_names and len(set(mixed)) >= 4
    assert spoken_voices(5, 0, "piper") == [PIPER] * 5
    with tempfile.TemporaryDirectory() as tmp:  # an espeak-ng case is a real 16 kHz WAV of the sentence
        from audio.wavfile import read_wav

        wav = speak_case(None, "turn on the sprinkler", SPOKEN_VOICES[0].name, Path(tmp) / "case.wav")
        samples, rate = read_wav(wav)
        assert rate == 16000 and len(samples) > 16000 * 0.8 and abs(samples).max() > 1000
