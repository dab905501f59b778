"""A constrained stretch inside a free reply (llm/constrain.py): after the trigger only a given continuation can be
decoded, and before it the reply is the free reply token for token, with n-gram drafts and with a draft model
(whose drafts must not run past the trigger). SmolLM2-135M in float32: no big model."""

from __future__ import annotations

import pytest

from llm.constrain import ChoiceConstraint
from llm.settings import DecodeSettings
from llm.speculative import Generation
from tests.conftest_llm import chat_ids, smollm_engine, smollm_fp32, smollm_with_cheap_draft

QUESTION = "Name three colours of the rainbow."


def generate(engine, settings, constraint=None, written: str = "") -> Generation:
    """The reply to QUESTION, generated (``written``: after this text, as if the reply had opened with it)."""
    tok = engine.tokenizer
    target, draft = engine.new_caches()
    prompt = chat_ids(tok, QUESTION) + (tok.encode(written, add_special_tokens=False) if written else [])
    gen = engine.generation(prompt, settings, target, draft, constraint)
    while not gen.done:
        gen.step()
    return gen


def decode(engine, settings, constraint=None, written: str = "") -> str:
    gen = generate(engine, settings, constraint, written)
    return engine.tokenizer.decode([t for t in gen.new_tokens if t not in engine.stop_ids])


@pytest.mark.parametrize("make, mode", [(smollm_engine, "ngram"), (smollm_with_cheap_draft, "draft")])
def test_after_the_trigger_only_a_choice_is_decoded_and_before_it_nothing_changes(make, mode):
    settings = DecodeSettings(mode=mode, max_new_tokens=40, draft_length=4 if mode == "draft" else "adaptive")
    engine = make(settings) if mode == "ngram" else make()
    free = decode(engine, settings)
    words = free.split()
    assert len(words) > 4, free
    trigger = " ".join(words[:2])  # the reply's own opening: the constrained stretch starts right after it
    choices = [" purple elephants]", " green giraffes]"]
    constraint = ChoiceConstraint(engine.tokenizer, trigger, choices)
    constrained = decode(engine, settings, constraint)
    at = constrained.upper().index(trigger.upper()) + len(trigger)
    assert constrained[:at] == free[: len(constrained[:at])]  # the free part is the free reply's
    assert any(constrained[at:].startswith(c) for c in choices), constrained
    assert constraint.used >= 2


def test_a_constraint_needs_a_choice_and_is_free_until_its_trigger():
    _, tok = smollm_fp32()
    with pytest.raises(ValueError, match="at least one choice or opening"):
        ChoiceConstraint(tok, "[ACTION", [])
    only_opening = ChoiceConstraint(tok, "[ACTION", [], ["[ACTION home/a/set ON]"])  # then any marker is free
    assert only_opening.allowed([]) == [tok.encode("[ACTION home/a/set ON]", add_special_tokens=False)[0]]
    constraint = ChoiceConstraint(tok, "[ACTION", [" home/a/set ON]"])
    opening = tok.encode("Sure. [ACTION", add_special_tokens=False)
    assert constraint.allowed(opening[:-1]) is None
    assert constraint.free_drafts(opening[:-2], opening[-2:]) == 1  # the draft that completes the trigger is cut
    first = constraint.allowed(opening)
    assert first == [tok.encode(" home/a/set ON]", add_special_tokens=False)[0]]


@pytest.mark.parametrize("make, mode", [(smollm_engine, "ngram"), (smollm_with_cheap_draft, "draft")])
def test_an_opening_is_the_replys_first_text_and_the_rest_is_free(make, mode):
    """A caller that knows how the reply must start (a home command the words decide) has the model write it from
    the first token; then the decode is free: exactly the target's own reply after that opening."""
    settings = DecodeSettings(mode=mode, max_new_tokens=40, draft_length=4 if mode == "draft" else "adaptive")
    engine = make(settings) if mode == "ngram" else make()
    opening = "Here are three:"  # not its own opening ("The rainbow is ..."): the constraint writes it
    constraint = ChoiceConstraint(engine.tokenizer, "[ACTION", [" home/a/set ON]"], [opening])
    gen = generate(engine, settings, constraint)
    constrained = engine.tokenizer.decode([t for t in gen.new_tokens if t not in engine.stop_ids])
    assert constrained.startswith(opening), constrained
    opening_ids = engine.tokenizer.encode(opening, add_special_tokens=False)
    assert constraint.used == len(opening_ids) > 1
    assert gen.records[0].committed == opening_ids  # one way on: all of it in the first pass, not a pass a token
    after = decode(engine, settings.but(max_new_tokens=40 - constraint.used), written=opening)
    assert after.strip() and constrained[len(opening) :] == after  # what follows is the model's own, token for token
