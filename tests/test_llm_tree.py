"""Token-tree verification is exact: greedy output token-identical to the target alone (float32), sampling
following the target's distribution, and the target's cache after a tree pass equal to a chain decode's.

Forced paths: a scripted tree draft puts the target's own next token at a chosen place at each depth (the
chain, a sibling, or nowhere), so each step's accepted path is known in advance: through the chain, through a
sibling at depth 1 or deeper, fully accepted, or rejected at the root.
"""

from __future__ import annotations

import pytest
import torch

from llm.acceptance import verify, verify_greedy
from llm.cache import TorchCachedLM
from llm.engine import DecodeSettings, _stop_ids
from llm.policy import DraftLengthPolicy
from llm.proposers import DraftModelProposer, Proposal
from llm.speculative import Generation, SamplingParams
from llm.tree import tree_logits, tree_shape

from conftest_llm import chat_ids, smollm_fp32, smollm_with_cheap_draft, tiny_model
from test_llm_sampling import PROMPT, VOCAB, chi_square_p, exact

GREEDY = SamplingParams()


class ScriptedTree:
    """At each step, depth i (0-based) of the tree holds the target's right token where word i of ``plan(step)``
    says:
    "c" in the chain, "s0" / "s1" as the first / second sibling, "x" nowhere. Every other node is wrong."""

    def __init__(self, prompt_len, reference, vocab, plan):
        self.prompt_len, self.reference, self.vocab, self.plan = prompt_len, reference, vocab, plan
        self.steps = 0

    def catch_up(self, seq, chunk):
        return False  # no cache of its own

    def propose(self, seq, k, params, generator, stop_ids, keep_drafting):
        start = len(seq) - self.prompt_len
        where = self.plan(self.steps).split()
        self.steps += 1
        chain, siblings = [], []
        for i in range(k):
            right = self.reference[start + i] if start + i < len(self.reference) else 0
            wrong = [(right + 1 + m) % self.vocab for m in range(3)]
            w = where[i] if i < len(where) else "c"
            chain.append(right if w == "c" else wrong[0])
            sibs = [wrong[1], wrong[2]]
            if w.startswith("s"):
                sibs[int(w[1])] = right
            siblings.append(sibs)
        return Proposal(chain, None, siblings=siblings)


def expected_accepted(where, k):
    accepted = 0
    for w in where.split()[:k]:
        if w == "c":
            accepted += 1
            continue
        return accepted + (1 if w.startswith("s") else 0)
    return accepted


def chain_cache(model, ids):
    """The cache a plain chain decode of ids leaves (one pass over all of them)."""
    lm = TorchCachedLM(model)
    lm.logits(ids)
    return lm.cache


def assert_same_cache(a, b, atol):
    assert len(a.layers) == len(b.layers)
    for la, lb in zip(a.layers, b.layers, strict=False):
        assert la.keys.shape == lb.keys.shape
        assert torch.allclose(la.keys.float(), lb.keys.float(), atol=atol)
        assert torch.allclose(la.values.float(), lb.values.float(), atol=atol)


def run(model, proposer, prompt, n, k=3, check_cache_atol=None):
    target = TorchCachedLM(model)
    gen = Generation(target, proposer, prompt, GREEDY, n, set(), DraftLengthPolicy(fixed=k, max_k=k))
    while not gen.done:
        gen.step()
        assert target.cache.get_seq_length() == len(target.ids)
        assert target.ids == gen.seq[: len(target.ids)] and len(target.ids) >= len(gen.seq) - 1
        if check_cache_atol is not None:
            assert_same_cache(target.cache, chain_cache(model, target.ids), check_cache_atol)
    return gen


def test_verify_tree_greedy_branches():
    p = torch.nn.functional.one_hot(torch.tensor([5, 6, 7, 8, 1, 2, 3, 4, 9]), 10).float()
    # nodes: chain 0,1 then siblings of chain 0 (nodes 2, 3) and of chain 1 (node 4); row 1+j is after node j
    # the target wants 5 at the root, then after node j the token in row 1+j: 6, 7, 8, 1, 2
    assert verify([5, 6], None, p[:6], True, None, [[1, 2], [3]]) == ([5, 6, 7], [0, 1])  # all + bonus
    assert verify([1, 6], None, p[:6], True, None, [[5, 2], [3]]) == ([5, 8], [2])  # sibling at depth 1
    assert verify([1, 6], None, p[:6], True, None, [[2, 5], [3]]) == ([5, 1], [3])  # its second sibling
    assert verify([5, 1], None, p[:6], True, None, [[2, 3], [6]]) == ([5, 6, 2], [0, 4])  # depth 2 sibling
    assert verify([1, 6], None, p[:6], True, None, [[2, 3], [4]]) == ([5], [])  # rejected at the root
    assert verify([5, 1], None, p[:5], True, None, [[2, 3], []]) == ([5, 6], [0])  # no siblings there


