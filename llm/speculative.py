"""The speculative decoding loop: propose k tokens cheaply, verify them in one target pass, keep the exact ones.

Read top to bottom: ``CachedLM`` (one model + its KV cache + the ids the cache holds), the proposers (a draft
model, an n-gram lookup), ``verify`` (the acceptance rule of Leviathan et al. / Chen et al.), ``verify_tree``
(the same rule over a token tree: the draft's chain plus its next-best alternatives as leaf siblings), the
draft-length policy, and ``Generation`` (one reply, advanced one step at a time by its caller).

Caches follow one rule, which makes rollback, cross-turn reuse and barge-in trimming the same operation: before
a forward pass, a model's cache is cropped to the longest common prefix of the ids it holds and the ids we
need, and only the rest is fed. A rejected draft token, a trimmed reply, or a re-rendered chat template all
simply fall outside that prefix.

Synchronous on purpose: the asyncio layer (engine.py) runs each ``Generation.step`` in a worker thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from llm.sampling import draw, is_greedy, probabilities, uniform


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


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CachedLM:
    """A causal LM with its own KV cache, and the token ids that cache holds (so it can be reused and cropped)."""

    def __init__(self, model: torch.nn.Module, out_ids: torch.Tensor | None = None, vocab_size: int | None = None):
        self.model = model
        self.cache = None  # a transformers DynamicCache once something was fed
        self.ids: list[int] = []
        self.out_ids = out_ids  # reduced head: logit column j is token out_ids[j]
        self.vocab_size = vocab_size
        self.fed_tokens = 0  # tokens run through the model (prefill + decode), for stats

    def crop(self, n: int) -> None:
        n = min(n, len(self.ids))
        held = self.cache.get_seq_length() if self.cache is not None else 0  # > len(ids) only after a tree pass
        if n == 0:
            self.cache = None
        elif n < held:
            self.cache.crop(n - held)  # a negative count: how many tokens to remove
        self.ids = self.ids[:n]

    def keep_prefix_of(self, seq: list[int]) -> int:
        """Crop to the common prefix with seq; return how many tokens of seq the cache still holds."""
        self.crop(common_prefix(self.ids, seq))
        return len(self.ids)

    @torch.no_grad()
    def logits(self, seq: list[int], extra: list[int] = ()) -> torch.Tensor:
        """Logits [len(extra)+1, V] (float32) for the next token after seq, and after each of seq+extra[:i+1]."""
        keep = min(common_prefix(self.ids, seq), len(seq) - 1)  # feed at least the last token of seq
        self.crop(keep)
        feed = list(seq[keep:]) + list(extra)
        n_out = len(extra) + 1
        try:
            out = self.model(input_ids=torch.tensor([feed]), cache=self.cache, use_cache=True, logits_to_keep=n_out)
        except BaseException:
            # a pass that failed half-way may have grown some layers of the cache: forget it all
            self.cache, self.ids = None, []
            raise
        self.cache = out.cache
        self.ids = list(seq) + list(extra)
        self.fed_tokens += len(feed)
        return out.logits[0, -n_out:].float()

    @torch.no_grad()
    def tree_logits(self, seq: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Logits [len(tokens)+1, V]: row 0 after seq, row 1+j after node j of a token tree, in ONE pass.

        Node j continues parents[j] (-1: the last token of seq). Each node attends to the cache, the fed part
        of seq, its ancestors and itself, at position len(seq)-1+depth, so its logits are those a chain pass
        over its path would give. The mask is additive (0 / dtype min) in the model's dtype: transformers hands
        a 4D mask to the attention as it is, sdpa accepts a bool or an additive mask but eager attention adds
        it, so additive is the convention both read the same. Afterwards the cache holds seq and then every
        node while ``ids`` holds seq only: call ``keep_path`` next (any other call crops the nodes away).
        """
        keep = min(common_prefix(self.ids, seq), len(seq) - 1)
        self.crop(keep)
        fed, n = len(seq) - keep, len(tokens)
        depth: list[int] = []
        allowed = torch.zeros(fed + n, keep + fed + n, dtype=torch.bool)
        allowed[:, :keep] = True
        allowed[:fed, keep:keep + fed] = torch.ones(fed, fed, dtype=torch.bool).tril()
        allowed[fed:, keep:keep + fed] = True
        for j, parent in enumerate(parents):
            depth.append(1 if parent < 0 else depth[parent] + 1)
            node = j
            while node >= 0:  # itself and its ancestors
                allowed[fed + j, keep + fed + node] = True
                node = parents[node]
        positions = list(range(keep, len(seq))) + [len(seq) - 1 + d for d in depth]
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        try:
            out = self.model(input_ids=torch.tensor([list(seq[keep:]) + list(tokens)]), attention_mask=mask[None, None],
                             position_ids=torch.tensor([positions]), cache=self.cache, use_cache=True,
                             logits_to_keep=n + 1)
        except BaseException:
            self.cache, self.ids = None, []
            raise
        self.cache = out.cache
        self.ids = list(seq)
        self.fed_tokens += fed + n
        return out.logits[0, -(n + 1):].float()

    def keep_path(self, tokens: list[int], path: list[int]) -> None:
        """After ``tree_logits``: keep seq + the nodes in path (increasing node indices), drop the other nodes,
        so the cache is exactly the one a chain pass over the accepted tokens would have left."""
        base = len(self.ids)
        if path != list(range(len(path))):  # off the first chain: move the path's entries next to seq
            index = torch.tensor([base + j for j in path])
            for layer in self.cache.layers:  # path[i] >= i, and the right side is copied before it is written
                layer.keys[..., base:base + len(path), :] = layer.keys.index_select(-2, index)
                layer.values[..., base:base + len(path), :] = layer.values.index_select(-2, index)
        extra = self.cache.get_seq_length() - base - len(path)
        if extra > 0:
            self.cache.crop(-extra)
        self.ids = self.ids + [tokens[j] for j in path]

    def full_vocab(self, values: torch.Tensor) -> torch.Tensor:
        """Spread values over a reduced head back onto the full vocabulary (zeros elsewhere)."""
        if self.out_ids is None:
            return values
        full = torch.zeros(*values.shape[:-1], self.vocab_size, dtype=values.dtype)
        return full.index_copy_(-1, self.out_ids, values)


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V]: the exact distribution each token was drawn from; None = one-hot
    seconds: float = 0.0  # time of the draft steps below (a catch-up prefill is not a draft step: left out)
    timed_steps: int = 0
    siblings: list[list[int]] = field(default_factory=list)  # tree: siblings[i] = alternatives to tokens[i]

    def tree(self, k: int) -> tuple[list[int], list[int]]:
        """The first k tokens and their siblings as a token tree (tokens, parents): the chain first, then the
        siblings depth by depth; a sibling of tokens[i] continues tokens[i-1] (-1: the last committed token)."""
        tokens, parents = list(self.tokens[:k]), list(range(-1, min(k, len(self.tokens)) - 1))
        for i, alternatives in enumerate(self.siblings[:len(tokens)]):
            tokens += alternatives
            parents += [i - 1] * len(alternatives)
        return tokens, parents


