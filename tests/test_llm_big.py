"""The embedded pair (Qwen2.5-Coder 1.5B target, 0.5B draft): exact in float32 with the shipped int4 draft,
and an acceptance floor for the shipped configuration, so that a change that breaks acceptance (a worse
quantizer, a wrong head, a template mismatch) fails here rather than only in a benchmark. Slow: marked big."""

from __future__ import annotations

import pytest

from llm.engine import DecodeSettings, Engine
from llm.prompts import HELD_OUT, SYSTEM
from llm.vocab import chat_prompt
from voice.config import load_config
from voice.models import resolve

pytestmark = pytest.mark.big


def pair() -> tuple[str, str]:
    return (
        str(resolve("qwen2.5-coder-1.5b-instruct", "llm").path),
        str(resolve("qwen2.5-coder-0.5b-instruct", "llm").path),
    )


def test_qwen_pair_fp32_int4_counted_head_draft_is_token_identical_to_the_target():
    target, draft = pair()
    engine = Engine.load(
        target,
        draft,
        dtype="float32",
        mode="draft",
        draft_quantize="int4",
        draft_vocab=32768,
        threads=1,
        context_limit=2048,
    )
    assert engine.info["draft_layers"] == {"int4": 169}
    for text in ("How do I boil an egg?", "Why do cats like boxes?"):
        prompt = chat_prompt(engine.tokenizer, text, "You are a helpful voice assistant. Answer in one short sentence.")
        reference, _ = engine.decode(prompt, DecodeSettings(mode="target", max_new_tokens=20))
        for settings in (
            DecodeSettings(mode="draft", draft_length=3, max_new_tokens=20),
            DecodeSettings(mode="draft", draft_length="confidence", max_new_tokens=20),
        ):
            tokens, stats = engine.decode(prompt, settings)
            assert tokens == reference
            assert stats.accepted > 0 and stats.target_calls < len(tokens)  # the draft really saved target passes


def test_shipped_pair_acceptance_floor():
    """alpha (accepted / (accepted + rejections)) of the shipped configuration, greedy, k = 3, on 12 held-out
    prompts. Measured 0.60 here (bench llm's prompts: 0.66-0.70); the floor sits under it so that a change that
    lowers acceptance (a worse quantizer, a wrong head, a template mismatch) fails here. The goal of 0.7 on these
    prompts is not reached yet."""
    target, draft = pair()
    llm = load_config("configs/default.toml", environ={}).llm.model_dump()
    engine = Engine.from_config(target, draft, {**llm, "engine": "torch", "context_limit": 2048})
    accepted = rejections = 0
    for text in HELD_OUT[:12]:
        prompt = chat_prompt(engine.tokenizer, text, SYSTEM)
        _, stats = engine.decode(prompt, DecodeSettings(mode="draft", draft_length=3, max_new_tokens=32))
        accepted += stats.accepted
        rejections += sum(1 for d, a in zip(stats.draft_lengths, stats.accepted_lengths, strict=False) if a < d)
    alpha = accepted / (accepted + rejections)
    assert alpha >= 0.55, f"acceptance fell to {alpha:.3f}"
