"""The llama.cpp backend: our speculative loop on llama.cpp's CPU kernels, through llama-cpp-python's C API.

Why the C API and not llama-cpp-python's ``Llama`` class: the loop needs what a generation loop hides, namely
logits for exactly the positions it drafted (and no others), the KV cache cut back to a common prefix
(rollback, cross-turn reuse, trim-to-heard), and prefill in chunks the caller can stop between. Everything
else (the acceptance rule, sampling, the policy, cancellation, history trims) is the same code as on torch.

- ``GgufModel``: one GGUF's weights, loaded once into RAM (not a live mmap: a memory-mapped model drifts slower
  as the VM pages it out) and shared by every cache that runs it.
- ``LlamaCppLM``: one KV cache (a llama_context of one sequence) over a ``GgufModel``; the ``CachedLM`` rules.
  A conversation holds one per model, plus a shadow pair while a history trim is prepared.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm.cache import CachedLM, common_prefix
from llm.cpu_share import CpuShare
from llm.huge_pages import HugePages, anonymous_mappings, collapse_new

log = logging.getLogger("specvoice.llm")

GGUF_MAGIC = b"GGUF"
SPARE_CONTEXTS = 2  # emptied contexts a model keeps for the next cache (a benchmark's fresh caches, a new chat)
# ggml's levels, one step quieter: its warnings are about the model file ("control-looking token ..."), not about
# anything a user can act on, and a failed load raises our own error naming the fix; debug and info are DEBUG
_LOG_LEVELS = {3: logging.INFO, 4: logging.WARNING}
_CONTINUED = 5  # ggml's "continues the previous line" level


class LlamaCppError(RuntimeError):
    """llama.cpp could not be used: not installed, a model it cannot load, a pass it refused."""


def _llama_cpp() -> Any:
    """The llama_cpp module, its log routed into ours (quiet unless debugging), its backend started once."""
    global _lib
    if _lib is not None:
        return _lib
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:  # OSError: the package is there but its shared library is not
        raise LlamaCppError(
            f"llm.engine = 'llama.cpp' needs llama-cpp-python, which is not installed or did not build ({exc}); "
            "fix: `make install` (it compiles llama.cpp with cmake and a C++ compiler, installing them if missing), "
            "or set llm.engine = 'torch'"
        ) from None

    last = [logging.DEBUG]

    @llama_cpp.llama_log_callback
    def route(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        if level != _CONTINUED:
            last[0] = _LOG_LEVELS.get(level, logging.DEBUG)
        if log.isEnabledFor(last[0]):
            log.log(last[0], "llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

    llama_cpp.llama_log_set(route, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _callbacks.append(route)  # ctypes callbacks must outlive every call into the library
    _lib = llama_cpp
    return _lib


_lib: Any = None
_callbacks: list[Any] = []


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_threads(threads: int | None) -> int:
    """The thread count to run with (None: every CPU this process may use); a clear error when out of range."""
    cpus = cpu_count()
    if threads is None:
        return cpus
    if not 1 <= threads <= cpus:
        raise ValueError(
            f"llm.threads = {threads}, but this machine lets this process use {cpus} CPUs; "
            f"fix: set llm.threads between 1 and {cpus}, or leave it unset (all of them)"
        )
    return threads


def gguf_file(location: str | Path) -> Path:
    """The .gguf a location names: the file itself, or the one .gguf in a folder (a prepared model's cache)."""
    path = Path(location)
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise LlamaCppError(
                f"{path} holds {len(found)} .gguf files, and llm.engine = 'llama.cpp' needs exactly one; "
                "fix: point the model at the .gguf file itself"
            )
        path = found[0]
    if not path.is_file():
        raise LlamaCppError(f"GGUF file {path} does not exist; fix: `specvoice models prepare`, or fix the path")
    with open(path, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise LlamaCppError(
                f"{path} is not a GGUF file (no GGUF header); fix: point the model at a .gguf file, or set "
                "llm.engine = 'torch' for a transformers folder"
            )
    return path


@dataclass(eq=False)
class GgufModel:
    """One GGUF's weights in llama.cpp, shared by every cache (context) that runs them."""

    path: Path
    model: Any  # llama_model_p
    vocab: Any  # llama_vocab_p
    n_vocab: int
    threads: int
    context_limit: int
    batch: int  # most tokens one llama_decode takes (a longer feed is split)
    spare: list[Any] = field(default_factory=list)  # contexts given back, emptied, for the next cache to take
    huge: HugePages = field(default_factory=HugePages)  # what llm.huge_pages did for the weights
    share: CpuShare | None = None  # llm.threads unset: run on the cores other programs leave free

    def threads_now(self) -> int:
        """The threads a pass should use now: llm.threads when set, else the cores not kept busy by others."""
        return self.threads if self.share is None else self.share.threads()

    @classmethod
    def load(
        cls, location: str | Path, *, threads: int | None, context_limit: int, batch: int, huge_pages: bool = True
    ) -> GgufModel:
        lib = _llama_cpp()
        path = gguf_file(location)
        params = lib.llama_model_default_params()
        params.load_mode = lib.LLAMA_LOAD_MODE_NONE  # read into RAM, no live mmap: see the module docstring
        before = anonymous_mappings()
        model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise LlamaCppError(
                f"llama.cpp could not load {path} (damaged, truncated, or an architecture this llama.cpp does not "
                "know; its log says which at debug level); fix: `specvoice models verify --repair`, or replace "
                "the file"
            )
        vocab = lib.llama_model_get_vocab(model)
        loaded = cls(path, model, vocab, lib.llama_vocab_n_tokens(vocab), check_threads(threads), context_limit, batch)
        if threads is None:
            loaded.share = CpuShare(loaded.threads)
        if huge_pages:
            loaded.huge = collapse_new(before)
            log.debug(
                "huge pages",
                extra={"model": path.name, "mb": loaded.huge.bytes >> 20, "seconds": round(loaded.huge.seconds, 2)}
                | ({"why_not": loaded.huge.why_not} if loaded.huge.why_not else {}),
            )
        return loaded

    def is_end_of_generation(self, token: int) -> bool:
        return bool(_llama_cpp().llama_vocab_is_eog(self.vocab, token))

    def new_context(self) -> Any:
        lib = _llama_cpp()
        params = lib.llama_context_default_params()
        params.n_ctx = self.context_limit
        params.n_batch = params.n_ubatch = self.batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        # llama-cpp-python's default (and so what its users run): our output then matches llama.cpp's own loop
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = lib.llama_init_from_model(self.model, params)
        if not ctx:
            raise LlamaCppError(
                f"llama.cpp could not make a context of {self.context_limit} tokens for {self.path.name} (out of "
                "memory?); fix: lower llm.context_limit or server.max_sessions"
            )
        return ctx

    def take_context(self) -> Any:
        """An empty context: a spare one (making one costs ~70 ms: KV and compute buffers), else a new one."""
        return self.spare.pop() if self.spare else self.new_context()

    def give_back(self, ctx: Any) -> None:
        lib = _llama_cpp()
        if len(self.spare) >= SPARE_CONTEXTS:
            lib.llama_free(ctx)
            return
        lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
        self.spare.append(ctx)

    def close(self) -> None:
        """Free the weights and the spare contexts (every cache of this model must be closed first)."""
        lib = _llama_cpp()
        while self.spare:
            lib.llama_free(self.spare.pop())
        if self.model:
            lib.llama_model_free(self.model)
            self.model = None


class LlamaCppLM(CachedLM):
    """One KV cache over a GGUF model in llama.cpp: the ``CachedLM`` rules on llama.cpp's kernels.

    The context (its KV cache) is taken on the first pass and given back to the model with this object.
    Cropping removes the positions after n from the sequence (llama.cpp's per-sequence KV removal). A pass asks
    llama.cpp for logits only at the rows the caller wants: a prefill asks for none, a verify pass for the
    drafted positions.
    """

    def __init__(
        self,
        model: GgufModel,
        out_ids: torch.Tensor | None = None,
        vocab_size: int | None = None,
        real_vocab: int | None = None,
    ):
        super().__init__(out_ids, vocab_size, real_vocab)
        self.gguf = model
        self._ctx: Any = None
        self._batch: Any = None
        self._threads = 0  # what the context was last told to run on (0: not yet)

    def _context(self) -> Any:
        if self._ctx is None:
            lib = _llama_cpp()
            self._ctx = self.gguf.take_context()
            self._threads = 0  # a spare context keeps the count its last user set
            self._batch = lib.llama_batch_init(self.gguf.batch, 0, 1)
        return self._ctx

    def crop(self, n: int) -> None:
        n = min(n, len(self.ids))
        if n < len(self.ids) and self._ctx is not None:
            lib = _llama_cpp()
            if not lib.llama_memory_seq_rm(lib.llama_get_memory(self._ctx), 0, n, -1):
                self._reset()  # a model whose memory cannot drop a tail: start again from nothing
                return
        self.ids = self.ids[:n]

    def _reset(self) -> None:
        if self._ctx is not None:
            lib = _llama_cpp()
            lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
        self.ids = []

    def forward(self, feed: list[int], n_out: int) -> torch.Tensor:
        """One pass over ``feed`` after the cached ids; the logits of its last n_out positions, float32 [n_out, V]."""
        rows = [torch.from_numpy(row.copy()) for row in self._decode(feed, n_out)]  # the buffer is reused
        return self.mask_padding(torch.stack(rows) if rows else torch.empty(0, self.gguf.n_vocab))

    def greedy(self, seq: list[int], extra: Sequence[int] = ()) -> list[int]:
        """``CachedLM.greedy`` read straight from llama.cpp's logits buffer: no copy, no tensor."""
        keep = min(common_prefix(self.ids, seq), len(seq) - 1)
        self.crop(keep)
        rows = self._decode(list(seq[keep:]) + list(extra), len(extra) + 1)
        self.ids = list(seq) + list(extra)
        real = self.real_vocab or self.gguf.n_vocab
        return [int(row[:real].argmax()) for row in rows]

    def _decode(self, feed: list[int], n_out: int) -> list[np.ndarray]:
        """Run ``feed`` after the cached ids, in batches of at most ``gguf.batch`` tokens, asking for logits at
        the last n_out positions only (at most one batch of them); views of those rows in llama.cpp's buffer,
        valid until the next pass. A pass that fails forgets the cache."""
        lib = _llama_cpp()
        start = len(self.ids)
        if start + len(feed) > self.gguf.context_limit:
            raise LlamaCppError(
                f"{start + len(feed)} tokens do not fit the context of {self.gguf.context_limit}; "
                "fix: raise llm.context_limit or lower dialog.history_tokens"
            )
        ctx, batch = self._context(), self._batch
        first_out = len(feed) - n_out
        if (threads := self.gguf.threads_now()) != self._threads:
            lib.llama_set_n_threads(ctx, threads, threads)
            self._threads = threads
        try:
            for at in range(0, len(feed), self.gguf.batch):
                part = feed[at : at + self.gguf.batch]
                for i, token in enumerate(part):
                    batch.token[i] = token
                    batch.pos[i] = start + at + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = at + i >= first_out
                batch.n_tokens = len(part)
                code = lib.llama_decode(ctx, batch)
                if code != 0:
                    raise LlamaCppError(f"llama_decode returned {code} after {start + at} cached tokens")
        except BaseException:
            self._reset()
            raise
        self.fed_tokens += len(feed)
        last = len(part) if feed else 0
        if n_out > last:
            raise ValueError(f"{n_out} rows of logits asked for, but one pass gives at most {self.gguf.batch}")
        shape = (self.gguf.n_vocab,)
        return [np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, i), shape=shape) for i in range(last - n_out, last)]

    def close(self) -> None:
        """Give the context back to the model (emptied), for the next cache."""
        lib = _lib
        if lib is None or self.gguf.model is None:
            return
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            self.gguf.give_back(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        self.close()
