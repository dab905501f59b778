"""Where draft tokens come from: a small model, or an n-gram lookup in the conversation so far.

A proposer returns a ``Proposal``: the tokens, the exact distribution each was drawn from (None when it is
one-hot, as for any deterministic proposer), and the draft's confidence in each token, which the draft-length
policy reads to stop drafting early on hard stretches and go long on easy ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from llm.cache import CachedLM
from llm.sampling import SamplingParams, draw
from llm.settings import DecodeSettings
from llm.tree import token_tree, tree_shape

# called after each drafted token with the draft's confidences so far; False stops drafting
KeepDrafting = Callable[[list[float]], bool]


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V]: the exact distribution each token was drawn from; None = one-hot
    seconds: float = 0.0  # time of the draft steps below (a catch-up prefill is not a draft step: left out)
    timed_steps: int = 0
    siblings: list[list[int]] = field(default_factory=list)  # tree: siblings[i] = alternatives to tokens[i]
    confidence: list[float] = field(default_factory=list)  # the draft's top probability at each token

    def tree(self, k: int) -> tuple[list[int], list[int]]:
        return token_tree(self.tokens, self.siblings, k)


class Proposer(Protocol):
    """What the decoding loop asks of a source of draft tokens; every proposer has all of it.

    ``propose``: up to k tokens after seq, calling ``keep_drafting`` after each with the confidences so far
    (the policy's confidence stop; a proposer with no confidence to report may ignore it). ``catch_up``: feed
    one chunk of what the proposer has not seen yet (a new turn), True while there was some; a proposer that
    keeps no state of its own has nothing to feed and returns False.
    """

    def propose(
        self,
        seq: list[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        stop_ids: set[int],
        keep_drafting: KeepDrafting,
    ) -> Proposal: ...

    def catch_up(self, seq: list[int], chunk: int) -> bool: ...


class DraftModelProposer:
    """Up to k tokens from a small model, each drawn from the draft's processed distribution (q recorded exactly).

    With width > 1 (token trees), each step also records the draft's next-best width-1 tokens at that position
    as siblings of the drawn one: they come from logits the step computed anyway, so they cost no draft pass.
    ``catch_up`` feeds the draft what it has not seen yet (a new turn) in chunks, so that work can be
    interrupted between chunks like the target's prefill.
    """

    def __init__(self, lm: CachedLM, width: int = 1, max_nodes: int = DecodeSettings.tree_nodes):
        self.lm, self.width, self.max_nodes = lm, width, max_nodes

    def catch_up(self, seq: list[int], chunk: int) -> bool:
        """Feed one chunk of what the draft's cache lacks of seq[:-1]; False when nothing was left to feed."""
        held = self.lm.keep_prefix_of(seq)
        if len(seq) - 1 - held <= chunk:
            return False
        self.lm.prefill(seq, held + chunk)
        return True

    def propose(
        self,
        seq: list[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        stop_ids: set[int],
        keep_drafting: KeepDrafting,
    ) -> Proposal:
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        siblings: list[list[int]] = []
        confidence: list[float] = []
        shape = tree_shape(k, self.width, self.max_nodes)
        seconds, timed = 0.0, 0
        for step in range(k):
            start, fed = time.perf_counter(), self.lm.fed_tokens
            logits = self.lm.logits(seq + tokens)[-1]
            if params.greedy:
                top = torch.topk(logits, shape[step] + 1)
                ranked = [self.lm.token_of(int(c)) for c in top.indices]  # [0] is the argmax
                token = ranked[0]
                confidence.append(float(torch.softmax(logits, -1)[top.indices[0]]))
            else:
                q = self.lm.full_vocab(params.probs(logits))
                token = draw(q, generator)
                qs.append(q)
                ranked = torch.topk(q, shape[step] + 1).indices.tolist()
                confidence.append(float(q[ranked[0]]))
            if self.lm.fed_tokens - fed <= 2:  # a draft step (one token, or two after a fully accepted step)
                seconds += time.perf_counter() - start
                timed += 1
            siblings.append([t for t in ranked if t != token][: shape[step]])  # one list per chain token
            tokens.append(token)
            if token in stop_ids or not keep_drafting(confidence):
                break
        q_all = torch.stack(qs) if qs else None  # greedy: one-hot, which verify knows without a tensor
        return Proposal(tokens, q_all, seconds, timed, siblings, confidence)


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = max_n..1), propose what followed.

    Deterministic (q is one-hot), free to run, and good at repeating names and phrases from the conversation
    (it searches the whole sequence: every kept turn, the system prompt, and the reply so far).
    """

    def __init__(self, max_n: int = DecodeSettings.ngram_max, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

    def catch_up(self, seq: list[int], chunk: int) -> bool:
        return False  # it reads seq afresh at every proposal: nothing to feed

    def propose(
        self,
        seq: list[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        stop_ids: set[int],
        keep_drafting: KeepDrafting,
    ) -> Proposal:
        start = time.perf_counter()
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(seq) <= n:
                continue
            tail = seq[-n:]
            for i in range(len(seq) - n - 1, -1, -1):
                if seq[i : i + n] == tail:
                    tokens = []
                    for t in seq[i + n : i + n + k]:
                        tokens.append(t)
                        if t in stop_ids:
                            break
                    return Proposal(tokens, None, time.perf_counter() - start, k)
        return Proposal([], None, time.perf_counter() - start, k)  # one lookup stands for k (free) draft steps
