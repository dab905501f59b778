"""Function calls in the model's reply: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

When a client declares tools (the Realtime API's ``session.tools``), the chat template shows them to the model,
and a model trained for it (Qwen2.5, the embedded target) answers a request that needs one with a call in this
form, the Hermes convention most open chat templates use. The call is never spoken: ``ToolCallParser`` cuts it
out of the token stream, like the home-action markers (voice/dialog/actions.py), holding back only the characters that
might still turn out to be its opening tag. The turn reports each call (``ToolCallRequested``); the client runs
the function and sends its output back as a conversation item, and the next response continues from there.
The reply's raw text, tags included, is what the history keeps, so the next prompt shows the model its own call.

Small models do not always use the tags: the embedded Qwen2.5-Coder-1.5B, asked about the weather with a
``get_weather`` tool declared, answers with a bare JSON object in a ```json fence. So a reply that *opens* with a
JSON object (fenced or not) naming a declared function is a call too; the parser holds the reply's opening until
that is decided (the object closes, or the text is plainly not one), then lets everything else through.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from voice.events import ToolCallRequested

log = logging.getLogger("specvoice.tools")

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALL_CHARS = 8192  # a call longer than this is not one the model meant: dropped
FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?\s*")  # a markdown code fence's opening line (```json)


class ToolCallParser:
    """Streams reply text through; cuts out tool calls and records them as ``calls``."""

    def __init__(self, names: set[str] | frozenset[str] = frozenset()) -> None:
        """``names``: the declared functions; a reply that opens with a bare JSON call to one of them is a call."""
        self.calls: list[ToolCallRequested] = []
        self._names = frozenset(names)
        self._lead: str | None = "" if names else None  # the reply's opening, while it may be a bare call
        self._held = ""  # a prefix of OPEN seen so far
        self._body: str | None = None  # inside a call: its text so far

    def push(self, text: str) -> str:
        """Feed reply text; returns the part that is safe to speak now."""
        if self._lead is not None:
            self._lead += text
            verdict = self._bare(self._lead, final=False)
            if verdict is None:
                return ""
            text, self._lead = self._lead[verdict:], None
        out: list[str] = []
        for ch in text:
            self._feed(ch, out)
        return "".join(out)

    def flush(self) -> str:
        """End of the reply: a held partial tag is text; an unclosed call is decoded if it is whole JSON."""
        if self._lead is not None:
            lead, self._lead = self._lead, None
            verdict = self._bare(lead, final=True)
            return self.push(lead[verdict or 0 :]) + self.flush()
        held, self._held = self._held, ""
        if self._body is not None:
            body, self._body = self._body, None
            self._decide(body)
        return held

    def _bare(self, lead: str, *, final: bool) -> int | None:
        """Is the reply's opening a bare JSON call? None: cannot tell yet; otherwise where the speakable text starts
        (0: not a call, all of it is text; past the call when it was one, which is then recorded)."""
        s = lead.lstrip()
        start = len(lead) - len(s)
        if not s or (not final and "```".startswith(s)):
            return None
        fence = FENCE.match(s) if s.startswith("```") else None
        body_at = fence.end() if fence else 0
        if fence and body_at == len(s) and not final:
            return None  # still in the fence's opening line
        if not s.startswith("{", body_at):
            return 0
        end = _object_end(s, body_at)
        if end is None:
            return None if not final and len(s) <= MAX_CALL_CHARS else 0
        try:
            call = json.loads(s[body_at:end])
        except ValueError:
            return 0
        if not isinstance(call, dict) or call.get("name") not in self._names:
            return 0
        if fence:  # the closing fence belongs to the call
            after = s[end:].lstrip()
            if not final and "```".startswith(after) and after != "```":
                return None
            if after.startswith("```"):
                end = len(s) - len(after) + 3
        self._record(call)
        return start + end

    def _feed(self, ch: str, out: list[str]) -> None:
        if self._body is not None:
            self._body += ch
            if self._body.endswith(CLOSE):
                body, self._body = self._body[: -len(CLOSE)], None
                self._decide(body)
            elif len(self._body) > MAX_CALL_CHARS:
                log.info("tool call dropped: longer than %d characters", MAX_CALL_CHARS)
                self._body = None
            return
        candidate = self._held + ch
        if OPEN.startswith(candidate):
            self._held = candidate
            if candidate == OPEN:
                self._held, self._body = "", ""
            return
        if not self._held:
            out.append(ch)
            return
        out.append(self._held[:1])  # not a tag: the first held character is text; look at the rest afresh
        rest, self._held = self._held[1:] + ch, ""
        for c in rest:
            self._feed(c, out)

    def _decide(self, body: str) -> None:
        try:
            call = json.loads(body)
        except ValueError:
            log.info("tool call dropped: not JSON", extra={"call": body[:200]})
            return
        name = call.get("name") if isinstance(call, dict) else None
        if not isinstance(name, str) or not name:
            log.info("tool call dropped: no function name", extra={"call": body[:200]})
            return
        self._record(call)

    def _record(self, call: dict) -> None:
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        self.calls.append(ToolCallRequested(call["name"], arguments))


def call_message(text: str, calls: list[ToolCallRequested]) -> dict[str, Any]:
    """The assistant message that made ``calls``, in the chat template's own form (``tool_calls``), whatever
    syntax the model used: the next prompt then shows each call and its output as the model was trained to read
    them (shown its own bare JSON, the embedded Qwen2.5 calls the function again instead of answering)."""
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": _json_or_text(c.arguments)}} for c in calls
        ],
    }


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _object_end(text: str, at: int) -> int | None:
    """The index just past the JSON object that opens at ``text[at]`` (braces counted outside strings), or None
    if it has not closed yet."""
    depth, in_string, escaped = 0, False, False
    for i in range(at, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None
