"""The acceptance rule of speculative decoding (Leviathan et al. / Chen et al.), written once.

A chain of drafted tokens is a token tree without siblings, so one rule serves both: walk down the drafted
chain; at depth i accept the drafted token d with probability min(1, p(d) / q(d)) (p: the target's distribution
there, q: the draft's); at the first rejection try that depth's siblings, if any, against the residual
norm(max(0, p - q)), and otherwise draw the correction from it; after a fully accepted chain (or an accepted
sibling, which is a leaf) draw the bonus token from the next row of p.

Greedy decoding (temperature 0) is the same rule with p one-hot on the target's choice: a token is accepted iff
it is that choice, and the residual is that choice again. ``verify_greedy`` is that form written directly on the
choices, so the greedy chain path never builds a distribution over the vocabulary.

Rows of p (and of the choices): row 0 follows the last committed token, row 1 + j follows node j, the nodes being
the chain first, then the siblings depth by depth (``llm.tree.token_tree``). For a chain that is simply row i
after the first i drafted tokens. Both functions return (tokens to commit, node indices of the accepted path);
the path's length is the number of drafted tokens accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llm.sampling import draw, uniform

Siblings = Sequence[Sequence[int]]  # siblings[i]: the alternatives to drafted token i ([] or missing: none)


def _sibling_node(drafts: list[int], siblings: Siblings, depth: int, j: int) -> int:
    """The node index of sibling j at this depth: after the chain and the siblings of shallower depths."""
    return len(drafts) + sum(len(s) for s in siblings[:depth]) + j


def _alternatives(siblings: Siblings, depth: int) -> Sequence[int]:
    return siblings[depth] if depth < len(siblings) else []


def verify_greedy(drafts: list[int], choices: list[int], siblings: Siblings = ()) -> tuple[list[int], list[int]]:
    """The rule at temperature 0. choices[r]: the target's argmax at row r (one more than the chain's rows, plus
    one per sibling). A drafted token is kept while it is the choice; at the first mismatch a sibling equal to
    the choice is taken with the bonus after it, else the choice itself is the correction."""
    for i, d in enumerate(drafts):
        if d == choices[i]:
            continue
        path = list(range(i))
        for j, c in enumerate(_alternatives(siblings, i)):
            if c == choices[i]:
                node = _sibling_node(drafts, siblings, i, j)
                return drafts[:i] + [c, choices[node + 1]], path + [node]
        return drafts[:i] + [choices[i]], path
    return drafts + [choices[len(drafts)]], list(range(len(drafts)))


def verify(
    drafts: list[int],
    q: torch.Tensor | None,
    p: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None,
    siblings: Siblings = (),
) -> tuple[list[int], list[int]]:
    """The rule. p: [rows, V] target distributions; q: [len(drafts), V], the exact distribution each drafted
    token was drawn from (None: one-hot, a deterministic proposer).

    After a rejection any procedure that draws exactly from the residual r is right, and trying the siblings
    in turn is one: sibling c is accepted with probability r(c), else r(c) is zeroed and r renormalised, so c
    comes out with probability r(c) and any other x with (1 - r(c)) * r(x) / (1 - r(c)) = r(x). Without
    siblings this is the plain draw from r.
    """
    if greedy:
        return verify_greedy(drafts, [int(i) for i in p.argmax(-1).tolist()], siblings)
    for i, d in enumerate(drafts):
        qd = 1.0 if q is None else float(q[i, d])
        if uniform(generator) < min(1.0, float(p[i, d]) / qd):
            continue
        drafted = torch.zeros_like(p[i]).index_fill_(0, torch.tensor([d]), 1.0) if q is None else q[i]
        residual = torch.clamp(p[i] - drafted, min=0.0)
        total = residual.sum()
        # total is 0 only if p == q up to rounding, where rejection had probability ~0: fall back to p
        residual = residual / total if total > 0 else p[i].clone()
        for j, c in enumerate(_alternatives(siblings, i)):
            if uniform(generator) < float(residual[c]):
                node = _sibling_node(drafts, siblings, i, j)
                return drafts[:i] + [c, draw(p[node + 1], generator)], list(range(i)) + [node]
            residual[c] = 0.0
            total = residual.sum()
            if total <= 0:  # r was (up to rounding) all on c, which was then accepted with probability ~1
                residual, total = p[i].clone(), p[i].sum()
            residual = residual / total
        return drafts[:i] + [draw(residual, generator)], list(range(i))
    return drafts + [draw(p[len(drafts)], generator)], list(range(len(drafts)))
