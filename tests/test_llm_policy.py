"""The draft-length policy learns from one step record at a time, and each decode settings drafts by its own
policy: two conversations with different settings never retune each other's, while conversations with the same
settings share one on purpose (its measurements are of this device)."""

from __future__ import annotations

import dataclasses

import pytest

from llm.engine import DecodeSettings
from llm.policy import DraftLengthPolicy, DraftStep

from conftest_llm import smollm_engine

SYSTEM = "You are a helpful assistant. Answer briefly."
LONG = DecodeSettings(mode="ngram", draft_length="adaptive", max_draft_length=6, max_new_tokens=24)
SHORT = LONG.but(max_draft_length=2)


def test_the_policy_learns_from_a_step_record():
    policy = DraftLengthPolicy(max_k=6, prior_alpha=0.5)
    step = DraftStep(drafted=4, accepted=4, draft_s=0.02, draft_steps=4, verify_s=0.1, fed=5, confidence=(0.9,) * 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.accepted = 0  # type: ignore[misc]
    policy.update(step)
    assert policy.alpha > 0.5  # all four accepted: acceptance rises
    assert policy.draft_s == pytest.approx(0.005) and policy.verify_s == {5: 0.1}
    policy.update(dataclasses.replace(step, accepted=0, verify_s=0.2))
    assert policy.verify_s[5] == pytest.approx(0.8 * 0.1 + 0.2 * 0.2)  # a moving average of the measured pass


async def test_two_conversations_with_different_settings_do_not_share_a_mutated_policy():
    engine = smollm_engine(LONG, context_limit=1024)
    long_policy, short_policy = engine.policy_for(LONG), engine.policy_for(SHORT)
    assert long_policy is not short_policy
    first, second = engine.conversation(SYSTEM), engine.conversation(SYSTEM)
    question = "Repeat after me: the cat sat on the mat, the cat sat on the mat."
    for _ in range(2):  # interleaved turns
        assert "".join([e.text async for e in first.reply(question, LONG)])
        assert "".join([e.text async for e in second.reply(question, SHORT)])
    assert engine.policy_for(LONG) is long_policy and engine.policy_for(SHORT) is short_policy
    assert (long_policy.max_k, short_policy.max_k) == (6, 2)  # neither conversation retuned the other's
    assert short_policy.verify_s and max(short_policy.verify_s) <= 3  # it measured only its own passes (k <= 2)
    assert long_policy.steps > 0 and short_policy.steps > 0  # each learned from its own conversation
    # the same settings (max_new_tokens does not shape a policy) share one; a seeded run gets a fresh one each time
    assert engine.policy_for(LONG.but(max_new_tokens=8)) is long_policy
    assert engine.policy_for(LONG.but(seed=1)) is not engine.policy_for(LONG.but(seed=1))
    assert len(engine.policies) == 2
