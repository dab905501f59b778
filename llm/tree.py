"""Token-tree verification: the draft's chain plus its next-best alternatives as leaf siblings, in ONE target pass.

A tree is a list of nodes (tokens) and their parents: the chain first, then the siblings depth by depth; a
sibling of chain token i continues chain token i-1 (-1: the last committed token). ``tree_logits`` runs the
target over all nodes with a mask that lets each node see only its ancestors; the acceptance rule
(acceptance.py, one rule for chains and trees) picks the accepted path; ``keep_path`` leaves the cache exactly
as a chain pass over the accepted tokens would have. Off by default: on a 2-core CPU it measured no faster than
a flat chain.
"""

from __future__ import annotations

import torch

from llm.cache import TorchCachedLM, common_prefix


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


def token_tree(chain: list[int], siblings: list[list[int]], k: int) -> tuple[list[int], list[int]]:
    """The first k chain tokens and their siblings as a token tree (tokens, parents)."""
    tokens, parents = list(chain[:k]), list(range(-1, min(k, len(chain)) - 1))
    for i, alternatives in enumerate(siblings[: len(tokens)]):
        tokens += alternatives
        parents += [i - 1] * len(alternatives)
    return tokens, parents


def tree_logits(lm: TorchCachedLM, seq: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
    """Logits [len(tokens)+1, V]: row 0 after seq, row 1+j after node j of a token tree, in ONE pass.

    Node j continues parents[j] (-1: the last token of seq). Each node attends to the cache, the fed part of
    seq, its ancestors and itself, at position len(seq)-1+depth, so its logits are those a chain pass over its
    path would give. The mask is additive (0 / dtype min) in the model's dtype: transformers hands a 4D mask to
    the attention as it is, sdpa accepts a bool or an additive mask but eager attention adds it, so additive is
    the convention both read the same. Afterwards the cache holds seq and then every node while ``lm.ids``
    holds seq only: call ``keep_path`` next (any other call crops the nodes away).
    """
    if lm.static_len:
        raise NotImplementedError("token trees need a growing cache, not a static one; fix: turn one of them off")
    keep = min(common_prefix(lm.ids, seq), len(seq) - 1)
    lm.crop(keep)
    fed, n = len(seq) - keep, len(tokens)
    depth: list[int] = []
    allowed = torch.zeros(fed + n, keep + fed + n, dtype=torch.bool)
    allowed[:, :keep] = True
    allowed[:fed, keep : keep + fed] = torch.ones(fed, fed, dtype=torch.bool).tril()
    allowed[fed:, keep : keep + fed] = True
    for j, parent in enumerate(parents):
        depth.append(1 if parent < 0 else depth[parent] + 1)
        node = j
        while node >= 0:  # itself and its ancestors
            allowed[fed + j, keep + fed + node] = True
            node = parents[node]
    positions = list(range(keep, len(seq))) + [len(seq) - 1 + d for d in depth]
    dtype = next(p for p in lm.model.parameters() if p.is_floating_point()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    out = lm.forward(
        list(seq[keep:]) + list(tokens),
        n + 1,
        attention_mask=mask[None, None].to(lm.device),
        position_ids=torch.tensor([positions], device=lm.device),
    )
    lm.ids = list(seq)
    return out


def keep_path(lm: TorchCachedLM, tokens: list[int], path: list[int]) -> None:
    """After ``tree_logits``: keep seq + the nodes in path (increasing node indices), drop the other nodes, so
    the cache is exactly the one a chain pass over the accepted tokens would have left."""
    base = len(lm.ids)
    if path != list(range(len(path))):  # off the first chain: move the path's entries next to seq
        index = torch.tensor([base + j for j in path], device=lm.device)
        for layer in lm.cache.layers:  # path[i] >= i, and the right side is copied before it is written
            layer.keys[..., base : base + len(path), :] = layer.keys.index_select(-2, index)
            layer.values[..., base : base + len(path), :] = layer.values.index_select(-2, index)
    extra = lm.cache.get_seq_length() - base - len(path)
    if extra > 0:
        lm.cache.crop(-extra)
    lm.ids = lm.ids + [tokens[j] for j in path]
