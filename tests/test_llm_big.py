"""The embedded pair (Qwen2.5-Coder 1.5B target, 0.5B draft): exact in float32 with the cheap draft, and the
incompatible-pair check on real tokenizers. Slow (loads 1.5B in float32): marked big."""

from __future__ import annotations

import pytest

from llm.engine import DecodeSettings, Engine
from voice.models import resolve

pytestmark = pytest.mark.big


@pytest.fixture(scope="module")
def qwen_pair():
    target = str(resolve("qwen2.5-coder-1.5b-instruct", "llm").path)
    draft = str(resolve("qwen2.5-coder-0.5b-instruct", "llm").path)
    return Engine.load(target, draft, dtype="float32", mode="draft", draft_quantize="int8", draft_vocab=32768,
                       threads=1, context_limit=2048)


def test_qwen_pair_fp32_int8_reduced_draft_is_token_identical_to_the_target(qwen_pair):
    conv = qwen_pair.conversation("You are a helpful voice assistant. Answer in one short sentence.")
    prompt = conv.prompt_ids(conv.messages + [{"role": "user", "content": "How do I boil an egg?"}])
    reference, _ = qwen_pair.decode(prompt, DecodeSettings(mode="target", max_new_tokens=20))
    tokens, stats = qwen_pair.decode(prompt, DecodeSettings(mode="draft", draft_length=3, max_new_tokens=20))
    assert tokens == reference
    assert stats.accepted > 0 and stats.target_calls < len(tokens)  # the draft really saved target passes
