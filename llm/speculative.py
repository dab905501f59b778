"""The speculative decoding loop: propose tokens cheaply, verify them in one target pass, keep the exact ones.

Read ``Generation``: one reply, advanced one step at a time by its caller. The parts live in their own
modules: the acceptance rule (acceptance.py, one rule for a chain and a token tree), the cached model
(cache.py), the proposers (proposers.py), the draft-length policy (policy.py) and token trees (tree.py).

Synchronous on purpose: the asyncio layer (engine.py) runs each ``Generation.step`` in a worker thread, and
awaits between steps, so a step is the unit of cancellation. That is why the prompt is prefilled in chunks
(one chunk per step) and the draft catches up on a new turn in chunks too: a cancel lands within one chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from llm.acceptance import verify, verify_greedy
from llm.cache import CachedLM, TorchCachedLM
from llm.constrain import ChoiceConstraint
from llm.policy import DraftLengthPolicy, DraftStep
from llm.proposers import Proposal, Proposer
from llm.sampling import SamplingParams, draw
from llm.settings import DecodeStats
from llm.tree import keep_path, tree_logits


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
    constraint: ChoiceConstraint | None = None  # a short constrained stretch after a trigger text (llm/constrain.py)
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
            if self.constraint is not None and (allowed := self.constraint.allowed([])) is not None:
                return self._constrained(allowed)  # the constraint's opening
            if self.params.greedy:
                return self._commit(self.target.greedy(self.seq)[-1:], 0, 0, 1)
            p = self.params.probs(self.target.logits(self.seq))
            return self._commit([draw(p[-1], self.generator)], 0, 0, 1)
        if self.prefill_chunk and self.proposer is not None and self.proposer.catch_up(self.seq, self.prefill_chunk):
            return []
        return self._speculate()

    def _speculate(self) -> list[int]:
        if self.constraint is not None and (allowed := self.constraint.allowed(self.new_tokens)) is not None:
            return self._constrained(allowed)
        remaining = self.max_new_tokens - len(self.new_tokens)
        k = self.policy.choose(remaining) if self.proposer is not None else 0
        proposal = Proposal([], None)
        if self.proposer is not None and k > 0:
            proposal = self.proposer.propose(
                self.seq, k, self.params, self.generator, self.stop_ids, self.policy.keep_drafting
            )
        drafts = proposal.tokens[:k]
        q = proposal.q
        if self.constraint is not None:  # no drafted token may complete the trigger: the target's own step does
            drafts = drafts[: self.constraint.free_drafts(self.new_tokens, drafts)]
            q = q[: len(drafts)] if q is not None else None
        siblings = proposal.siblings[: len(drafts)]
        start = time.perf_counter()
        if any(siblings):  # a token tree: one pass over all nodes, then keep the accepted path's cache only
            if not isinstance(self.target, TorchCachedLM):
                raise NotImplementedError("token trees run on the torch engine only; fix: set llm.tree = false")
            nodes, parents = proposal.tree(k)
            p = self.params.probs(tree_logits(self.target, self.seq, nodes, parents))
            committed, path = verify(drafts, q, p, self.params.greedy, self.generator, siblings)
            keep_path(self.target, nodes, path)
            fed = len(nodes) + 1
        elif self.params.greedy:  # the target's choices alone: no distribution over the vocabulary is built
            committed, path = verify_greedy(drafts, self.target.greedy(self.seq, drafts))
            fed = len(drafts) + 1
        else:
            p = self.params.probs(self.target.logits(self.seq, drafts))
            committed, path = verify(drafts, q, p, False, self.generator)
            fed = len(drafts) + 1
        accepted = len(path)
        chain_accepted = sum(1 for j in path if j < len(drafts))  # a sibling is the node after the chain's part
        sibling_hit = None  # None unless a chain token with siblings was rejected: then, was a sibling accepted
        if chain_accepted < len(siblings) and siblings[chain_accepted]:
            sibling_hit = accepted > chain_accepted
        if self.proposer is not None:
            self.policy.update(
                DraftStep(
                    drafted=len(drafts),
                    accepted=chain_accepted,
                    draft_s=proposal.seconds,
                    draft_steps=proposal.timed_steps,
                    verify_s=time.perf_counter() - start,
                    fed=fed,
                    sibling_hit=sibling_hit,
                    confidence=tuple(proposal.confidence[: len(drafts)]),
                )
            )
        return self._commit(committed, len(drafts), accepted, fed)

    def _constrained(self, allowed: list[int]) -> list[int]:
        """One target pass, its choice among the allowed tokens only; where there is only one way on, that pass
        feeds all of it instead (no choice to make: the target's logits are not needed), and all is committed."""
        assert self.constraint is not None
        if len(allowed) == 1 and len(run := self.constraint.forced(self.new_tokens)) > 1:
            self.target.logits(self.seq, run[:-1])  # the next step feeds the last one, as after any commit
            return self._commit(run, 0, 0, 1)
        row = self.target.logits(self.seq)[-1]
        return self._commit([allowed[int(row[allowed].argmax())]], 0, 0, 1)

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

    def stats(self, mode: str, start: float, prefill_tokens: int) -> DecodeStats:
        """This reply's numbers; start: time.monotonic() at the request."""
        steps = self.records[1:]  # the first record is the first token, from the prefill
        drafted = sum(r.drafted for r in steps)
        accepted = sum(r.accepted for r in steps)
        rejections = sum(1 for r in steps if r.accepted < r.drafted)
        times = [r.t for r in self.records for _ in r.committed]
        end = times[-1] if times else start
        n = len(self.new_tokens)
        first = self.first_token_t
        return DecodeStats(
            mode=mode,
            prompt_tokens=len(self.prompt),
            prefill_tokens=prefill_tokens,
            new_tokens=n,
            target_calls=self.target_calls,
            drafted=drafted,
            accepted=accepted,
            accepted_per_drafted=accepted / drafted if drafted else 0.0,
            alpha_estimate=accepted / (accepted + rejections) if accepted + rejections else 0.0,
            mean_accepted_length=(n - len(self.records[0].committed)) / len(steps) if steps else 0.0,
            tokens_per_s=n / (end - start) if end > start else 0.0,
            decode_tokens_per_s=(n - len(self.records[0].committed)) / (end - first)
            if first is not None and end > first
            else 0.0,
            ttft_s=(first - start) if first is not None else 0.0,
            total_s=end - start,
            draft_lengths=[r.drafted for r in steps],
            accepted_lengths=[r.accepted for r in steps],
            token_times=times,
        )