def test_a_tree_without_siblings_accepts_what_the_chain_rule_accepts_on_a_real_model():
    """One rule: the tree path over a bare chain (one masked pass, ``verify`` with empty siblings) accepts and
    commits what the chain path does (a plain pass; ``verify_greedy`` at temperature 0), on SmolLM2's logits."""
    model, tok = smollm_fp32()
    prompt = chat_ids(tok, "What is the capital of France?")
    lm, right = TorchCachedLM(model), []
    for _ in range(4):  # the target's own next four tokens
        right += lm.greedy(prompt + right)
    wrong = [right[0], right[1], right[2] + 1, right[3]]
    for drafts, accepted in ((right, 4), (wrong, 2), ([right[0] + 1, right[1]], 0)):
        chain = TorchCachedLM(model).logits(prompt, drafts)
        tree = tree_logits(TorchCachedLM(model), prompt, drafts, list(range(-1, len(drafts) - 1)))
        assert torch.allclose(chain, tree, atol=1e-4)
        bare = [[] for _ in drafts]
        committed, path = verify_greedy(drafts, TorchCachedLM(model).greedy(prompt, drafts))
        assert len(path) == accepted and committed[:accepted] == drafts[:accepted]
        assert verify(drafts, None, GREEDY.probs(tree), True, None, bare) == (committed, path)
        params = SamplingParams(1.0)
        for seed in range(8):
            by_chain = verify(drafts, None, params.probs(chain), False, torch.Generator().manual_seed(seed))
            by_tree = verify(drafts, None, params.probs(tree), False, torch.Generator().manual_seed(seed), bare)
            assert by_chain == by_tree


def test_tree_shape_fills_near_depths_first():
    assert tree_shape(3, 2, 8) == [1, 1, 1]
    assert tree_shape(3, 3, 7) == [2, 2, 0]
    assert tree_shape(4, 2, 4) == [0, 0, 0, 0]
    assert tree_shape(2, 1, 8) == [0, 0]


PLANS = {  # one plan per step, in turn; depths beyond a plan hold the right token in the chain
    "full": ["c c c"],
    "sibling at depth 1": ["s0"],
    "second sibling at depth 1": ["s1"],
    "sibling deeper": ["c s1", "c c s0"],
    "root rejected": ["x"],
    "mixed": ["c c c", "s0", "c s1", "x", "c c s0", "c x", "s1"],
}


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_forced_tree_paths_tiny(plan, arch):
    model = tiny_model(seed=1 if arch == "llama" else 3, arch=arch)
    prompt, n, k = [3, 1, 4, 1, 5], 24, 3
    reference = run(model, None, prompt, n).new_tokens
    plans = PLANS[plan]
    draft = ScriptedTree(len(prompt), reference, model.config.vocab_size, lambda s: plans[s % len(plans)])
    gen = run(model, draft, prompt, n, k=k, check_cache_atol=1e-5)
    assert gen.new_tokens == reference
    # each step accepted exactly the path its plan laid out
    j, expected = 1, []
    for step in range(len(gen.records) - 1):
        k_step = min(k, n - j - 1)
        accepted = expected_accepted(plans[step % len(plans)], k_step)
        expected.append(min(accepted, n - j))
        j += accepted + 1
    assert [r.accepted for r in gen.records[1:]] == expected
    assert j >= n


def test_tree_from_draft_models_gives_target_output():
    target, other = tiny_model(seed=1), tiny_model(seed=2)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    reference = run(target, None, prompt, 30).new_tokens
    for width, k in ((2, 3), (3, 2), (4, 4)):
        gen = run(target, DraftModelProposer(TorchCachedLM(other), width, 8), prompt, 30, k=k, check_cache_atol=1e-5)
        assert gen.new_tokens == reference
        assert any(r.nodes > r.drafted for r in gen.records)  # siblings were verified
        same = run(target, DraftModelProposer(TorchCachedLM(target), width, 8), prompt, 30, k=k)
        assert same.new_tokens == reference
        assert all(r.accepted == r.drafted for r in same.records)


def test_tree_with_siblings_at_near_depths_only():
    """A node budget that leaves the far depths without siblings ([2, 1, 0, 0]), with a draft that is partly
    right (the target with a perturbed head), so rejections happen at every depth."""
    import copy

    target = tiny_model(seed=1)
    draft = copy.deepcopy(target)
    torch.manual_seed(0)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.3 * torch.randn_like(draft.lm_head.weight))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    reference = run(target, None, prompt, 40).new_tokens
    proposer = DraftModelProposer(TorchCachedLM(draft), width=3, max_nodes=7)
    proposal = proposer.propose(prompt + reference[:1], 4, GREEDY, None, set(), lambda confidence: True)
    assert [len(s) for s in proposal.siblings] == [2, 1, 0, 0]
    gen = run(target, proposer, prompt, 40, k=4, check_cache_atol=1e-5)
    assert gen.new_tokens == reference
    accepted = [r.accepted for r in gen.records[1:]]
    assert 0 < sum(accepted) < 4 * len(accepted)  # partly right
    assert max(accepted[:-3]) >= 2  # some steps reached the depths without siblings


