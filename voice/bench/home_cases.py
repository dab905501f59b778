"""The default case set of ``specvoice bench home``: Home Assistant's own English sentences over a made-up home.

Why Home Assistant's sentences: they are what people actually say to a home assistant, collected and reviewed by
its community for years, so the benchmark does not measure how well the model understands our own phrasing.
The sentence templates come from the PyPI package ``home-assistant-intents`` (Apache-2.0; the generated cases
are derived data) and are expanded with ``hassil``, Home Assistant's template matcher. Both are only needed to
regenerate the file, not to run the benchmark::

    pip install home-assistant-intents hassil
    python -m voice.bench.home_cases --out configs/home_cases.json
    python -m voice.bench.home_cases --devices 10 --out /tmp/flat.json   # a small flat; 40: a big house

Sampling is seeded, so the same package versions give the same file. ``--devices N`` (5 to 48; 26 is the shipped
file) builds a home of N devices: the N most common of a ranked catalogue, so 10 is a small flat (kitchen, living
room, bedroom, bathroom, hallway), 26 adds an office, a garage and a garden, and 40 is a big house with a dining
room, a kids' room, a guest room, a laundry, a basement, stairs and a patio. The number of cases stays the same,
so files of different sizes measure the same mix of requests over a longer or shorter device list. What is
generated:

* HassTurnOn / HassTurnOff on lights, switches and fans (payload ON / OFF) and on covers (OPEN / CLOSE);
* HassLightSet brightness on the lights whose payloads include brightness levels;
* HassGetState questions ("is the bedroom fan on?"), with the device's state set: no action is wanted;
* commands for devices the home has but the allow-list lacks (a lock, a heater): no action is wanted;
* everyday chit-chat, written here: no action is wanted.

The cases are shuffled, so ``--limit N`` takes a mix of every kind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).parents[1] / "configs" / "home_cases.json"  # configs/ (shipped in the package)
SEED = 20261204
SAMPLES_PER_TEMPLATE = 300  # expansions read per template before choosing one (a template can expand to millions)
BRIGHTNESS = ("10", "25", "50", "75", "100")
ON_OFF = ["ON", "OFF"]
DIMMABLE = [*ON_OFF, *BRIGHTNESS]
OPEN_CLOSE = ["OPEN", "CLOSE"]


@dataclass
class HomeDevice:
    """One device of the made-up home; ``domain`` is Home Assistant's, to pick the sentences that fit it."""

    name: str
    area: str
    domain: str  # light | switch | fan | cover | lock
    payloads: list[str]

    @property
    def topic(self) -> str:
        return f"home/{self.area.replace(' ', '_')}/{self.name.replace(' ', '_')}/set"

    @property
    def state_topic(self) -> str:
        return self.topic.removesuffix("/set") + "/state"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic": self.topic,
            "payloads": self.payloads,
            "area": self.area,
            "state_topic": self.state_topic,
            "domain": self.domain,
        }