class Proposer(Protocol):
    def propose(self, seq: list[int], k: int, params: SamplingParams, generator: torch.Generator | None,
                stop_ids: set[int]) -> Proposal: ...


def tree_shape(k: int, width: int, max_nodes: int) -> list[int]:
    """How many siblings each of k chain tokens gets: width-1 each, nearest depths first, while the tree stays
    within max_nodes (the flat part of the verify-cost curve). The near depths come first because they are
    reached most often (depth i is reached with probability alpha^(i-1))."""
    room = max(0, max_nodes - k)
    shape = []
    for _ in range(k):
        shape.append(min(width - 1, room))
        room -= shape[-1]
    return shape


class DraftModelProposer:
    """k tokens from a small model, each drawn from the draft's processed distribution (q is recorded exactly).

    With width > 1 (token trees), each step also records the draft's next-best width-1 tokens at that position
    as siblings of the drawn one: they come from logits the step computed anyway, so they cost no draft pass.
    They are leaves: growing them further would cost a draft pass each, at 0.14 of a target pass (int8 0.5B).
    """


    def __init__(self, lm: CachedLM, width: int = 1, max_nodes: int = 8):
        self.lm, self.width, self.max_nodes = lm, width, max_nodes

    def propose(self, seq, k, params, generator, stop_ids):
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        siblings: list[list[int]] = []
        shape = tree_shape(k, self.width, self.max_nodes)
        seconds, timed = 0.0, 0
        for step in range(k):
            start, fed = time.perf_counter(), self.lm.fed_tokens
            logits = self.lm.logits(seq + tokens)[-1]
            if self.lm.fed_tokens - fed <= 2:  # a draft step (one token, or two after a fully accepted step)
                seconds += time.perf_counter() - start
                timed += 1
            if params.greedy:
                ranked = torch.topk(logits, shape[step] + 1).indices  # [0] is the argmax
                ranked = (self.lm.out_ids[ranked] if self.lm.out_ids is not None else ranked).tolist()
                token = ranked[0]
            else:
                q = self.lm.full_vocab(params.probs(logits))
                token = draw(q, generator)
                qs.append(q)
                ranked = torch.topk(q, shape[step] + 1).indices.tolist()
            siblings.append([t for t in ranked if t != token][:shape[step]])  # one list per chain token
            tokens.append(token)
            if token in stop_ids:
                break
        q = torch.stack(qs) if qs else None  # greedy: one-hot, which verify knows without a tensor
        return Proposal(tokens, q, seconds, timed, siblings)


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = max_n..1), propose what followed.

    Deterministic (q is one-hot), free to run, and good at repeating names and phrases from the prompt.
    """


    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

    def propose(self, seq, k, params, generator, stop_ids):
        start = time.perf_counter()
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(seq) <= n:
                continue
            tail = seq[-n:]
            for i in range(len(seq) - n - 1, -1, -1):
                if seq[i:i + n] == tail:
                    follow = seq[i + n:i + n + k]
                    tokens = []
                    for t in follow:
                        tokens.append(t)
                        if t in stop_ids:
                            break
                    return Proposal(tokens, None, time.perf_counter() - start, k)
        return Proposal([], None, time.perf_counter() - start, k)  # one lookup stands for k (free) draft steps


def verify(drafts: list[int], q: torch.Tensor | None, p: torch.Tensor, greedy: bool,
           generator: torch.Generator | None) -> tuple[list[int], int]:
    """The acceptance rule. p: [len(drafts)+1, V] target distributions; q as in Proposal.

    Returns (tokens to commit, number of drafts accepted). The committed tokens are the accepted drafts and
    then either the correction at the first rejection, or a bonus token from the last distribution.
    """
    out: list[int] = []
    for i, d in enumerate(drafts):
        if greedy:
            ok = d == int(p[i].argmax())
        else:
            qd = 1.0 if q is None else float(q[i, d])
            ok = uniform(generator) < min(1.0, float(p[i, d]) / qd)
        if ok:
            out.append(d)
            continue
        if greedy:
            out.append(int(p[i].argmax()))
        else:
            drafted = torch.zeros_like(p[i]).index_fill_(0, torch.tensor([d]), 1.0) if q is None else q[i]
            residual = torch.clamp(p[i] - drafted, min=0.0)
            total = residual.sum()
            # total is 0 only if p == q up to rounding, where rejection had probability ~0: fall back to p
            out.append(draw(residual / total if total > 0 else p[i], generator))
        return out, i
    out.append(draw(p[len(drafts)], generator))
    return out, len(drafts)


def verify_tree(drafts: list[int], q: torch.Tensor | None, siblings: list[list[int]], p: torch.Tensor,
                greedy: bool, generator: torch.Generator | None) -> tuple[list[int], list[int]]:
    """The acceptance rule over a token tree (``Proposal.tree`` order). p: [1 + nodes, V], row 0 after the last
    committed token, row 1+j after node j.

    Returns (tokens to commit, node indices of the accepted path). Walk down the chain; at each depth first the
    chain token (drawn from q: accepted with min(1, p/q), as in ``verify``), then, if it was rejected, its
    siblings in turn. The siblings are deterministic candidates, so each is tried against the current residual
    r (p with the rejected chain token's q taken out): accept c with probability r(c), else zero r(c) and
    renormalise. Any procedure that draws exactly from r is right after a rejection, and this one does: c is
    output with probability r(c), any other x with (1 - r(c)) * r(x) / (1 - r(c)) = r(x). Greedy: accept the
    node that equals the target's argmax. An accepted sibling is a leaf: its bonus token comes from its row.
    """
    out: list[int] = []
    row, first_sibling = 0, len(drafts)
    for i, d in enumerate(drafts):
        pi = p[row]
        if greedy:
            ok = d == int(pi.argmax())
        else:
            qd = 1.0 if q is None else float(q[i, d])
            ok = uniform(generator) < min(1.0, float(pi[d]) / qd)
        if ok:
            out.append(d)
            row = i + 1
            continue
        path = list(range(i))
        if greedy:
            best = int(pi.argmax())
            for j, c in enumerate(siblings[i] if i < len(siblings) else []):
                if c == best:
                    node = first_sibling + sum(map(len, siblings[:i])) + j
                    return out + [c, int(p[node + 1].argmax())], path + [node]
            return out + [best], path
        drafted = torch.zeros_like(pi).index_fill_(0, torch.tensor([d]), 1.0) if q is None else q[i]
        residual = torch.clamp(pi - drafted, min=0.0)
        residual = residual / residual.sum() if residual.sum() > 0 else pi.clone()  # 0 only if p == q: see verify
        for j, c in enumerate(siblings[i] if i < len(siblings) else []):
            if uniform(generator) < float(residual[c]):
                node = first_sibling + sum(map(len, siblings[:i])) + j
                return out + [c, draw(p[node + 1], generator)], path + [node]
            residual[c] = 0.0
            total = residual.sum()
            if total <= 0:  # r was (up to rounding) all on c, which was then accepted with probability ~1
                residual, total = pi.clone(), pi.sum()
            residual = residual / total
        return out + [draw(residual, generator)], path
    return out + [draw(p[row], generator)], list(range(len(drafts)))


class DraftLengthPolicy:
    """How many tokens to draft next: fixed, or chosen from measured costs and live acceptance.

    Adaptive rule: with alpha the per-token acceptance estimate, t_d the time of one draft step and t_v(m) the
    time of a target pass over m tokens, drafting k gives E(k) = 1 + alpha + ... + alpha^k tokens per target
    pass at a cost of k * t_d + t_v(k+1). Pick the k in 0..max_k with the highest E(k) / cost(k). alpha is
    accepted / (accepted + rejections) over a decaying window (the maximum-likelihood estimate for a
    geometric run length); t_d and t_v(m) are moving averages of measured times (an unmeasured m takes the
    nearest measured one: the verify-cost curve is flat on a CPU in bf16). Every 16th step tries a neighbour
    of the best k, so the curve stays measured. Costs are per device, so one policy serves a whole Engine.

    Token trees (width > 1): k is the chain depth, the pass verifies k + siblings nodes (``tree_shape``) at the
    cost t_v(nodes + 1), and a depth i < k with siblings adds alpha^i * (1 - alpha) * beta tokens, beta being
    the live rate at which a sibling was accepted where its chain token was rejected (decayed like alpha).
    """

    def __init__(self, fixed: int | None = None, max_k: int = 6, prior_alpha: float = 0.7, prior_c: float = 0.4,
                 decay: float = 0.95, width: int = 1, max_nodes: int = 8, prior_beta: float = 0.3):
        self.fixed, self.max_k, self.decay = fixed, max_k, decay
        self.width, self.max_nodes = width, max_nodes
        self.accepted, self.rejected = prior_alpha * 4, (1 - prior_alpha) * 4  # a weak prior: 4 pseudo-tokens
        self.sibling_hits, self.sibling_tries = prior_beta * 4, 4.0
        self.draft_s: float | None = None
        self.verify_s: dict[int, float] = {}
        self.prior_c = prior_c
        self.steps = 0

    @property
    def alpha(self) -> float:
        return self.accepted / max(self.accepted + self.rejected, 1e-9)

    def _verify_cost(self, m: int) -> float:
        if not self.verify_s:
            return 1.0
        nearest = min(self.verify_s, key=lambda known: (abs(known - m), known))
        return self.verify_s[nearest]

    @property
    def beta(self) -> float:
        return self.sibling_hits / max(self.sibling_tries, 1e-9)

    def expected_rate(self, k: int) -> float:
        a = min(self.alpha, 0.999)
        shape = tree_shape(k, self.width, self.max_nodes)
        tokens = (1 - a ** (k + 1)) / (1 - a) + sum(a ** i * (1 - a) * self.beta for i, n in enumerate(shape) if n)
        draft_cost = self.draft_s if self.draft_s is not None else self.prior_c * self._verify_cost(1)
        return tokens / (k * draft_cost + self._verify_cost(k + sum(shape) + 1))

    def choose(self, remaining: int) -> int:
        limit = max(0, min(self.max_k, remaining - 1))
        if self.fixed is not None:
            return min(self.fixed, limit)
        best = max(range(limit + 1), key=self.expected_rate)
        self.steps += 1
        if self.steps % 16 == 0 and limit > 0:
            best = min(limit, best + 1) if (self.steps // 16) % 2 else max(1, best - 1)
        return best

    def update(self, drafted: int, accepted: int, draft_s: float, draft_steps: int, verify_s: float, fed: int,
               sibling_hit: bool | None = None) -> None:
        """drafted / accepted: chain tokens; sibling_hit: None unless a chain token with siblings was rejected."""
        if drafted > 0:
            self.accepted = self.accepted * self.decay + accepted
            self.rejected = self.rejected * self.decay + (1 if accepted < drafted else 0)
        if sibling_hit is not None:
            self.sibling_hits = self.sibling_hits * self.decay + sibling_hit
            self.sibling_tries = self.sibling_tries * self.decay + 1
        if draft_steps > 0:
            per_step = draft_s / draft_steps
            self.draft_s = per_step if self.draft_s is None else 0.8 * self.draft_s + 0.2 * per_step
        old = self.verify_s.get(fed)
        self.verify_s[fed] = verify_s if old is None else 0.8 * old + 0.2 * verify_s


@dataclass
class StepRecord:
    drafted: int  # chain tokens (a tree's depth)
    accepted: int  # tokens of the accepted path (through a sibling too): the committed tokens minus the last
    committed: list[int]
    t: float  # time.monotonic() when the step's tokens were verified
    nodes: int = 0  # tokens the target verified: drafted, plus a tree's siblings


@dataclass
class Generation:
    """One reply: the first step is the target's prefill (first token), each later step is draft + verify.

    ``step()`` returns the tokens committed by that step ([] once finished). Not thread-safe: the caller
    serialises steps (engine.py holds a lock around them).
    """

    target: CachedLM
    proposer: Proposer | None
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    stop_ids: set[int]
    policy: DraftLengthPolicy
    generator: torch.Generator | None = None
    seq: list[int] = field(init=False)
    new_tokens: list[int] = field(default_factory=list)
    done: bool = False
    records: list[StepRecord] = field(default_factory=list)
    target_calls: int = 0
    first_token_t: float | None = None

    def __post_init__(self):
        self.seq = list(self.prompt)
        if self.max_new_tokens <= 0:
            self.done = True

    def step(self) -> list[int]:
        if self.done:
            return []
        remaining = self.max_new_tokens - len(self.new_tokens)
        fed = 1
        if not self.new_tokens:  # first token: the target's prefill alone, the draft catches up later
            p = self.params.probs(self.target.logits(self.seq))
            drafts, committed, accepted = [], [draw(p[-1], self.generator)], 0
        else:
            k = self.policy.choose(remaining) if self.proposer is not None else 0
            proposal = self.proposer.propose(self.seq, k, self.params, self.generator, self.stop_ids) \
                if k > 0 else Proposal([], None)
            drafts = proposal.tokens[:k]
            siblings = proposal.siblings[:len(drafts)]
            start = time.perf_counter()
            sibling_hit = None
            if any(siblings):  # a token tree: one pass over all nodes, then keep the accepted path's cache only
                nodes, parents = proposal.tree(k)
                p = self.params.probs(self.target.tree_logits(self.seq, nodes, parents))
                committed, path = verify_tree(drafts, proposal.q, siblings, p, self.params.greedy, self.generator)
                self.target.keep_path(nodes, path)
                accepted = len(path)
                chain = sum(1 for j in path if j < len(drafts))
                if chain < len(siblings) and siblings[chain]:
                    sibling_hit = accepted > chain
                fed, chain_accepted = len(nodes) + 1, chain
            else:
                p = self.params.probs(self.target.logits(self.seq, drafts))
                committed, accepted = verify(drafts, proposal.q, p, self.params.greedy, self.generator)
                fed, chain_accepted = len(drafts) + 1, accepted
            if self.proposer is not None:
                self.policy.update(len(drafts), chain_accepted, proposal.seconds, proposal.timed_steps,
                                   time.perf_counter() - start, fed, sibling_hit)
        self.target_calls += 1
        committed = committed[:remaining]
        for i, token in enumerate(committed):
            if token in self.stop_ids:
                committed = committed[:i + 1]
                self.done = True
                break
        self.seq.extend(committed)
        self.new_tokens.extend(committed)
        if len(self.new_tokens) >= self.max_new_tokens:
            self.done = True
        now = time.monotonic()
        if self.first_token_t is None:
            self.first_token_t = now
        self.records.append(StepRecord(len(drafts), min(accepted, len(committed)), committed, now, fed - 1))
        return committed
