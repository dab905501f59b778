"""What the bridge accepts on its command and trigger topics, and the errors it gives for the rest."""

import pytest

from voice.transports.mqtt.payloads import (
    MAX_TEXT_CHARS,
    PayloadError,
    Topics,
    parse_text_command,
    render_event,
    template_fields,
)

ASK = {"id": (str, int), "speak": bool}


@pytest.mark.parametrize(
    "payload, expected",
    [
        (b"What time is it?", {"text": "What time is it?"}),
        (b"  padded  \n", {"text": "padded"}),
        (b'{"text": "hi", "id": 3, "speak": false}', {"text": "hi", "id": 3, "speak": False}),
        (b'{"text": " hi "}', {"text": "hi"}),
        (b"[not json] just text", {"text": "[not json] just text"}),  # only a leading '{' means JSON
        ("already text", {"text": "already text"}),
        ("Grüße, ça va ?".encode(), {"text": "Grüße, ça va ?"}),
    ],
)
def test_text_commands_accept_plain_text_and_json(payload, expected):
    assert parse_text_command(payload, fields=ASK) == expected


@pytest.mark.parametrize(
    "payload, words",
    [
        (b"", "no text to use"),
        (None, "no text to use"),
        (b'{"text": null}', "no text to use"),
        (b'{"id": 1}', "no text to use"),
        (b'{"text": ["a"]}', "field 'text' must be a string, got list"),
        (b'{"text": "a", "id": 1.5}', "field 'id' must be str or int, got float"),
        (b'{"text": "a", "extra": 1, "more": 2}', "unknown field(s) 'extra', 'more'"),
        (b'{"text": "a",}', "invalid JSON"),
        (b'{"text": "a"} trailing', "invalid JSON"),
        (b"\xc3\x28", "not UTF-8"),
        (b"a" * (16 * 1024 + 1), "byte limit"),
        (("b" * (MAX_TEXT_CHARS + 1)).encode(), "characters is over the"),
    ],
)
def test_bad_text_commands_say_what_is_wrong_and_how_to_fix_it(payload, words):
    with pytest.raises(PayloadError) as err:
        parse_text_command(payload, fields=ASK)
    assert words in str(err.value) and "fix:" in str(err.value)


@pytest.mark.parametrize(
    "template, payload, expected",
    [
        ("{name} is at the door.", b'{"name": "Alice"}', "Alice is at the door."),
        ("{name} pressed {button} times.", b'{"name": "Bob", "button": 2, "extra": [1]}', "Bob pressed 2 times."),
        ("The doorbell rang.", b"", "The doorbell rang."),
        ("The doorbell rang.", b'{"anything": true}', "The doorbell rang."),
        ("Message: {payload}", b"  wash done  ", "Message: wash done"),
        ("Motion on {topic}.", b"1", "Motion on home/hall/motion."),
        ("{{literal}} {name}", b'{"name": "x"}', "{literal} x"),
        ("{temp:.1f} degrees", b'{"temp": 21.456}', "21.5 degrees"),
    ],
)
def test_event_templates_are_filled_from_the_payload(template, payload, expected):
    assert render_event(template, "home/hall/motion", payload) == expected


@pytest.mark.parametrize(
    "template, payload, words",
    [
        ("{name} is at the door.", b'{"who": "x"}', "needs the field 'name'"),
        ("{name} is at the door.", b"Alice", "needs the field 'name'"),  # plain text fills only {payload}
        ("{name} is at the door.", b'{"name": ["a"]}', "needs the field 'name'"),  # only plain values are used
        ("{temp:.1f} degrees", b'{"temp": "warm"}', "cannot fill the sentence"),
        ("{payload}", b"   ", "would be empty"),
        ("{name}", b"{broken", "invalid JSON"),
    ],
)
def test_event_templates_that_cannot_be_filled_are_reported(template, payload, words):
    with pytest.raises(PayloadError) as err:
        render_event(template, "t", payload)
    assert words in str(err.value) and "fix:" in str(err.value)


def test_template_fields_and_malformed_templates():
    assert template_fields("{a} and {b.c} {{no}}") == ["a", "b.c"]
    with pytest.raises(ValueError):
        template_fields("{unclosed")


def test_topics_live_under_the_prefix():
    t = Topics.under("home/voice")
    assert (t.say, t.ask, t.cancel, t.availability, t.error) == (
        "home/voice/say",
        "home/voice/ask",
        "home/voice/cancel",
        "home/voice/availability",
        "home/voice/error",
    )