# 26 devices in 8 areas: what a real flat with a few smart plugs and blinds has (the shipped case file)
HOME = [
    HomeDevice("kitchen light", "kitchen", "light", DIMMABLE),
    HomeDevice("counter lights", "kitchen", "light", ON_OFF),
    HomeDevice("coffee machine", "kitchen", "switch", ON_OFF),
    HomeDevice("kitchen blind", "kitchen", "cover", OPEN_CLOSE),
    HomeDevice("ceiling light", "living room", "light", DIMMABLE),
    HomeDevice("floor lamp", "living room", "light", DIMMABLE),
    HomeDevice("tv socket", "living room", "switch", ON_OFF),
    HomeDevice("living room curtains", "living room", "cover", OPEN_CLOSE),
    HomeDevice("ceiling fan", "living room", "fan", ON_OFF),
    HomeDevice("bedroom light", "bedroom", "light", DIMMABLE),
    HomeDevice("bedside lamp", "bedroom", "light", DIMMABLE),
    HomeDevice("bedroom fan", "bedroom", "fan", ON_OFF),
    HomeDevice("bedroom blinds", "bedroom", "cover", OPEN_CLOSE),
    HomeDevice("desk lamp", "office", "light", DIMMABLE),
    HomeDevice("office light", "office", "light", ON_OFF),
    HomeDevice("printer", "office", "switch", ON_OFF),
    HomeDevice("office shutter", "office", "cover", OPEN_CLOSE),
    HomeDevice("bathroom light", "bathroom", "light", ON_OFF),
    HomeDevice("extractor fan", "bathroom", "fan", ON_OFF),
    HomeDevice("towel warmer", "bathroom", "switch", ON_OFF),
    HomeDevice("hallway light", "hallway", "light", DIMMABLE),
    HomeDevice("porch light", "hallway", "light", ON_OFF),
    HomeDevice("garage door", "garage", "cover", OPEN_CLOSE),
    HomeDevice("garage light", "garage", "light", ON_OFF),
    HomeDevice("garden lights", "garden", "light", ON_OFF),
    HomeDevice("sprinkler", "garden", "switch", ON_OFF),
]
# which of HOME a smaller home keeps, most common first: the first 10 are a small flat's five rooms
HOME_RANK = [
    "kitchen light", "ceiling light", "bedroom light", "bathroom light", "hallway light", "floor lamp",
    "bedside lamp", "tv socket", "coffee machine", "living room curtains",
    "bedroom fan", "extractor fan", "bedroom blinds", "counter lights", "kitchen blind", "ceiling fan", "desk lamp",
    "office light", "printer", "office shutter", "towel warmer", "porch light", "garage door", "garage light",
    "garden lights", "sprinkler",
]  # fmt: skip
# what a bigger house adds to HOME, in this order: new rooms first, then more in the rooms there are. No name's
# words contain another device's (grounding: "the dining room ceiling light" would also name the "ceiling light"),
# and none is one of UNLISTED's
BIGGER = [
    HomeDevice("dining room chandelier", "dining room", "light", DIMMABLE),
    HomeDevice("dining room blinds", "dining room", "cover", OPEN_CLOSE),
    HomeDevice("night light", "kids room", "light", DIMMABLE),
    HomeDevice("kids room blinds", "kids room", "cover", OPEN_CLOSE),
    HomeDevice("washing machine", "laundry room", "switch", ON_OFF),
    HomeDevice("laundry light", "laundry room", "light", ON_OFF),
    HomeDevice("guest room light", "guest room", "light", DIMMABLE),
    HomeDevice("guest room fan", "guest room", "fan", ON_OFF),
    HomeDevice("basement light", "basement", "light", ON_OFF),
    HomeDevice("dehumidifier", "basement", "switch", ON_OFF),
    HomeDevice("stair lights", "stairs", "light", ON_OFF),
    HomeDevice("patio heater", "patio", "switch", ON_OFF),
    HomeDevice("string lights", "patio", "light", ON_OFF),
    HomeDevice("patio awning", "patio", "cover", OPEN_CLOSE),
    HomeDevice("reading lamp", "living room", "light", DIMMABLE),
    HomeDevice("dishwasher", "kitchen", "switch", ON_OFF),
    HomeDevice("closet light", "bedroom", "light", ON_OFF),
    HomeDevice("car charger", "garage", "switch", ON_OFF),
    HomeDevice("pool pump", "patio", "switch", ON_OFF),
    HomeDevice("soundbar", "living room", "switch", ON_OFF),
    HomeDevice("dryer", "laundry room", "switch", ON_OFF),
    HomeDevice("bunk bed lamp", "kids room", "light", ON_OFF),
]
MIN_DEVICES, MAX_DEVICES = 5, len(HOME) + len(BIGGER)


def home_of(n: int = len(HOME)) -> list[HomeDevice]:
    """A home of ``n`` devices: the ``n`` most common of HOME then BIGGER, in their own order (HOME itself for 26)."""
    if not MIN_DEVICES <= n <= MAX_DEVICES:
        raise ValueError(f"a home of {n} devices is not made here; fix: give {MIN_DEVICES} to {MAX_DEVICES}")
    if n <= len(HOME):
        keep = set(HOME_RANK[:n])
        return [d for d in HOME if d.name in keep]
    return [*HOME, *BIGGER[: n - len(HOME)]]


