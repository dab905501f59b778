"""The action marker parser: markers are cut out of the spoken text, whatever the stream's split, and only
allow-listed topics and payloads are let through."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice.dialog.actions import MAX_BODY_CHARS, REFUSED_SPEECH, ActionParser, action_instructions, check_allowed
from voice.events import ActionRequested

ALLOWED = {"home/kitchen/light/set": ["ON", "OFF"], "home/fan/set": ["low", "high"]}


def run_whole(text: str) -> tuple[str, list[ActionRequested]]:
    parser = ActionParser(ALLOWED)
    return parser.push(text) + parser.flush(), parser.requests


def run_split(text: str, cuts: list[int]) -> tuple[str, list[ActionRequested]]:
    parser = ActionParser(ALLOWED)
    bounds = [0, *sorted(set(cuts)), len(text)]
    spoken = "".join(parser.push(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    return spoken + parser.flush(), parser.requests


# ---- examples -----------------------------------------------------------------------------------------------


def test_allowed_actions_after_a_refused_one_still_count_but_nothing_more_is_spoken():
    spoken, requests = run_whole("[ACTION home/door/set OPEN] Door open. [ACTION home/fan/set low] Fan low.")
    assert spoken == REFUSED_SPEECH
    assert [(r.topic, r.allowed) for r in requests] == [("home/door/set", False), ("home/fan/set", True)]


def test_allowed_marker_is_removed_and_requested():
    spoken, requests = run_whole("Sure. [ACTION home/kitchen/light/set ON] The kitchen lights are on.")
    assert spoken == "Sure.  The kitchen lights are on."
    assert requests == [ActionRequested("home/kitchen/light/set", "ON", True, "")]


def test_payload_case_and_quotes_are_normalised_to_the_allow_list_spelling():
    _, requests = run_whole('[action `home/kitchen/light/set` "off"][Action home/fan/set HIGH]')
    assert requests == [
        ActionRequested("home/kitchen/light/set", "OFF", True, ""),
        ActionRequested("home/fan/set", "high", True, ""),
    ]


def test_topic_off_the_list_is_refused_with_a_reason_and_no_false_confirmation_is_spoken():
    spoken, requests = run_whole("Unlocking. [ACTION home/front_door/lock/set UNLOCK] Done, the door is open.")
    assert spoken == "Unlocking.  Sorry, I can't do that."
    [req] = requests
    assert (req.topic, req.payload, req.allowed) == ("home/front_door/lock/set", "UNLOCK", False)
    assert "not on the allow-list" in req.reason and "mqtt.allowed_actions" in req.reason


def test_payload_off_the_list_is_refused_and_names_the_allowed_ones():
    spoken, [req] = run_whole("[ACTION home/kitchen/light/set BLINK] Blinking now.")
    assert not req.allowed and req.payload == "BLINK" and spoken == REFUSED_SPEECH
    assert "'ON', 'OFF'" in req.reason


def test_topics_are_case_sensitive_like_mqtt():
    _, [req] = run_whole("[ACTION Home/Kitchen/Light/Set ON]")
    assert not req.allowed


def test_unclosed_marker_is_refused_not_spoken():
    spoken, [req] = run_whole("Okay [ACTION home/kitchen/light/set ON")
    assert spoken == "Okay " + REFUSED_SPEECH
    assert not req.allowed and "not closed" in req.reason and req.topic == "home/kitchen/light/set"


def test_newline_ends_a_broken_marker():
    spoken, [req] = run_whole("A [ACTION home/fan/set low\nB")
    assert spoken == "A " + REFUSED_SPEECH and not req.allowed and "on its line" in req.reason


def test_overlong_marker_is_refused():
    spoken, requests = run_whole("[ACTION " + "x" * (MAX_BODY_CHARS + 5))
    assert not requests[0].allowed and "longer than" in requests[0].reason
    assert spoken == REFUSED_SPEECH


def test_empty_marker_is_refused():
    spoken, [req] = run_whole("[ACTION   ]")
    assert spoken == REFUSED_SPEECH
    assert not req.allowed and "names no topic" in req.reason


@pytest.mark.parametrize(
    "text", ["[1] is a citation", "[ACTIONS are fun]", "[ACT now]", "a [ b", "[[ACTION", "[ACTION\nnext line", "[", "]"]
)
def test_brackets_that_are_not_markers_are_spoken_unchanged(text):
    spoken, requests = run_whole(text)
    assert spoken == text and requests == []


def test_text_that_may_start_a_marker_is_held_back_until_decided():
    parser = ActionParser(ALLOWED)
    assert parser.push("Hello [AC") == "Hello "
    assert parser.push("T") == ""
    assert parser.push("ive]") == "[ACTive]"  # decided: not a marker
    assert parser.push(" [ACTION home/fan/set") == " "
    assert parser.push(" low] bye") == " bye"
    assert parser.flush() == ""
    assert parser.requests == [ActionRequested("home/fan/set", "low", True, "")]


def test_a_held_prefix_at_the_end_is_flushed_as_text():
    parser = ActionParser(ALLOWED)
    assert parser.push("see [ACTIO") == "see "
    assert parser.flush() == "[ACTIO"


@pytest.mark.parametrize(
    "allowed, words",
    [
        ({"home/+/set": ["ON"]}, "wildcards"),
        ({"home/a set": ["ON"]}, "without spaces"),
        ({"home/a/set": []}, "no payloads"),
        ({"home/a/set": ["O]N"]}, "']'"),
        ({"home/a/set": [" ON"]}, "surrounding spaces"),
    ],
)
def test_unusable_allow_lists_are_rejected_with_a_fix(allowed, words):
    with pytest.raises(ValueError, match="fix:") as err:
        check_allowed(allowed)
    assert words in str(err.value) and "mqtt.allowed_actions" in str(err.value)


def test_instructions_show_every_allowed_command_as_the_exact_marker():
    text = action_instructions(ALLOWED)
    markers = [line for line in text.splitlines() if line.startswith("[")]
    assert markers == [
        "[ACTION home/kitchen/light/set ON]",
        "[ACTION home/kitchen/light/set OFF]",
        "[ACTION home/fan/set low]",
        "[ACTION home/fan/set high]",
    ]
    # each line the model is shown parses as the allowed request it stands for, and so does the example
    _, requests = run_whole(text)
    assert [(r.topic, r.payload, r.allowed) for r in requests] == [
        ("home/kitchen/light/set", "ON", True),
        ("home/kitchen/light/set", "OFF", True),
        ("home/fan/set", "low", True),
        ("home/fan/set", "high", True),
        ("home/kitchen/light/set", "OFF", True),
    ]


# ---- properties ---------------------------------------------------------------------------------------------

# plain text, with the characters that make the parser hesitate
plain = st.text(alphabet=st.sampled_from(list("ab [ACTIONaction]\n.'\"`") + ["é", "ß"]), max_size=40)
topics = st.sampled_from(["home/kitchen/light/set", "home/fan/set", "home/door/lock/set", "x"])
payloads = st.sampled_from(["ON", "off", "low", "HIGH", "UNLOCK", "'ON'", ""])
keywords = st.sampled_from(["ACTION", "action", "Action"])


@st.composite
def marker(draw):
    topic, payload, keyword = draw(topics), draw(payloads), draw(keywords)
    space = draw(st.sampled_from([" ", "  ", "\t"]))
    return f"[{keyword}{space}{topic} {payload}]", (topic, payload)


def expected_request(topic: str, payload: str) -> tuple[str, str, bool]:
    payload = payload.strip("'\"`")
    for allowed in ALLOWED.get(topic, []):
        if payload.casefold() == allowed.casefold():
            return topic, allowed, True
    return topic, payload, False


@st.composite
def reply(draw):
    """A reply made of plain segments without '[' and markers; returns (text, speakable, expected requests).
    The oracle: plain text is spoken, markers are not; after the first refused marker only the apology is."""
    parts = draw(
        st.lists(
            st.one_of(
                st.text(alphabet=st.sampled_from(list("ab ACTION.,\n]")), max_size=12).map(lambda s: (s, None)),
                marker(),
            ),
            max_size=8,
        )
    )
    text = "".join(p[0] for p in parts)
    speakable, requests, muted = "", [], False
    for segment, spec in parts:
        if spec is None:
            speakable += "" if muted else segment
            continue
        requests.append(expected_request(*spec))
        if not requests[-1][2] and not muted:
            speakable += REFUSED_SPEECH
            muted = True
    return text, speakable, requests


@settings(max_examples=400, deadline=None)
@given(data=reply(), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_markers_are_removed_and_decoded_whatever_the_split(data, cuts):
    text, speakable, expected = data
    spoken, requests = run_split(text, [c for c in cuts if c <= len(text)])
    assert spoken == speakable
    assert [(r.topic, r.payload, r.allowed) for r in requests] == expected
    assert all(r.reason for r in requests if not r.allowed)


@settings(max_examples=400, deadline=None)
@given(
    text=st.lists(st.one_of(plain, marker().map(lambda m: m[0])), max_size=6).map("".join),
    cuts=st.lists(st.integers(0, 250), max_size=15),
)
def test_any_split_gives_the_same_result_as_one_push(text, cuts):
    assert run_split(text, [c for c in cuts if c <= len(text)]) == run_whole(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60).filter(lambda s: "[" not in s))
def test_text_without_brackets_is_passed_on_at_once(text):
    parser = ActionParser(ALLOWED)
    assert parser.push(text) == text and parser.flush() == "" and parser.requests == []


def is_subsequence(short: str, long: str) -> bool:
    chars = iter(long)
    return all(ch in chars for ch in short)


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.one_of(plain, marker().map(lambda m: m[0])), max_size=6).map("".join))
def test_spoken_text_never_contains_a_whole_marker_and_is_never_ahead_of_the_input(text):
    parser = ActionParser(ALLOWED)
    spoken = ""
    for i, ch in enumerate(text):
        spoken += parser.push(ch)
        # apart from the apology, what was released is made of input already read, in order
        assert is_subsequence(spoken.replace(REFUSED_SPEECH, ""), text[: i + 1])
    spoken += parser.flush()
    said = spoken.replace(REFUSED_SPEECH, "")  # the apology is ours: what is left came from the model
    lowered = said.lower()
    for keyword_at in [i for i in range(len(lowered)) if lowered.startswith("[action", i)]:
        rest = said[keyword_at + len("[action") :]
        # whatever follows a spoken "[action" cannot be a marker opening (whitespace other than newline)
        assert not rest or not rest[0].isspace() or rest[0] == "\n"
