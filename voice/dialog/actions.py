"""Home actions the LLM may ask for, written as markers in its reply: ``[ACTION <topic> <payload>]``.

Why markers in the text and not a tool-calling API: the reply is spoken while it is generated, token by
token, and small local models have no reliable tool-call format. A marker is one short line the model can
copy from the system prompt; ``ActionParser`` cuts it out of the token stream before the text reaches TTS,
holding back only the few characters that might still turn out to be a marker.

Nothing the model writes is trusted: a request is ``allowed`` only when its topic is on the allow-list
(``mqtt.allowed_actions``) and its payload is one of that topic's payloads. The payload published is the
allow-list's own spelling (the model may write ``on`` for ``ON``). With named devices (``mqtt.devices``) an
allowed request must also be one the user's words asked for (``ground``), and a device gets one command per
reply (``once_per_topic``; measured, the model copied the prompt's list: ON, OFF, 10, 25 for one light): later
ones for the same topic are dropped. Everything else is refused with a reason.

After a refused marker the rest of the reply is not spoken: small models confirm what they asked for
("Done, the front door is unlocked") whether or not it happened. The user hears the ``Refusal``'s speech instead:
``REFUSED_SPEECH``, or a question back ("Do you want the sprinkler on or off?") when the words named the device
but no value, which the next turn's answer ("On.") completes (voice/dialog/home.py ``Home.follow_up``).

The other format (``mqtt.action_format = "tools"``): the chat template shows the model one function,
``control_device(device, value)`` (``action_tool``), and the model calls it in its trained Hermes syntax. The turn's
``ToolCallParser`` (voice/dialog/toolcalls.py) cuts the call out of the stream as it does a client's; the call is
turned into a topic and payload (``call_action``) and given to ``ActionParser.call``: the same allow-list, grounding,
once-per-device and refusal speech as a marker. With that format the parser reads no markers (``markers=False``).
A third (``"constrained"``) keeps the markers, and the turn has the decode after ``[ACTION`` go on only with a
command of a device the user's words name (voice/dialog/turn.py ``_constrain``, llm/constrain.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from voice.dialog.toolcalls import ToolCallParser
from voice.events import ActionRequested

REFUSED_SPEECH = " Sorry, I can't do that."


@dataclass(frozen=True)
class Refusal:
    """Why an action the model asked for is not done, and what the user hears instead: the plain refusal, or a
    question back when the words named the device but no value ("Do you want the sprinkler on or off?")."""

    reason: str
    speech: str = REFUSED_SPEECH

    @property
    def asks_back(self) -> bool:
        """The user hears a question (which their answer completes), not the plain refusal."""
        return self.speech != REFUSED_SPEECH


Grounding = Callable[[str, str], "Refusal | None"]  # (topic, payload) -> None if the user asked for it

KEYWORD = "ACTION"  # the marker is "[" + KEYWORD + whitespace + body + "]" (keyword in any case)
MAX_BODY_CHARS = 200  # a marker body longer than this is not a marker the model meant: refused
_QUOTES = "\"'`"
ACTION_TOOL = "control_device"  # the function of the tool-call format (mqtt.action_format = "tools")


def check_allowed(allowed: dict[str, list[str]]) -> None:
    """Raise ValueError (naming the entry and the fix) when the allow-list cannot be used safely."""
    for topic, payloads in allowed.items():
        where = f"mqtt.allowed_actions[{topic!r}]"
        if not topic or topic != topic.strip() or any(c in topic for c in "+#\0 ]") or len(topic) > 200:
            raise ValueError(
                f"{where}: the topic must be a plain MQTT topic without spaces, wildcards (+ #) "
                "or ']'; fix: name the exact command topic, e.g. 'home/kitchen/light/set'"
            )
        if not payloads:
            raise ValueError(f"{where}: no payloads listed; fix: list the allowed payloads, e.g. ['ON', 'OFF']")
        for payload in payloads:
            if not payload or payload != payload.strip() or "]" in payload or "\n" in payload:
                raise ValueError(
                    f"{where}: payload {payload!r} must be non-empty, without surrounding spaces, "
                    "newlines or ']'; fix: use a plain word such as 'ON'"
                )


def action_instructions(allowed: dict[str, list[str]]) -> str:
    """Text appended to the system prompt: every command that exists, written out as the exact marker.

    Why every marker in full (not "topic: payloads"): measured with Qwen2.5-Coder-1.5B, a list of topics
    made the model drop the keyword and write "[home/kitchen/light/set ON]"; with whole markers to copy and
    one example reply it wrote them exactly. The list is part of every prompt: keep the allow-list short."""
    check_allowed(allowed)
    lines = [
        "You can control devices in the home. To switch a device, put one of these commands in your reply, "
        f"copied exactly, brackets and the word {KEYWORD} included:"
    ]
    for topic, payloads in allowed.items():
        lines += [f"[{KEYWORD} {topic} {payload}]" for payload in payloads]
    first_topic, first_payloads = next(iter(allowed.items()))
    lines += [
        "Then confirm in a few words. These are the only devices you can control: if the user asks for anything "
        "else, write no command and say that you cannot do that.",
        f'Example: user: "please turn the thing off" -> you: "[{KEYWORD} {first_topic} {first_payloads[-1]}] '
        'Done, it is off."',
    ]
    return "\n".join(lines)


def action_tool() -> dict[str, Any]:
    """The one function of the tool-call format, in the chat template's form. Its arguments are the device's name
    and the value, not a topic: the prompt lists devices by name (voice/dialog/home.py). No enum of names: it would
    list every device a second time in every prompt, and the arguments are checked here anyway."""
    return {
        "type": "function",
        "function": {
            "name": ACTION_TOOL,
            "description": "Switch or set one device of the home. Only when the user asks for a change.",
            "parameters": {
                "type": "object",
                "properties": {
                    "device": {"type": "string", "description": "the device's name, as listed"},
                    "value": {"type": "string", "description": "one of the device's values, as listed"},
                },
                "required": ["device", "value"],
            },
        },
    }


def tool_instructions(allowed: dict[str, list[str]]) -> str:
    """The tool-call format's text for the system prompt when no device is named: each topic and its values."""
    check_allowed(allowed)
    lines = [
        f"You can control devices in the home with the function {ACTION_TOOL}: give the device's topic as its "
        "device and one of its values. Only when the user asks for a change; these are the only devices:"
    ]
    lines += [f"  {topic}: {', '.join(payloads)}" for topic, payloads in allowed.items()]
    lines.append("If the user asks for anything else, call no function and say that you cannot do that.")
    return "\n".join(lines)