# in the home but not on the allow-list: a request for them must publish nothing
UNLISTED = [
    HomeDevice("front door lock", "hallway", "lock", ["LOCK", "UNLOCK"]),
    HomeDevice("back door lock", "kitchen", "lock", ["LOCK", "UNLOCK"]),
    HomeDevice("space heater", "office", "switch", ON_OFF),
    HomeDevice("aquarium light", "living room", "light", ON_OFF),
    HomeDevice("nursery lamp", "nursery", "light", ON_OFF),
    HomeDevice("attic fan", "attic", "fan", ON_OFF),
    HomeDevice("shed door", "garden", "cover", OPEN_CLOSE),
]
CHITCHAT = [
    "what's the weather like",
    "tell me a joke",
    "how are you today",
    "what time is it",
    "good morning",
    "thanks, that's all",
    "what should I cook for dinner",
    "how many days until Christmas",
    "who wrote Pride and Prejudice",
    "what's the capital of Australia",
    "can you recommend a good book",
    "how do I boil an egg",
    "what's two plus two",
    "I'm feeling a bit tired today",
    "tell me something interesting",
    "what does the word serendipity mean",
    "how far is the moon",
    "remind me why the sky is blue",
    "what's a good name for a cat",
    "sing me a song",
    "how tall is Mount Everest",
    "good night",
    "what's your name",
    "do you like music",
    "give me a quick workout idea",
    "how long should I steep green tea",
    "what's the difference between a frog and a toad",
    "translate hello into Spanish",
    "what's the best way to learn to cook",
    "I just got home",
    "it's really cold in here",
    "it's so dark in this room",
    "the kitchen is a mess",
    "I love the new lamp",
    "my bedroom is too warm at night",
    "how do plants grow",
    "what year did the first moon landing happen",
    "can you help me plan my weekend",
    "what's a healthy breakfast",
    "never mind",
    "who are you",
    "tell me a fun fact about octopuses",
]
STATES = {  # HassGetState's state slot, per domain: (its list in the intents data, the states a device reports)
    "light": ("on_off_states", ON_OFF),
    "switch": ("on_off_states", ON_OFF),
    "fan": ("on_off_states", ON_OFF),
    "cover": ("cover_states", ["open", "closed"]),
}
SLOT_COMBINATIONS = {  # the sentence blocks that name one device (not an area, floor or device class)
    "HassTurnOn": {"name_only", "name_area"},
    "HassTurnOff": {"name_only", "name_area"},
    "HassLightSet": {"name_brightness"},
    "HassGetState": {"name_only", "name_state", "name_state_area"},
}
COUNTS = {"HassTurnOn": 110, "HassTurnOff": 110, "HassLightSet": 50, "HassGetState": 60, "NotOnList": 40}


def _templates(intents: Any, intent: str, domain: str) -> list[Any]:
    """The parsed sentences of ``intent`` that name one device of ``domain``."""
    found = []
    for block in intents.intents[intent].data:
        combination = (block.metadata or {}).get("slot_combination")
        domains = (block.requires_context or {}).get("domain", [])
        if combination in SLOT_COMBINATIONS[intent] and domain in domains:
            found.extend(block.sentences)
    return found


def _sample(rng: random.Random, intents: Any, templates: list[Any], device: HomeDevice, **slots: str) -> str | None:
    """One random expansion of a random template, with ``{name}``, ``{area}`` and each slot list named in ``slots``
    reduced to the one value given (so the sentence says what the case expects)."""
    from hassil.intents import TextSlotList
    from hassil.sample import sample_sentence

    lists = dict(intents.slot_lists)
    lists["name"] = TextSlotList.from_strings([device.name])
    lists["area"] = TextSlotList.from_strings([device.area])
    for slot, value in slots.items():
        lists[slot] = TextSlotList.from_strings([value])
    for _ in range(5):  # a few tries: some expansions are only the device's name, not a request
        template = rng.choice(templates)
        texts = list(itertools.islice(sample_sentence(template, lists, intents.expansion_rules), SAMPLES_PER_TEMPLATE))
        text = re.sub(r"\s+", " ", rng.choice(texts)).strip() if texts else ""
        bare = re.sub(r"^(the|my|our) ", "", text)
        if text and bare != device.name and all(v in text.split() for v in slots.values()):
            return text  # a request (not just the name) that says the slot values the case expects
    return None


