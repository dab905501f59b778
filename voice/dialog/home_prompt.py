"""The system prompt of a named home (voice/dialog/home.py ``Home.prompt``): rules for a home voice assistant,
then the devices by area. It depends on the devices only, never on their state, so it is the cached prefix of
every turn."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from voice.dialog.actions import ACTION_TOOL, KEYWORD
from voice.dialog.devices import HomeDevice


def home_prompt(devices: Sequence[HomeDevice], extra: dict[str, list[str]], action_format: str = "markers") -> str:
    """The system prompt for a home assistant: rules, then one line per device grouped by area.

    Markers: every command is written out as the whole marker for its first payload (measured: a bare topic
    list made the model drop the keyword), with the other payloads after it, so the list stays one line per
    device. Tools: the same rules and list, with the device's name and values, for the ``control_device``
    function the chat template describes after this prompt. Nothing here changes between turns."""
    if action_format == "tools":
        return _tools_prompt(devices, extra)
    # the examples use a switch if there is one: "switch off" -> OFF reads right for the model
    first = next((d for d in devices if "OFF" in d.payloads), devices[0])
    off = "OFF" if "OFF" in first.payloads else first.payloads[-1]
    lines = [
        "You are the voice assistant of a home. Answer in one or two short spoken sentences, "
        "with no lists, code or markdown.",
        "You can control the devices listed below. Rules:",
        f"- Only when the user asks you to change a device, write its command once, copied exactly with the "
        f"brackets and the word {KEYWORD}, with the value the user wants, then confirm in a few words.",
        "- A question about a device (is it on, is it open, which lights are on) is not a request: write no "
        "command. Answer only from the state given with the question; if none is given, say you do not know.",
        "- If the user names a device that is not listed, write no command and say you cannot control it.",
        "- Anything else: answer briefly, with no command.",
        "Devices by area, each with its command and the values it takes:",
    ]
    for area, in_area in _by_area(devices):
        lines.append(f"{area}:")
        for d in in_area:
            rest = f" (values: {', '.join(d.payloads)})" if len(d.payloads) > 1 else ""
            lines.append(f"  {d.name}: [{KEYWORD} {d.topic} {d.payloads[0]}]{rest}")
    if extra:
        lines.append("other commands:")
        lines += [f"  [{KEYWORD} {t} {p}]" for t, payloads in extra.items() for p in payloads]
    lines += [
        f"Example: to switch off the {first.name}, your whole reply is: [{KEYWORD} {first.topic} {off}] Done.",
        f"Example: asked is the {first.name} on? (state now: {first.name} = {off}; so the answer is no), your "
        f"whole reply is: No, the {first.name} is {off.lower()}.",
    ]
    return "\n".join(lines)


def _tools_prompt(devices: Sequence[HomeDevice], extra: dict[str, list[str]]) -> str:
    first = next((d for d in devices if "OFF" in d.payloads), devices[0])
    off = "OFF" if "OFF" in first.payloads else first.payloads[-1]
    call = json.dumps({"name": ACTION_TOOL, "arguments": {"device": first.name, "value": off}})
    lines = [
        "You are the voice assistant of a home. Answer in one or two short spoken sentences, "
        "with no lists, code or markdown.",
        f"You can control the devices listed below with the function {ACTION_TOOL}. Rules:",
        f"- Only when the user asks you to change a device, call {ACTION_TOOL} once for it, with the device's "
        "name as listed and the value the user wants, then confirm in a few words.",
        "- A question about a device (is it on, is it open, which lights are on) is not a request: call no "
        "function. Answer only from the state given with the question; if none is given, say you do not know.",
        "- If the user names a device that is not listed, call no function and say you cannot control it.",
        "- Anything else: answer briefly, with no function call.",
        "Devices by area, each with the values it takes:",
    ]
    for area, in_area in _by_area(devices):
        lines.append(f"{area}:")
        lines += [f"  {d.name}: {', '.join(d.payloads)}" for d in in_area]
    if extra:
        lines.append("other devices:")
        lines += [f"  {t}: {', '.join(payloads)}" for t, payloads in extra.items()]
    lines += [
        f'Example: user: "switch off the {first.name}" -> you: "<tool_call>\n{call}\n</tool_call>\nDone."',
        f'Example: user: "is the {first.name} on?" (state now: {first.name} = {off}; so the answer is no) '
        f'-> you: "No, the {first.name} is {off.lower()}."',
    ]
    return "\n".join(lines)


def _by_area(devices: Iterable[HomeDevice]) -> list[tuple[str, list[HomeDevice]]]:
    groups: dict[str, list[HomeDevice]] = {}
    for d in devices:
        groups.setdefault(d.area or "other", []).append(d)
    return list(groups.items())