def call_action(arguments: str, resolve: Callable[[str], str]) -> tuple[str, str]:
    """A ``control_device`` call's (topic, payload); ``resolve`` turns the device the model named into its command
    topic (``Home.resolve``). Nothing is trusted here: an unknown device comes back as its own text, which is no
    topic on the allow-list, so the parser refuses it."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return "", ""
    if not isinstance(args, dict):
        return "", ""
    device, value = (str(args.get(key, "")).strip().strip(_QUOTES).strip() for key in ("device", "value"))
    return resolve(device) if device else "", value


class ActionParser:
    """Streams reply text through; cuts out action markers and records them as ``requests``.

    A character-by-character state machine, so the result never depends on how the stream was split:
    ``text`` outside markers is passed on at once, ``[`` followed by a prefix of the keyword is held back
    until it is decided, and a marker body is collected until its closing ``]``.
    """

    def __init__(
        self,
        allowed: dict[str, list[str]],
        ground: Grounding | None = None,
        *,
        once_per_topic: bool = False,
        markers: bool = True,
    ) -> None:
        check_allowed(allowed)
        self.markers = markers  # False: actions come as tool calls (``call``); the text is only muted after a refusal
        self.allowed = {topic: list(payloads) for topic, payloads in allowed.items()}
        self.ground = ground  # the user's words must ask for an allowed action too (voice/dialog/home.py)
        self.once_per_topic = once_per_topic  # named devices: a device gets the reply's first command only
        self.duplicates = 0  # further commands for a topic already commanded in this reply: dropped
        self.requests: list[ActionRequested] = []
        self._held = ""  # "[" plus the keyword characters matched so far
        self._body: str | None = None  # inside a marker: the characters after the keyword
        self._muted = False  # a marker was refused: the rest of the reply is not spoken

    @property
    def refused(self) -> bool:
        return any(not r.allowed for r in self.requests)

    def push(self, text: str) -> str:
        """Feed reply text; returns the part that is safe to speak now."""
        out: list[str] = []
        for ch in text:
            self._feed(ch, out)
        return "".join(out)

    def call(self, topic: str, payload: str) -> str:
        """An action the model asked for in another form (a tool call): decided as a marker would be; returns
        what to speak for it (the refusal, or nothing)."""
        out: list[str] = []
        self._decide(topic, payload, out)
        return "".join(out)

    def _speak(self, text: str, out: list[str]) -> None:
        if not self._muted:
            out.append(text)

    def flush(self) -> str:
        """End of the reply: a held "[" that never became a marker is text; an unclosed marker is refused."""
        out: list[str] = []
        self._speak(self._held, out)
        self._held = ""
        if self._body is not None:
            self._refuse(*_split(self._body), "the action marker was not closed with ']'", out)
            self._body = None
        return "".join(out)

    def _feed(self, ch: str, out: list[str]) -> None:
        if not self.markers:
            self._speak(ch, out)
            return
        if self._body is not None:
            if ch == "]":
                body, self._body = self._body, None
                self._decide(*_split(body), out)
            elif ch == "\n":
                body, self._body = self._body, None
                self._refuse(*_split(body), "the action marker was not closed with ']' on its line", out)
                self._speak(ch, out)
            elif len(self._body) >= MAX_BODY_CHARS:
                body, self._body = self._body, None
                self._refuse(*_split(body), f"the action marker is longer than {MAX_BODY_CHARS} characters", out)
            else:
                self._body += ch
            return
        if not self._held:
            if ch == "[":
                self._held = ch
            else:
                self._speak(ch, out)
            return
        matched = len(self._held) - 1
        if matched < len(KEYWORD) and ch.upper() == KEYWORD[matched]:
            self._held += ch
        elif matched == len(KEYWORD) and ch.isspace() and ch != "\n":
            self._held, self._body = "", ""
        else:  # not a marker after all: the held characters are plain text; look at ch afresh
            self._speak(self._held, out)
            self._held = ""
            self._feed(ch, out)

    def _decide(self, topic: str, payload: str, out: list[str]) -> None:
        if not topic:
            self._refuse(topic, payload, "the action names no topic (no known device)", out)
            return
        if topic not in self.allowed:
            self._refuse(topic, payload, f"topic {topic!r} is not on the allow-list (mqtt.allowed_actions)", out)
            return
        for allowed in self.allowed[topic]:
            if payload.casefold() == allowed.casefold():
                if self.once_per_topic and any(r.topic == topic for r in self.requests):
                    self.duplicates += 1
                    return
                refusal = self.ground(topic, allowed) if self.ground is not None else None
                if refusal is not None:
                    self._refuse(topic, allowed, refusal.reason, out, refusal.speech)
                    return
                self.requests.append(ActionRequested(topic, allowed, True))
                return
        choices = ", ".join(repr(p) for p in self.allowed[topic])
        self._refuse(topic, payload, f"payload {payload!r} is not allowed for {topic!r} (allowed: {choices})", out)

    def _refuse(self, topic: str, payload: str, reason: str, out: list[str], speech: str = REFUSED_SPEECH) -> None:
        self.requests.append(ActionRequested(topic, payload, False, reason))
        self._speak(speech, out)
        self._muted = True


def _split(body: str) -> tuple[str, str]:
    """A marker body is "<topic> <payload>"; quotes the model may add around either are dropped."""
    parts = body.split(None, 1)
    topic = parts[0].strip(_QUOTES) if parts else ""
    payload = parts[1].strip().strip(_QUOTES).strip() if len(parts) > 1 else ""
    return topic, payload


def take_action_calls(tools: ToolCallParser, parser: ActionParser, resolve: Callable[[str], str]) -> str:
    """Take the home actions out of the tool calls made so far (they are no client's) and decide them as markers
    are decided; returns what to speak for them (a refusal)."""
    spoken = [parser.call(*call_action(c.arguments, resolve)) for c in tools.calls if c.name == ACTION_TOOL]
    tools.calls[:] = [c for c in tools.calls if c.name != ACTION_TOOL]
    return "".join(spoken)