def generate(seed: int = SEED, devices: int = len(HOME)) -> dict[str, Any]:
    """The case file as a dict (``devices`` + shuffled ``cases``) for a home of ``devices`` devices, from Home
    Assistant's English sentences."""
    import home_assistant_intents
    from hassil.intents import Intents

    english = home_assistant_intents.get_intents("en")
    if english is None:
        raise RuntimeError("home-assistant-intents has no English sentences; fix: reinstall the package")
    intents = Intents.from_dict(english)
    home = home_of(devices)
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = []

    def add(intent: str, devices: list[HomeDevice], count: int, unlisted: bool = False) -> None:
        for i in range(count * 3):  # round-robin over the devices until ``count`` cases exist
            if sum(c["intent"] == ("NotOnList" if unlisted else intent) for c in cases) >= count:
                return
            device = devices[i % len(devices)]
            templates = _templates(intents, intent, device.domain)
            if not templates:
                continue
            slots: dict[str, str] = {}
            expect: dict[str, str] | None = None
            state: dict[str, str] | None = None
            if intent == "HassLightSet":
                slots["brightness"] = rng.choice(BRIGHTNESS)
                expect = {"topic": device.topic, "payload": slots["brightness"]}
            elif intent == "HassGetState":
                list_name, values = STATES[device.domain]
                slots[list_name] = rng.choice(values).lower()  # "is the fan on": the asked state
                state = {device.state_topic: rng.choice(values)}
            else:
                payload = device.payloads[0 if intent == "HassTurnOn" else 1]
                expect = {"topic": device.topic, "payload": payload}
            say = _sample(rng, intents, templates, device, **slots)
            if say is None:
                continue
            case: dict[str, Any] = {"say": say, "expect": None if unlisted else expect, "intent": intent}
            if unlisted:
                case["intent"] = "NotOnList"
            if state is not None:
                case["state"] = state
            cases.append(case)

    add("HassTurnOn", home, COUNTS["HassTurnOn"])
    add("HassTurnOff", home, COUNTS["HassTurnOff"])
    add("HassLightSet", [d for d in home if "50" in d.payloads], COUNTS["HassLightSet"])
    add("HassGetState", [d for d in home if d.domain in STATES], COUNTS["HassGetState"])
    add("HassTurnOn", UNLISTED, COUNTS["NotOnList"] // 2, unlisted=True)
    add("HassTurnOff", UNLISTED, COUNTS["NotOnList"], unlisted=True)
    cases += [{"say": line, "expect": None, "intent": "chitchat"} for line in CHITCHAT]
    rng.shuffle(cases)
    return {"devices": [d.to_json() for d in home], "cases": cases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voice.bench.home_cases", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT.name} in configs/")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument(
        "--devices",
        type=int,
        default=len(HOME),
        help=f"how many devices the home has ({MIN_DEVICES}-{MAX_DEVICES}; default {len(HOME)}: the shipped file; "
        "10 is a small flat, 40 a big house)",
    )
    args = p.parse_args(argv)
    if not MIN_DEVICES <= args.devices <= MAX_DEVICES:
        p.error(f"--devices: {args.devices} is not in {MIN_DEVICES}-{MAX_DEVICES}")
    data = generate(args.seed, args.devices)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    kinds = sorted({c["intent"] for c in data["cases"]})
    per = ", ".join(f"{k} {sum(c['intent'] == k for c in data['cases'])}" for k in kinds)
    areas = len({d["area"] for d in data["devices"]})
    print(f"wrote {args.out}: {len(data['devices'])} devices in {areas} areas, {len(data['cases'])} cases ({per})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
