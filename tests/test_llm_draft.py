"""The cheap draft and how long it drafts: an int4 draft with a counted head leaves the output exactly the
target's in float32 (the draft's precision must not change the output), and the confidence stop drafts long
when the draft is sure, short when it is not, and stays exact (greedy) and reproducible (seeded sampling)."""

from __future__ import annotations

import copy
from collections import Counter

from llm.cache import TorchCachedLM
from llm.engine import DecodeSettings, Engine
from llm.models import reduce_vocab_head
from llm.policy import DraftLengthPolicy, DraftStep
from llm.quant import Int4Linear, quantize_weights
from llm.speculative import Generation, SamplingParams
from llm.vocab import head_ids

from conftest_llm import ScriptedDraft, chat_ids, smollm_fp32, tiny_model

PROMPTS = ["What is the capital of France?", "Give me three tips to sleep better.", "Tell me about the moon."]


def int4_engine(width_rows: int = 4096) -> Engine:
    """SmolLM2 fp32 target; draft: a copy with a reduced head (counted from the target's own replies, then
    merge order) and int4 weights everywhere, activations in bf16."""
    model, tok = smollm_fp32()
    draft = copy.deepcopy(model)
    ref = Engine(model, tok, None, mode="target")
    counts: Counter[int] = Counter()
    for text in PROMPTS[:2]:
        counts.update(ref.decode(chat_ids(tok, text), DecodeSettings(mode="target", max_new_tokens=24))[0])
    out_ids = head_ids(tok, width_rows, counts)
    reduce_vocab_head(draft, out_ids)
    quantize_weights(draft, 4)
    return Engine(model, tok, draft, mode="draft", draft_out_ids=out_ids)


def test_fp32_target_with_an_int4_counted_head_draft_is_token_identical():
    engine = int4_engine()
    assert any(isinstance(m, Int4Linear) for m in engine.draft_model.modules())
    drafted = 0
    for text in PROMPTS:
        prompt = chat_ids(engine.tokenizer, text)
        reference, _ = engine.decode(prompt, DecodeSettings(mode="target", max_new_tokens=32))
        for settings in (
            DecodeSettings(mode="draft", draft_length=3, max_new_tokens=32),
            DecodeSettings(mode="draft", draft_length="confidence", max_draft_length=8, max_new_tokens=32),
            DecodeSettings(mode="draft", draft_length=2, tree=True, max_new_tokens=32),
        ):
            tokens, stats = engine.decode(prompt, settings)
            assert tokens == reference, (text, settings.draft_length)
            drafted += stats.drafted
            assert stats.accepted > 0
    assert drafted > 0


def test_confidence_policy_drafts_while_it_pays():
    cheap = DraftLengthPolicy(max_k=8, confidence=True)
    cheap.draft_s, cheap.verify_s = 0.01, {1: 0.3, 2: 0.3, 4: 0.3, 9: 0.3}
    assert cheap.choose(100) == 8  # the cap; the stop decides
    assert cheap.keep_drafting([0.99] * 7)  # sure and cheap: go on
    assert not cheap.keep_drafting([0.3, 0.2])  # unsure: even a cheap step is not worth it
    dear = copy.deepcopy(cheap)
    dear.draft_s = 0.2  # a draft step costs most of a target pass
    assert not dear.keep_drafting([0.9, 0.9])
    fixed = DraftLengthPolicy(max_k=8, confidence=True, threshold=0.5)
    assert fixed.keep_drafting([0.9, 0.8]) and not fixed.keep_drafting([0.9, 0.5])  # product 0.72, then 0.36
    # calibration: a draft that is right less often than it claims gets its confidence scaled down
    fixed.update(
        DraftStep(drafted=4, accepted=0, draft_s=0.0, draft_steps=0, verify_s=0.3, fed=5, confidence=(0.9,) * 4)
    )
    assert fixed.kappa < 1 and not fixed.keep_drafting([0.9, 0.8])


def test_confidence_stop_drafts_long_on_easy_stretches_and_stays_exact():
    """A scripted draft reports high confidence where it is right and low where it is wrong: the lengths
    follow, and the output is the target's."""
    target = tiny_model(seed=1)
    prompt, n = [3, 1, 4, 1, 5], 40
    lm = TorchCachedLM(target)
    ref = Generation(lm, None, prompt, SamplingParams(), n, set(), DraftLengthPolicy(fixed=1, max_k=1))
    while not ref.done:
        ref.step()
    reference = ref.new_tokens
    right = lambda j: j < 20 or j % 4 != 0  # noqa: E731 - easy first half, then every fourth position is wrong

    class Sure(ScriptedDraft):
        def propose(self, seq, k, params, generator, stop_ids, keep_drafting):
            proposal = super().propose(seq, k, params, generator, stop_ids, keep_drafting)
            start = len(seq) - self.prompt_len
            tokens, conf = [], []
            for i, t in enumerate(proposal.tokens):
                tokens.append(t)
                conf.append(0.98 if right(start + i) else 0.2)
                if not keep_drafting(conf):
                    break
            proposal.tokens, proposal.confidence = tokens, conf
            return proposal

    draft = Sure(len(prompt), lambda j: reference[j] if j < n and right(j) else (reference[min(j, n - 1)] + 1) % 32)
    policy = DraftLengthPolicy(max_k=8, confidence=True)
    policy.draft_s, policy.verify_s = 0.01, {m: 0.3 for m in range(1, 10)}
    gen = Generation(TorchCachedLM(target), draft, prompt, SamplingParams(), n, set(), policy)
    while not gen.done:
        gen.step()
    assert gen.new_tokens == reference
    lengths = [r.drafted for r in gen.records[1:]]
    assert max(lengths[:2]) == 8  # long while the draft is sure and right
    assert min(lengths) <= 2  # short where it is not


def test_confidence_stop_sampling_is_reproducible_with_a_seed():
    engine = int4_engine()
    prompt = chat_ids(engine.tokenizer, PROMPTS[2])
    settings = DecodeSettings(
        mode="draft", draft_length="confidence", temperature=0.8, top_p=0.9, seed=11, max_new_tokens=24
    )
    first, _ = engine.decode(prompt, settings)
    again, _ = engine.decode(prompt, settings)
    assert first == again and len(first) > 0