def test_smollm2_fp32_forced_tree_paths_and_cache():
    model, tok = smollm_fp32()
    prompt = chat_ids(tok, "Give me three tips to sleep better. Tips to sleep better are useful.")
    n = 24
    reference = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
    )[0, len(prompt) :].tolist()
    plans = PLANS["mixed"]
    draft = ScriptedTree(len(prompt), reference, model.config.vocab_size, lambda s: plans[s % len(plans)])
    target = TorchCachedLM(model)
    gen = Generation(target, draft, prompt, GREEDY, n, _stop_ids(tok, model), DraftLengthPolicy(fixed=3, max_k=3))
    while not gen.done:
        gen.step()
    assert gen.new_tokens == reference
    assert {r.accepted for r in gen.records[1:]} >= {0, 1, 2, 3}
    assert_same_cache(target.cache, chain_cache(model, target.ids), atol=1e-4)


def test_smollm2_fp32_int8_reduced_vocab_tree_matches_the_target_alone():
    engine = smollm_with_cheap_draft()
    tok = engine.tokenizer
    prompts = [
        chat_ids(tok, "What is the capital of France?"),
        chat_ids(tok, "Give me three tips to sleep better. Tips to sleep better are useful."),
    ]
    for prompt in prompts:
        reference, _ = engine.decode(prompt, DecodeSettings(mode="target", max_new_tokens=24))
        for settings in (
            DecodeSettings(mode="draft", draft_length=3, tree=True, tree_width=3, max_new_tokens=24),
            DecodeSettings(mode="draft", draft_length="adaptive", tree=True, max_new_tokens=24),
        ):
            tokens, stats = engine.decode(prompt, settings)
            assert tokens == reference


# --- sampling --------------------------------------------------------------------------------------------------

N = 1000


class Recording:
    """Wraps a proposer and keeps its last proposal, to tell which steps accepted a sibling."""

    def __init__(self, proposer):
        self.proposer, self.last = proposer, None

    def catch_up(self, seq, chunk):
        return self.proposer.catch_up(seq, chunk)

    def propose(self, *args):
        self.last = self.proposer.propose(*args)
        return self.last


def sample_tree(target, proposer, params, seed=0, k=2):
    """N four-token replies (token 1 from the prefill, tokens 2-3 from one tree step), caches kept between them."""
    generator = torch.Generator().manual_seed(seed)
    t_cache = TorchCachedLM(target)
    first, pairs = torch.zeros(VOCAB), torch.zeros(VOCAB * VOCAB)
    rec = Recording(proposer)
    through_sibling = 0
    for _ in range(N):
        gen = Generation(t_cache, rec, PROMPT, params, 4, set(), DraftLengthPolicy(fixed=k, max_k=k), generator)
        gen.step()
        gen.step()
        r = gen.records[-1]
        if r.accepted and r.committed[: r.accepted] != rec.last.tokens[: r.accepted]:
            through_sibling += 1
        while not gen.done:
            gen.step()
        t1, t2, t3, _ = gen.new_tokens
        first[t1] += 1
        pairs[t2 * VOCAB + t3] += 1
    return first, pairs, through_sibling


class FixedTree:
    """A deterministic tree draft (q one-hot): chain 3, 0 with siblings [1, 2] and [4]."""

    def catch_up(self, seq, chunk):
        return False  # no cache of its own

    def propose(self, seq, k, params, generator, stop_ids, keep_drafting):
        return Proposal([3, 0][:k], None, siblings=[[1, 2], [4]][:k])


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return tiny_model(seed=11, vocab=VOCAB, init=0.2), tiny_model(seed=12, vocab=VOCAB, init=0.2)


CASES = {
    "sampled draft tree, T=1, width 3": (SamplingParams(1.0), "draft"),
    "sampled draft tree, T=0.8 top-k 4 top-p 0.9": (SamplingParams(0.8, 4, 0.9), "draft"),
    "deterministic tree": (SamplingParams(1.0), "fixed"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tree_sampling_follows_the_target_distribution(pair, case):
    target, draft = pair
    params, kind = CASES[case]
    proposer = DraftModelProposer(TorchCachedLM(draft), width=3, max_nodes=8) if kind == "draft" else FixedTree()
    first, pairs, through_sibling = sample_tree(target, proposer, params)
    p1, joint = exact(target, params)
    assert chi_square_p(first, p1) > 1e-3
    assert chi_square_p(pairs, joint) > 1e-3
    assert through_sibling > 0.05 * N  # the sibling branch of the rule really ran
    if kind == "draft":
        _, draft_joint = exact(draft, params)
        assert chi_square_p(pairs, draft_joint) < 1e-6
