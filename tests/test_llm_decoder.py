"""The greedy speculative loop is exact: token-identical to the target alone, in float32.

Forced partial acceptance: a scripted draft is right exactly at chosen positions, so each verify step accepts a
known number of tokens and every branch (accept all + bonus, reject first, reject in the middle) runs; the
output must still equal the target alone, and the caches must hold exactly what they claim.
"""

from __future__ import annotations

import pytest
import torch

from llm.acceptance import verify
from llm.cache import TorchCachedLM, common_prefix
from llm.engine import DecodeSettings, Engine
from llm.policy import DraftLengthPolicy
from llm.proposers import DraftModelProposer, NgramProposer
from llm.speculative import Generation, SamplingParams

from conftest_llm import ScriptedDraft, chat_ids, smollm_fp32, smollm_with_cheap_draft, tiny_model

GREEDY = SamplingParams()


def run(target_model, proposer, prompt, n, k=3, stop_ids=frozenset(), target=None, check_cache=False):
    target = target or TorchCachedLM(target_model)
    gen = Generation(target, proposer, prompt, GREEDY, n, set(stop_ids), DraftLengthPolicy(fixed=k, max_k=k))
    while not gen.done:
        gen.step()
        if check_cache:  # the cache holds exactly the ids it records, and they extend the committed sequence
            assert target.cache.get_seq_length() == len(target.ids)
            assert common_prefix(target.ids, gen.seq) >= len(gen.seq) - 1  # all but the newest token
    return gen


def test_verify_greedy_branches():
    p = torch.nn.functional.one_hot(torch.tensor([5, 6, 7, 8]), 10).float()  # the target wants 5, 6, 7 then 8
    assert verify([5, 6, 7], None, p, True, None) == ([5, 6, 7, 8], [0, 1, 2])  # all accepted + bonus
    assert verify([1, 6, 7], None, p, True, None) == ([5], [])  # first rejected: the correction only
    assert verify([5, 6, 1], None, p, True, None) == ([5, 6, 7], [0, 1])  # rejected in the middle
    assert verify([], None, p[:1], True, None) == ([5], [])  # nothing drafted: one target token


@pytest.mark.parametrize("pattern", ["all", "none", "alternate", "every_third_wrong", "late"])
def test_forced_partial_acceptance_tiny(pattern):
    target = tiny_model(seed=1)
    prompt, n, k = [3, 1, 4, 1, 5], 24, 3
    reference = run(target, None, prompt, n).new_tokens  # the target alone (no proposer: one token per pass)
    right = {
        "all": lambda j: True,
        "none": lambda j: False,
        "alternate": lambda j: j % 2 == 0,
        "every_third_wrong": lambda j: j % 3 != 2,
        "late": lambda j: j >= 12,
    }[pattern]
    vocab = target.config.vocab_size
    draft = ScriptedDraft(
        len(prompt), lambda j: reference[j] if j < n and right(j) else ((reference[j] + 1) % vocab if j < n else 0)
    )
    gen = run(target, draft, prompt, n, k=k, check_cache=True)
    assert gen.new_tokens == reference

    # each step accepts exactly the run of right positions it was offered
    j, expected = 1, []
    while j < n:
        k_step = min(k, n - j - 1)
        accepted = 0
        while accepted < k_step and right(j + accepted):
            accepted += 1
        expected.append(accepted)
        j += accepted + 1
    assert [r.accepted for r in gen.records[1:]] == expected
    assert gen.target_calls == 1 + len(expected)


def test_tiny_draft_models_give_target_output():
    target, other = tiny_model(seed=1), tiny_model(seed=2)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    reference = run(target, None, prompt, 30).new_tokens
    for k in (1, 2, 4):
        # a different random model: mostly rejected; the target itself as draft: everything accepted
        gen = run(target, DraftModelProposer(TorchCachedLM(other)), prompt, 30, k=k, check_cache=True)
        assert gen.new_tokens == reference
        same = run(target, DraftModelProposer(TorchCachedLM(target)), prompt, 30, k=k)
        assert same.new_tokens == reference
        assert all(r.accepted == r.drafted for r in same.records)
    qwen_like = tiny_model(seed=3, arch="qwen2")
    ref_q = run(qwen_like, None, prompt, 20).new_tokens
    other = DraftModelProposer(TorchCachedLM(tiny_model(seed=4, arch="qwen2")))
    assert run(qwen_like, other, prompt, 20).new_tokens == ref_q


