"""Questions about state answered from the state topics, in the shape of Home Assistant's own responses (one
device's state, yes/no, any, all, which, how many): a reply opens with what the state says, not with what a small
model reads into it."""

from __future__ import annotations

from collections.abc import Sequence

from voice.dialog.devices import HomeDevice
from voice.dialog.understanding import AskState
from voice.dialog.wording import words

OPPOSITE = {"on": "off", "off": "on", "open": "closed", "closed": "open"}  # a state and the one it is not


def state_reply(asked: AskState, states: dict[str, str]) -> str | None:
    """The answer to a question about state, from the state topics, in the shape of Home Assistant's own
    responses: "Yes, the porch light is on.", "No, the desk fan is on.", "The reading light and the night light
    are on.", "None of them is on." None when a device's state has not come (the model then says so).
    ``states``: each state topic's last value."""
    devices = [d for d in asked.devices if d.state_topic]
    values = [states.get(d.state_topic or "") for d in devices]
    if not devices or any(v is None for v in values):
        return None
    now = dict(zip(devices, [str(v) for v in values], strict=True))
    if asked.state is None or asked.form == "one":
        return " ".join(f"The {d.name} {is_or_are(d.name)} {state_said(v)}." for d, v in now.items())
    hits = [d for d, v in now.items() if _in_state(v, asked.state)]
    others = [d for d in devices if d not in hits]
    if asked.form == "one_yesno":
        device = devices[0]
        said = f"the {device.name} {is_or_are(device.name)} {state_said(now[device])}."
        return f"Yes, {said}" if hits else f"No, {said}"
    if asked.form == "all":
        if not others:
            return f"Yes, all of them are {asked.state}."
        return f"No, {_each_state(others, now)}."
    if asked.form == "how_many":
        which = f": {_listed_the(hits)}" if hits else ""
        return f"{len(hits)} {'is' if len(hits) == 1 else 'are'} {asked.state}{which}."
    if not hits:
        return f"{'No, n' if asked.form == 'any' else 'N'}one of them is {asked.state}."
    said = f"{_listed_the(hits)} {'is' if len(hits) == 1 else 'are'} {asked.state}"
    return f"Yes, {said}." if asked.form == "any" else f"{said[0].upper()}{said[1:]}."


def listed(names: Sequence[str]) -> str:
    """ "kettle", "kettle and the fan", "kettle, the fan and the lamp": how the question back names devices."""
    return names[0] if len(names) == 1 else f"{', the '.join(names[:-1])} and the {names[-1]}"


def is_or_are(name: str) -> str:
    """The verb for a device name: "the blinds are", "the lamp is", "the glass is"."""
    return "are" if name.endswith("s") and not name.endswith("ss") else "is"


def _listed_the(devices: Sequence[HomeDevice]) -> str:
    return "the " + listed([d.name for d in devices])


def state_said(value: str) -> str:
    """A state as a reply says it: "on", "closed", "at 60"."""
    word = value.strip().casefold()
    return f"at {word}" if word.replace(".", "", 1).isdigit() else word


def _each_state(devices: Sequence[HomeDevice], now: dict[HomeDevice, str]) -> str:
    return ", ".join(f"the {d.name} {is_or_are(d.name)} {state_said(now[d])}" for d in devices)


def _in_state(value: str, state: str) -> bool:
    """Whether a state topic's value is the state a question names: the same word in any case, or a number (a
    brightness, a position) read as on and open when above zero, off and closed at zero."""
    word, state = value.strip().casefold(), state.casefold()
    if word.replace(".", "", 1).isdigit():
        return (float(word) > 0) == (state in ("on", "open"))
    return word == state


def yes_or_no(question: str, values: list[str]) -> str:
    """For a yes/no question about one device's state ("is the garage door closed?"), the answer the state
    gives: the small model opened with "Yes" whatever the state it was shown. "" when the question names no
    single state (or both, "open or closed") or the state is not one of a known pair."""
    if len(values) != 1 or (value := values[0].casefold()) not in OPPOSITE:
        return ""
    named = set(words(question)) & {value, OPPOSITE[value]}
    if len(named) != 1:
        return ""
    return "; so the answer is yes" if named == {value} else "; so the answer is no"
