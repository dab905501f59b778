"""The LLM engine the rest of the product uses: load a target (+ draft), hold conversations, stream replies.

- ``Engine`` owns the models, one worker thread for all model compute (so steps of different conversations
  are serialised and the event loop never blocks), and the learning draft-length policies, one per settings
  (``policy_for``: costs are per device, so what one reply measured serves the next).
- ``Conversation`` (conversation.py) owns one chat: its messages and its own KV caches for both models.
- The config's llm section maps to load arguments in one place per engine (``from_config``; ``llm.load`` picks
  the engine: this torch one, or llama.cpp's in llamacpp_engine.py) and to decode settings in one place
  (``DecodeSettings.from_config``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from llm.cache import CachedLM, TorchCachedLM, head_rows
from llm.constrain import ChoiceConstraint
from llm.models import (
    align_draft_head,
    check_compatible,
    load_causal_lm,
    load_tokenizer,
    quantize_int8,
    reduce_vocab_head,
)
from llm.policy import DraftLengthPolicy
from llm.proposers import DraftModelProposer, NgramProposer, Proposer
from llm.quant import quantize_cached, quantize_weights
from llm.settings import (
    HISTORY_TOKENS,
    Compile,
    DecodeSettings,
    DecodeStats,
    DraftQuantize,
    Emission,
    LoadSettings,
    Mode,
    TargetQuantize,
)
from llm.speculative import Generation
from llm.vocab import draft_head, head_key

if TYPE_CHECKING:
    from llm.conversation import Conversation

__all__ = ["ContextLimitError", "DecodeSettings", "DecodeStats", "Emission", "Engine"]

log = logging.getLogger("specvoice.llm")
T = TypeVar("T")

LOAD = LoadSettings()  # the load defaults (llm/settings.py owns them): every signature below reads them from here


# per-token acceptance before any is measured: the embedded 0.5B draft's (bench llm: 0.66-0.70), and the n-gram
# lookup's on conversational replies (bench llm: 0.32 at k=3); the policy learns the live value from there
PRIOR_ALPHA = {"draft": 0.7, "ngram": 0.4}


@dataclass(frozen=True)
class PolicyKey:
    """The settings that shape a learning draft-length policy (``Engine.policy_for``): one policy per value."""

    mode: Mode  # the proposer kind: its acceptance and costs are its own
    confidence: bool  # draft_length "confidence" (else "adaptive")
    max_k: int
    width: int  # a tree's candidates per depth (1: a chain)
    max_nodes: int
    threshold: float | None  # draft_confidence


class ContextLimitError(ValueError):
    """The prompt does not fit the context limit."""


class Engine:
    """A target model, an optional draft, and the one worker thread that runs them."""

    concurrent = False  # one reply at a time on this machine: the assistant queues sessions' turns

    def __init__(
        self,
        target_model,
        tokenizer,
        draft_model=None,
        *,
        mode: Mode = LOAD.mode,
        context_limit: int = LOAD.context_limit,
        draft_out_ids: torch.Tensor | None = None,
        settings: DecodeSettings | None = None,
        compile: Compile = LOAD.compile,
        compile_mode: str = LOAD.compile_mode,
        static_cache: int = LOAD.static_cache,
    ):
        """compile: torch.compile the decode step of the draft, or of both models (measured no faster on a 2-core
        CPU: off there; for GPUs, with compile_mode "reduce-overhead" = CUDA graphs, which want static_cache,
        a preallocated cache of that many positions)."""
        if mode == "draft" and draft_model is None:
            raise ValueError("mode 'draft' needs a draft model; fix: give one, or use mode 'ngram' or 'target'")
        self.target_model, self.draft_model = target_model, draft_model
        self.vocab_size = head_rows(target_model)
        self.draft_out_ids = draft_out_ids
        if draft_model is not None:
            self.draft_out_ids = align_draft_head(target_model, draft_model, tokenizer, draft_out_ids)
        self._setup(tokenizer, mode, context_limit, settings, _stop_ids(tokenizer, target_model))
        self.static_cache = static_cache
        compiled = {"off": [], "draft": [draft_model], "both": [draft_model, target_model]}[compile]
        self._step_forward = {
            id(m): torch.compile(m.forward, mode=compile_mode, dynamic=False) for m in compiled if m is not None
        }

    def _setup(
        self, tokenizer: Any, mode: Mode, context_limit: int, settings: DecodeSettings | None, stop_ids: set[int]
    ) -> None:
        """What every engine has, whatever runs its models."""
        self.tokenizer, self.mode, self.context_limit = tokenizer, mode, context_limit
        self.settings = settings or DecodeSettings(mode=mode)
        self.stop_ids = stop_ids
        self.lock = threading.Lock()  # held around every use of the models and of a conversation's caches
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specvoice-llm")
        # the learning draft-length policies, one per settings that shape one (``policy_for``), made on first use
        self.policies: dict[PolicyKey, DraftLengthPolicy] = {}
        # costs measured at load (LlamaCppEngine.calibrate), per proposer kind: (verify_s, draft_s) a new policy
        # starts from instead of its priors
        self.measured_costs: dict[Mode, tuple[dict[int, float], float | None]] = {}
        self.info: dict[str, Any] = {}  # how the models were prepared (quantization, head), for benchmarks
        # what a "draft" request drafts with: the draft model, or (where it cannot pay) the n-gram lookup
        self.drafter: Mode = "draft"

    @classmethod
    def load(
        cls,
        target: str,
        draft: str | None = None,
        *,
        device: str = LOAD.device,
        dtype: str = LOAD.dtype,
        mode: Mode = LOAD.mode,
        draft_quantize: DraftQuantize = LOAD.draft_quantize,
        draft_vocab: int | None = LOAD.draft_vocab,
        threads: int | None = LOAD.threads,
        context_limit: int = LOAD.context_limit,
        settings: DecodeSettings | None = None,
        target_quantize: TargetQuantize = LOAD.target_quantize,
        token_counts: str | None = None,
        compile: Compile = LOAD.compile,
        compile_mode: str = LOAD.compile_mode,
        static_cache: int = LOAD.static_cache,
    ) -> Engine:
        """Load the pair; refuse a draft whose tokenizer differs from the target's (IncompatibleDraftError).

        draft_vocab: rows of the draft's reduced head, chosen from ``token_counts`` (default: the counts file in
        the target's folder, built by ``specvoice models prepare``; BPE merge order when there is none).
        """
        if mode == "draft":
            if not draft:
                raise ValueError("mode 'draft' needs a draft model; fix: set models.draft, or llm.mode = 'ngram'")
            check_compatible(load_tokenizer(target), load_tokenizer(draft))  # before loading any weights
        if device != "cpu" and draft_quantize == "int8":
            raise ValueError(
                "draft_quantize = 'int8' is CPU-only (torch dynamic quantization); "
                "fix: set llm.draft_quantize = 'int4' or 'none' on this device"
            )
        target_model, tokenizer = load_causal_lm(target, device=device, dtype=dtype, threads=threads)
        info: dict[str, Any] = {"target_quantize": target_quantize, "draft_quantize": draft_quantize}
        if target_quantize == "int4":
            # the Q6_K tensors of the GGUF (head, some down/value projections) keep 8 bits: see quant.py
            info["target_layers"] = _quantize(target_model, target, 4, off_grid_bits=8)
        draft_model, out_ids = None, None
        if mode == "draft" and draft:
            draft_model, _ = load_causal_lm(draft, device=device, dtype=dtype, threads=threads)
            if draft_vocab:
                out_ids, chosen_by = draft_head(tokenizer, target, draft_vocab, token_counts)
                info["draft_head"] = {"rows": len(out_ids), "chosen_by": chosen_by}
                reduce_vocab_head(draft_model, out_ids)
            out_ids = align_draft_head(target_model, draft_model, tokenizer, out_ids)  # before the head is packed
            if draft_quantize == "int8":
                quantize_int8(draft_model)
            elif draft_quantize == "int4":
                info["draft_layers"] = _quantize(draft_model, draft, 4, variant=head_key(out_ids))
        engine = cls(
            target_model,
            tokenizer,
            draft_model,
            mode=mode,
            context_limit=context_limit,
            draft_out_ids=out_ids,
            settings=settings or DecodeSettings(mode=mode),
            compile=compile,
            compile_mode=compile_mode,
            static_cache=static_cache,
        )
        engine.info = info
        return engine

    @classmethod
    def from_config(cls, target: str, draft: str | None, llm: dict[str, Any], *, keep_draft: bool = False) -> Engine:
        """Load from the config's llm section (as a dict): the one place its keys become load arguments (for
        this engine; ``llm.load.load_engine`` picks the engine). keep_draft: see LlamaCppEngine.calibrate."""
        load = LoadSettings.from_config(llm)
        return cls.load(
            target,
            draft if load.mode == "draft" else None,
            device=load.device,
            dtype=load.dtype,
            mode=load.mode,
            draft_quantize=load.draft_quantize,
            draft_vocab=load.draft_vocab,
            threads=load.threads,
            context_limit=load.context_limit,
            target_quantize=load.target_quantize,
            compile=load.compile,
            compile_mode=load.compile_mode,
            static_cache=load.static_cache,
            settings=DecodeSettings.from_config(llm),
        )

    def conversation(self, system_prompt: str, history_tokens: int = HISTORY_TOKENS) -> Conversation:
        from llm.conversation import Conversation

        return Conversation(self, system_prompt, history_tokens)

    # --- building blocks shared by conversations, tests and the benchmark -------------------------------------

    def new_caches(self) -> tuple[CachedLM, CachedLM | None]:
        real = len(self.tokenizer)
        static = self.static_cache and min(self.static_cache, self.context_limit)
        target = TorchCachedLM(
            self.target_model,
            real_vocab=real if self.vocab_size > real else None,
            static_len=static,
            step_forward=self._step_forward.get(id(self.target_model)),
            step_tokens=self.settings.max_draft_length + 1,
        )  # a verify pass is a decode step too
        draft = None
        if self.draft_model is not None:
            padded = self.draft_out_ids is None and head_rows(self.draft_model) > real
            draft = TorchCachedLM(
                self.draft_model,
                out_ids=self.draft_out_ids,
                vocab_size=self.vocab_size,
                real_vocab=real if padded else None,
                static_len=static,
                step_forward=self._step_forward.get(id(self.draft_model)),
            )
        return target, draft

    def policy_for(self, settings: DecodeSettings) -> DraftLengthPolicy:
        """The draft-length policy a reply with these settings drafts by.

        An adaptive or confidence policy learns (acceptance, the draft's calibration, the costs of this device)
        and is kept: one per ``PolicyKey``, shared on purpose by every conversation decoding with those
        settings, so each reply starts from what the earlier ones measured. Its settings are fixed when it is
        made and never changed afterwards: a conversation with other settings (another length cap, a tree)
        gets its own policy instead of retuning one that other conversations are drafting by mid-reply. The
        learned statistics are the only state conversations share.

        A fixed length learns nothing worth keeping, and a seeded run must be reproducible (it may not read
        what other replies measured, nor the clock): those get a fresh policy per reply.
        """
        mode, width, max_nodes = settings.mode, settings.width, settings.tree_nodes
        confidence = settings.draft_length == "confidence"
        if settings.draft_length in ("adaptive", "confidence") and mode != "target" and settings.seed is None:
            key = PolicyKey(mode, confidence, settings.max_draft_length, width, max_nodes, settings.draft_confidence)
            if key not in self.policies:
                policy = DraftLengthPolicy(
                    max_k=settings.max_draft_length,
                    prior_alpha=PRIOR_ALPHA[mode],
                    width=width,
                    max_nodes=max_nodes,
                    confidence=confidence,
                    threshold=settings.draft_confidence,
                )
                if mode in self.measured_costs:
                    verify_s, policy.draft_s = self.measured_costs[mode]
                    policy.verify_s = dict(verify_s)
                self.policies[key] = policy
            return self.policies[key]
        if confidence:
            # a seeded run must be reproducible, and the cost rule reads the clock: stop at a fixed threshold
            return DraftLengthPolicy(
                max_k=settings.max_draft_length, confidence=True, threshold=settings.draft_confidence or 0.5
            )
        if settings.draft_length == "adaptive":
            # likewise: use the length the policy's prior picks, which is fixed
            k = DraftLengthPolicy(max_k=settings.max_draft_length, width=width, max_nodes=max_nodes).choose(
                settings.max_draft_length + 1
            )
            return DraftLengthPolicy(fixed=k, max_k=k)
        assert isinstance(settings.draft_length, int)
        return DraftLengthPolicy(fixed=settings.draft_length, max_k=settings.draft_length)

    def generation(
        self,
        prompt: list[int],
        settings: DecodeSettings,
        target: CachedLM,
        draft: CachedLM | None,
        constraint: ChoiceConstraint | None = None,
    ) -> Generation:
        mode = settings.mode
        if mode == "draft" and draft is None and (self.drafter == "draft" or isinstance(settings.draft_length, int)):
            raise ValueError(
                "mode 'draft' needs a draft model, and this engine was loaded without one; "
                "fix: use mode 'ngram' or 'target', or load the engine with a draft"
            )
        if mode == "draft" and self.drafter != "draft" and settings.draft_length in ("adaptive", "confidence"):
            # the draft model cannot pay here; the n-gram lookup has no confidence to stop on: its length is adaptive
            mode, settings = self.drafter, settings.but(mode=self.drafter, draft_length="adaptive")
        proposer: Proposer | None = None
        if mode == "draft":
            assert draft is not None
            proposer = DraftModelProposer(draft, settings.width, settings.tree_nodes)
        elif mode == "ngram":
            proposer = NgramProposer(settings.ngram_max)
        generator = None
        if not settings.sampling.greedy:
            generator = torch.Generator().manual_seed(
                settings.seed if settings.seed is not None else int(time.time_ns() % (1 << 62))
            )
        return Generation(
            target,
            proposer,
            prompt,
            settings.sampling,
            settings.max_new_tokens,
            self.stop_ids,
            self.policy_for(settings),
            generator,
            settings.prefill_chunk,
            constraint,
        )

    def check_prompt(self, prompt: list[int], settings: DecodeSettings) -> int:
        """Return how many new tokens fit; raise ContextLimitError when the prompt alone does not fit."""
        if not prompt:
            raise ValueError("empty prompt: nothing to continue; fix: give at least one token of text")
        room = self.context_limit - len(prompt)
        if room < 1:
            raise ContextLimitError(
                f"the prompt is {len(prompt)} tokens but llm.context_limit is {self.context_limit}; "
                "fix: shorten the input, lower dialog.history_tokens, or raise llm.context_limit"
            )
        return min(settings.max_new_tokens, room)

    def decode(
        self, prompt: list[int], settings: DecodeSettings | None = None, *, caches=None
    ) -> tuple[list[int], DecodeStats]:
        """Synchronous decode of token ids (fresh caches unless given): for tests and the benchmark."""
        settings = settings or self.settings
        limit = self.check_prompt(prompt, settings)
        target, draft = caches or self.new_caches()
        with self.lock:
            start = time.monotonic()
            reused = target.keep_prefix_of(prompt)
            gen = self.generation(prompt, settings.but(max_new_tokens=limit), target, draft)
            while not gen.done:
                gen.step()
        return gen.new_tokens, gen.stats(settings.mode, start, len(prompt) - reused)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the engine's worker thread, holding the model lock there."""

        def locked() -> T:
            with self.lock:
                return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self._executor, locked)


def _quantize(
    model: torch.nn.Module, location: str, bits: int, off_grid_bits: int | None = None, variant: str = ""
) -> dict[str, int]:
    """Quantize, through the cache next to a local model's weights (a hub model has no folder of ours)."""
    if location.startswith("hub:") or next(model.parameters()).device.type != "cpu":
        return quantize_weights(model, bits, off_grid_bits=off_grid_bits)
    return quantize_cached(model, location, bits, off_grid_bits, variant)


def _stop_ids(tokenizer, model) -> set[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return {i for i in ids if i is not None}