def test_stop_token_and_length_limit_end_like_the_target():
    target = tiny_model(seed=1)
    prompt = [3, 1, 4]
    free = run(target, None, prompt, 20).new_tokens
    stop = free[7]
    first_stop = free.index(stop)
    reference = run(target, None, prompt, 20, stop_ids={stop}).new_tokens
    assert reference == free[: first_stop + 1]
    draft = ScriptedDraft(len(prompt), lambda j: free[j] if j < len(free) else 0)  # always right: runs past stop
    gen = run(target, draft, prompt, 20, k=4, stop_ids={stop})
    assert gen.new_tokens == reference
    limited = run(target, draft, prompt, 6, k=4)
    assert limited.new_tokens == free[:6]


def test_ngram_proposer_finds_the_latest_match():
    ngram = NgramProposer(max_n=2)
    seq = [1, 2, 3, 9, 1, 2, 4, 5, 1, 2]
    always = lambda confidence: True  # noqa: E731 - the confidence stop, off
    assert ngram.propose(seq, 3, GREEDY, None, set(), always).tokens == [4, 5, 1]  # the latest "1 2" was followed by 4
    assert ngram.propose([7, 8], 3, GREEDY, None, set(), always).tokens == []


def test_cache_reuse_and_rollback_across_replies():
    """A kept cache (prefix reuse, rolled back after rejections) gives the same output as a fresh one."""
    target, other = tiny_model(seed=1), tiny_model(seed=2)
    t_cache, d_cache = TorchCachedLM(target), TorchCachedLM(other)
    turn1 = [3, 1, 4, 1, 5]
    first = run(target, DraftModelProposer(d_cache), turn1, 12, target=t_cache).new_tokens
    turn2 = turn1 + first[:5] + [7, 7, 2]  # the history keeps part of the reply, then a new user turn
    kept = t_cache.keep_prefix_of(turn2)
    assert kept == len(turn1) + 5
    again = run(target, DraftModelProposer(d_cache), turn2, 12, target=t_cache, check_cache=True).new_tokens
    assert again == run(target, None, turn2, 12).new_tokens


def smollm_prompts(tok):
    return [
        chat_ids(tok, "What is the capital of France?"),
        chat_ids(tok, "Give me three tips to sleep better. Tips to sleep better are useful."),
    ]


def test_smollm2_fp32_every_mode_matches_the_target_alone():
    model, tok = smollm_fp32()
    engine = Engine(model, tok, model, mode="draft")  # SmolLM2 as its own draft: everything accepted
    for prompt in smollm_prompts(tok):
        reference = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=24,
            do_sample=False,
        )[0, len(prompt) :].tolist()
        for settings in (
            DecodeSettings(mode="target", max_new_tokens=24),
            DecodeSettings(mode="ngram", draft_length=4, max_new_tokens=24),
            DecodeSettings(mode="draft", draft_length=3, max_new_tokens=24),
        ):
            tokens, stats = engine.decode(prompt, settings)
            assert tokens == reference, settings.mode
        assert stats.accepted == stats.drafted > 0


def test_smollm2_fp32_int8_reduced_vocab_draft_matches_the_target_alone():
    """A genuinely different draft with the same tokenizer: int8 weights and a 8192-token head."""
    engine = smollm_with_cheap_draft()
    for prompt in smollm_prompts(engine.tokenizer):
        reference, _ = engine.decode(prompt, DecodeSettings(mode="target", max_new_tokens=24))
        tokens, stats = engine.decode(prompt, DecodeSettings(mode="draft", draft_length=2, max_new_tokens=24))
        assert tokens == reference
        assert 0 < stats.accepted < stats.drafted  # partly right: a real draft, not a copy
        # adaptive may well decide not to draft here (this draft costs about what the target does): still exact
        tokens, _ = engine.decode(prompt, DecodeSettings(mode="draft", draft_length="adaptive", max_new_tokens=24))
        assert tokens == reference
