"""One causal LM with its KV cache and the token ids that cache holds.

Caches follow one rule, which makes rollback, cross-turn reuse and barge-in trimming the same operation: before
a forward pass, a model's cache is cropped to the longest common prefix of the ids it holds and the ids we
need, and only the rest is fed. A rejected draft token, a trimmed reply, or a re-rendered chat template all
simply fall outside that prefix.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def head_rows(model: Any) -> int:
    """Rows of the model's output head (its logits' width), whatever form the head has (Linear, quantized)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or head.weight.shape[0])


class CachedLM(ABC):
    """A causal LM with its own KV cache, and the token ids that cache holds (so it can be reused and cropped).

    The common-prefix rule lives here, once; a backend supplies two operations: ``crop(n)`` (keep the first n
    cached positions) and ``forward(feed, n_out)`` (one pass over ``feed`` on top of the cache, returning the
    last n_out rows of logits). ``TorchCachedLM`` runs a transformers model, ``llm.llamacpp.LlamaCppLM`` a
    GGUF through llama.cpp.

    ``out_ids`` maps the logit columns to token ids when they are not simply 0..V-1: a reduced-vocabulary head
    (column j is token out_ids[j]), or a head with a different padding than the target's. ``vocab_size`` is
    then the width that ``full_vocab`` spreads values onto (the target's head rows). ``real_vocab``: logit
    columns from there on are padding rows, not tokens, and are masked (-inf), so they are never produced
    (a draft could not take them as input, and no tokenizer can decode them).
    """

    static_len = 0  # > 0 only for a preallocated torch cache (token trees need a growing one)

    def __init__(
        self, out_ids: torch.Tensor | None = None, vocab_size: int | None = None, real_vocab: int | None = None
    ):
        self.ids: list[int] = []
        self.out_ids = out_ids
        self.vocab_size = vocab_size
        self.real_vocab = real_vocab
        self.fed_tokens = 0  # tokens run through the model (prefill + decode), for stats

    @abstractmethod
    def crop(self, n: int) -> None:
        """Keep the first n cached positions (and ids); drop the rest."""

    @abstractmethod
    def forward(self, feed: list[int], n_out: int) -> torch.Tensor:
        """One pass over ``feed`` after the cached ids; the logits of its last n_out positions [n_out, V]."""

    def close(self) -> None:  # noqa: B027 - optional: only a cache holding memory outside Python overrides it
        """Let go of what the cache holds outside Python (llama.cpp's context); torch's goes with the object."""

    def keep_prefix_of(self, seq: list[int]) -> int:
        """Crop to the common prefix with seq; return how many tokens of seq the cache still holds."""
        self.crop(common_prefix(self.ids, seq))
        return len(self.ids)

    def logits(self, seq: list[int], extra: Sequence[int] = ()) -> torch.Tensor:
        """Logits [len(extra)+1, V] (float32, on the CPU) for the next token after seq, and after each of
        seq + extra[:i+1]."""
        keep = min(common_prefix(self.ids, seq), len(seq) - 1)  # feed at least the last token of seq
        self.crop(keep)
        out = self.forward(list(seq[keep:]) + list(extra), len(extra) + 1)
        self.ids = list(seq) + list(extra)
        return out

    def greedy(self, seq: list[int], extra: Sequence[int] = ()) -> list[int]:
        """The model's greedy choice after seq and after each of seq + extra[:i+1]: ``logits`` argmaxed (by
        numpy, ~10x faster than torch's argmax over one CPU row of 150k logits)."""
        return [int(i) for i in self.logits(seq, extra).numpy().argmax(-1)]

    def prefill(self, seq: list[int], upto: int) -> int:
        """Make the cache hold seq[:upto] (no logits wanted); return how many tokens were fed. Nothing is cropped
        when the cache already holds seq[:upto] (even with more after it): a later pass crops what differs."""
        upto = min(upto, len(seq))
        keep = common_prefix(self.ids, seq[:upto])
        if keep == upto:
            return 0
        self.crop(keep)
        self.forward(list(seq[keep:upto]), 0)
        self.ids = list(seq[:upto])
        return upto - keep

    def mask_padding(self, logits: torch.Tensor) -> torch.Tensor:
        if self.real_vocab is not None:
            logits[:, self.real_vocab :] = float("-inf")
        return logits

    def full_vocab(self, values: torch.Tensor) -> torch.Tensor:
        """Spread values over the logit columns back onto the full vocabulary (zeros elsewhere)."""
        if self.out_ids is None:
            return values
        assert self.vocab_size is not None
        full = torch.zeros(*values.shape[:-1], self.vocab_size, dtype=values.dtype)
        return full.index_copy_(-1, self.out_ids, values)

    def token_of(self, column: int) -> int:
        """The token id of a logit column."""
        return int(self.out_ids[column]) if self.out_ids is not None else column


class TorchCachedLM(CachedLM):
    """A transformers causal LM with its KV cache (a DynamicCache, or a preallocated StaticCache)."""

    def __init__(
        self,
        model: Any,
        out_ids: torch.Tensor | None = None,
        vocab_size: int | None = None,
        real_vocab: int | None = None,
        static_len: int = 0,
        step_forward: Callable[..., Any] | None = None,
        step_tokens: int = 2,
    ):
        """static_len > 0: a preallocated cache of that many positions (fixed shapes, which torch.compile and
        CUDA graphs need; cropping it only moves its length back). step_forward: a compiled forward used for
        decode steps (up to step_tokens fed tokens, a plain causal mask); everything else (prefill, trees) runs
        the model as it is."""
        super().__init__(out_ids, vocab_size, real_vocab)
        self.model = model
        self.static_len, self.step_tokens = static_len, step_tokens
        self.step_forward: Callable[..., Any] | None = step_forward
        self.cache: Any = None  # a transformers DynamicCache (or StaticCache) once something was fed

    def crop(self, n: int) -> None:
        n = min(n, len(self.ids))
        held = self.cache.get_seq_length() if self.cache is not None else 0  # > len(ids) only after a tree pass
        if n == 0 and not self.static_len:
            self.cache = None
        elif n < held:
            self.cache.crop(n - held)  # a negative count: how many tokens to remove
        self.ids = self.ids[:n]

    def forward(self, feed: list[int], n_out: int, **kwargs: Any) -> torch.Tensor:
        """One pass over ``feed`` on top of the cache; the last n_out rows of logits (float32; n_out 0: a
        prefill, which still computes one row). A pass that fails half-way may have grown some layers of the
        cache: then the whole cache is forgotten."""
        if self.static_len and self.cache is None:
            from transformers import StaticCache

            self.cache = StaticCache(config=self.model.config, max_cache_len=self.static_len)
        run: Callable[..., Any] = self.model
        if self.step_forward is not None and len(feed) <= self.step_tokens and not kwargs:
            run = self.step_forward
        n_out = max(n_out, 1)
        try:
            with torch.no_grad():
                out = run(
                    input_ids=torch.tensor([feed], device=self.device),
                    cache=self.cache,
                    use_cache=True,
                    logits_to_keep=n_out,
                    **kwargs,
                )
        except BaseException:
            self.cache, self.ids = None, []
            raise
        self.cache = out.cache
        self.fed_tokens += len(feed)
        # decisions and sampling run on the CPU, on any device
        return self.mask_padding(out.logits[0, -n_out:].float().cpu())

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device
