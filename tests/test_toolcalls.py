"""ToolCallParser: a function call in the model's reply is cut out of the speech and recorded, in the tagged form
(``<tool_call>{json}</tool_call>``) and in the bare form the embedded Qwen2.5-Coder-1.5B actually uses (a JSON
object in a ```json fence, measured: tests/test_realtime_tools.py), whatever the token boundaries."""

from __future__ import annotations

import json

import pytest

from voice.dialog.toolcalls import ToolCallParser, call_message

FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'


def run(text: str, step: int, names: set[str] | None = None) -> tuple[str, ToolCallParser]:
    parser = ToolCallParser(names if names is not None else {"get_weather"})
    out = "".join(parser.push(text[i : i + step]) for i in range(0, len(text), step)) + parser.flush()
    return out, parser


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
@pytest.mark.parametrize(
    "reply, spoken",
    [
        (FENCED, ""),
        (FENCED + " Let me check.", " Let me check."),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', ""),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', ""),
        ('Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', "Sure. "),
    ],
)
def test_a_call_is_recorded_and_never_spoken(reply, spoken, step):
    out, parser = run(reply, step)
    assert out == spoken
    assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize(
    "reply",
    [
        "It is sunny in Paris.",
        '{"a": 1} is a JSON object.',
        "`code` and ``more``",
        "```python\nprint(1)\n```",
        '{"name": "launch_rockets", "arguments": {}}',  # not a declared function: text
        '{"name": "get_we',  # cut off: text
        "<tool_",
        "<tools are fine>",
    ],
)
def test_text_that_is_not_a_call_passes_through_whole(reply, step):
    out, parser = run(reply, step)
    assert out == reply and parser.calls == []


def test_without_declared_names_only_tagged_calls_count():
    out, parser = run('{"name": "get_weather", "arguments": {}}', 1, names=set())
    assert out == '{"name": "get_weather", "arguments": {}}' and parser.calls == []


def test_the_history_gets_the_call_in_the_templates_form():
    _, parser = run(FENCED, 4)
    assert call_message("", parser.calls) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
