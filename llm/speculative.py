"""The speculative decoding loop: propose tokens cheaply, verify them in one target pass, keep the exact ones.

Read top to bottom: ``SamplingParams``, ``verify`` (the acceptance rule of Leviathan et al. / Chen et al.), and
``Generation`` (one reply, advanced one step at a time by its caller). The parts live in their own modules:
the cached model (cache.py), the proposers (proposers.py), the draft-length policy (policy.py) and token trees
(tree.py).

Synchronous on purpose: the asyncio layer (engine.py) runs each ``Generation.step`` in a worker thread, and
awaits between steps, so a step is the unit of cancellation. That is why the prompt is prefilled in chunks
(one chunk per step) and the draft catches up on a new turn in chunks too: a cancel lands within one chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from llm.cache import CachedLM, TorchCachedLM
from llm.policy import DraftLengthPolicy
from llm.proposers import Proposal, Proposer
from llm.sampling import draw, is_greedy, probabilities, uniform
from llm.tree import keep_path, tree_logits, verify_tree


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return probabilities(logits, self.temperature, self.top_k, self.top_p)


def verify(
    drafts: list[int], q: torch.Tensor | None, p: torch.Tensor, greedy: bool, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """The acceptance rule. p: [len(drafts)+1, V] target distributions; q as in Proposal.

    Returns (tokens to commit, number of drafts accepted). The committed tokens are the accepted drafts and
    then either the correction at the first rejection, or a bonus token from the last distribution.
    """
    if greedy:
        return verify_greedy(drafts, [int(i) for i in p.numpy().argmax(-1)])
    out: list[int] = []
    for i, d in enumerate(drafts):
        qd = 1.0 if q is None else float(q[i, d])
        if uniform(generator) < min(1.0, float(p[i, d]) / qd):
            out.append(d)
            continue
        drafted = torch.zeros_like(p[i]).index_fill_(0, torch.tensor([d]), 1.0) if q is None else q[i]
        residual = torch.clamp(p[i] - drafted, min=0.0)
        total = residual.sum()
        # total is 0 only if p == q up to rounding, where rejection had probability ~0: fall back to p
        out.append(draw(residual / total if total > 0 else p[i], generator))
        return out, i
    out.append(draw(p[len(drafts)], generator))
    return out, len(drafts)


def verify_greedy(drafts: list[int], choices: list[int]) -> tuple[list[int], int]:
    """The acceptance rule at temperature 0, where p is one-hot on the target's own choice at each position
    (``choices``, one more than drafts): a draft is kept while it is that choice; the choice at the first
    mismatch (or after the last draft) is committed with them. Same return as ``verify``."""
    for i, d in enumerate(drafts):
        if d != choices[i]:
            return drafts[:i] + [choices[i]], i
    return drafts + [choices[len(drafts)]], len(drafts)


@dataclass
class StepRecord:
    drafted: int  # chain tokens (a tree's depth)
    accepted: int  # tokens of the accepted path (through a sibling too): the committed tokens minus the last
    committed: list[int]
    t: float  # time.monotonic() when the step's tokens were verified
    nodes: int = 0  # tokens the target verified: drafted, plus a tree's siblings


@dataclass
class Generation:
    """One reply: the first steps are the target's prefill (in chunks of ``prefill_chunk`` tokens, the last one
    giving the first token), each later step is draft + verify. While the draft is more than a chunk behind
    (a new turn), a step feeds it one chunk and commits nothing.

    ``step()`` returns the tokens committed by that step ([] for a prefill chunk, and once finished). Not
    thread-safe: the caller serialises steps (engine.py holds a lock around them).
    """

    target: CachedLM
    proposer: Proposer | None
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    stop_ids: set[int]
    policy: DraftLengthPolicy
    generator: torch.Generator | None = None
    prefill_chunk: int = 0  # 0: the whole prompt in one pass
    seq: list[int] = field(init=False)
    new_tokens: list[int] = field(default_factory=list)
    done: bool = False
    records: list[StepRecord] = field(default_factory=list)
    target_calls: int = 0
    first_token_t: float | None = None

    def __post_init__(self) -> None:
        self.seq = list(self.prompt)
        if self.max_new_tokens <= 0:
            self.done = True

    def step(self) -> list[int]:
        if self.done:
            return []
        if not self.new_tokens:
            held = self.target.keep_prefix_of(self.seq)
            if self.prefill_chunk and len(self.seq) - 1 - held > self.prefill_chunk:
                self.target.prefill(self.seq, held + self.prefill_chunk)
                return []
            # the first token: the target's (last) prefill chunk alone, the draft catches up later
            if self.params.greedy:
                return self._commit(self.target.greedy(self.seq)[-1:], 0, 0, 1)
            p = self.params.probs(self.target.logits(self.seq))
            return self._commit([draw(p[-1], self.generator)], 0, 0, 1)
        catch_up = getattr(self.proposer, "catch_up", None)
        if self.prefill_chunk and catch_up is not None and catch_up(self.seq, self.prefill_chunk):
            return []
        return self._speculate()

    def _speculate(self) -> list[int]:
        remaining = self.max_new_tokens - len(self.new_tokens)
        k = self.policy.choose(remaining) if self.proposer is not None else 0
        proposal = Proposal([], None)
        if self.proposer is not None and k > 0:
            # the confidence stop is passed only when on: a proposer without it still serves the other policies
            stop = {"keep_drafting": self.policy.keep_drafting} if self.policy.confidence else {}
            proposal = self.proposer.propose(self.seq, k, self.params, self.generator, self.stop_ids, **stop)
        drafts = proposal.tokens[:k]
        siblings = proposal.siblings[: len(drafts)]
        start = time.perf_counter()
        sibling_hit = None
        if any(siblings):  # a token tree: one pass over all nodes, then keep the accepted path's cache only
            if not isinstance(self.target, TorchCachedLM):
                raise NotImplementedError("token trees run on the torch engine only; fix: set llm.tree = false")
            nodes, parents = proposal.tree(k)
            p = self.params.probs(tree_logits(self.target, self.seq, nodes, parents))
            committed, path = verify_tree(drafts, proposal.q, siblings, p, self.params.greedy, self.generator)
            keep_path(self.target, nodes, path)
            accepted = len(path)
            chain = sum(1 for j in path if j < len(drafts))
            if chain < len(siblings) and siblings[chain]:
                sibling_hit = accepted > chain
            fed, chain_accepted = len(nodes) + 1, chain
        elif self.params.greedy:  # the target's choices alone: no distribution over the vocabulary is built
            committed, accepted = verify_greedy(drafts, self.target.greedy(self.seq, drafts))
            fed, chain_accepted = len(drafts) + 1, accepted
        else:
            p = self.params.probs(self.target.logits(self.seq, drafts))
            committed, accepted = verify(drafts, proposal.q, p, False, self.generator)
            fed, chain_accepted = len(drafts) + 1, accepted
        if self.proposer is not None:
            self.policy.update(
                len(drafts),
                chain_accepted,
                proposal.seconds,
                proposal.timed_steps,
                time.perf_counter() - start,
                fed,
                sibling_hit,
                proposal.confidence[: len(drafts)],
            )
        return self._commit(committed, len(drafts), accepted, fed)

    def _commit(self, committed: list[int], drafted: int, accepted: int, fed: int) -> list[int]:
        self.target_calls += 1
        committed = committed[: self.max_new_tokens - len(self.new_tokens)]
        for i, token in enumerate(committed):
            if token in self.stop_ids:
                committed = committed[: i + 1]
                self.done = True
                break
        self.seq.extend(committed)
        self.new_tokens.extend(committed)
        if len(self.new_tokens) >= self.max_new_tokens:
            self.done = True
        now = time.monotonic()
        if self.first_token_t is None:
            self.first_token_t = now
        self.records.append(StepRecord(drafted, min(accepted, len(committed)), committed, now, fed - 1))
        return committed
