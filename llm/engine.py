"""The LLM engine the rest of the product uses: load a target (+ draft), hold conversations, stream replies.

- ``Engine`` owns the models, one worker thread for all model compute (so steps of different conversations
  are serialised and the event loop never blocks), and the draft-length policy (costs are per device).
- ``Conversation`` owns one chat: its messages and its own KV caches for both models, kept across turns, so a
  new turn only prefills what the cache does not already hold.
- ``Conversation.reply`` is an async iterator of ``Emission``s: accepted text with the time it was verified.
  Between steps it awaits, so cancelling the consuming task stops it within one step; the step that was
  running finishes in the worker thread and leaves the caches consistent (they always hold exactly the ids
  they record, see speculative.CachedLM).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

from llm.models import (check_compatible, frequent_token_ids, load_causal_lm, load_tokenizer, quantize_int8,
                        reduce_vocab_head)
from llm.speculative import (CachedLM, common_prefix, DraftLengthPolicy, DraftModelProposer, Generation, NgramProposer,
                             SamplingParams)

log = logging.getLogger("specvoice.llm")

Mode = Literal["draft", "ngram", "target"]


class ContextLimitError(ValueError):
    """The prompt does not fit the context limit."""


@dataclass
class DecodeSettings:
    """How one reply is decoded. temperature 0 = greedy (output identical to the target alone)."""

    mode: Mode = "draft"
    draft_length: int | Literal["adaptive"] = "adaptive"
    max_draft_length: int = 6
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 96
    ngram_max: int = 3
    tree: bool = False  # token-tree verification (mode draft): the draft's chain plus its next-best siblings
    tree_width: int = 2  # candidates per depth in a tree: the chain token and tree_width - 1 alternatives
    tree_nodes: int = 7  # most tree nodes per target pass: the verify cost is flat to ~6-8 fed tokens on a CPU

    def __post_init__(self) -> None:
        if self.mode not in ("draft", "ngram", "target"):
            raise ValueError(f"mode {self.mode!r} is not one of draft, ngram, target")
        if self.draft_length != "adaptive" and (not isinstance(self.draft_length, int) or self.draft_length < 1):
            raise ValueError(f"draft_length must be a positive integer or 'adaptive', got {self.draft_length!r}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and top_k >= 0")
        if self.tree_width < 1 or self.tree_nodes < 1:
            raise ValueError(f"need tree_width >= 1 and tree_nodes >= 1, got {self.tree_width}, {self.tree_nodes}")

    @classmethod
    def from_config(cls, llm: dict) -> DecodeSettings:
        """From the config's llm section (as a dict); keys that are not decode settings are ignored."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in llm.items() if k in names})

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def width(self) -> int:
        """Candidates per depth the draft proposes: tree_width for a tree, 1 for a chain."""
        return self.tree_width if self.tree and self.mode == "draft" else 1


@dataclass
class Emission:
    text: str
    token_ids: list[int]
    t: float  # time.monotonic() when the token was accepted (verified)


@dataclass
class DecodeStats:
    """One reply's numbers, as plain data (latency trace, logs, benchmark)."""

    mode: str
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens the target actually ran (the rest came from the kept cache)
    new_tokens: int = 0
    target_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_drafted: float = 0.0
    alpha_estimate: float = 0.0  # accepted / (accepted + rejections): per-token acceptance, geometric MLE
    mean_accepted_length: float = 0.0  # tokens committed per verifying target pass (1 + accepted/pass)
    tokens_per_s: float = 0.0  # new tokens / (last token time - request time), prefill included
    ttft_s: float = 0.0
    total_s: float = 0.0
    draft_lengths: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # monotonic acceptance time of each new token

    @classmethod
    def from_generation(cls, gen: Generation, mode: str, start: float, prefill_tokens: int) -> DecodeStats:
        steps = gen.records[1:]  # the first step is the prefill
        drafted = sum(r.drafted for r in steps)
        accepted = sum(r.accepted for r in steps)
        rejections = sum(1 for r in steps if r.accepted < r.drafted)
        times = [r.t for r in gen.records for _ in r.committed]
        end = times[-1] if times else start
        n = len(gen.new_tokens)
        return cls(
            mode=mode, prompt_tokens=len(gen.prompt), prefill_tokens=prefill_tokens, new_tokens=n,
            target_calls=gen.target_calls, drafted=drafted, accepted=accepted,
            accepted_per_drafted=accepted / drafted if drafted else 0.0,
            alpha_estimate=accepted / (accepted + rejections) if accepted + rejections else 0.0,
            mean_accepted_length=(n - len(gen.records[0].committed)) / len(steps) if steps else 0.0,
            tokens_per_s=n / (end - start) if end > start else 0.0,
            ttft_s=(gen.first_token_t - start) if gen.first_token_t else 0.0,
            total_s=end - start, draft_lengths=[r.drafted for r in steps], token_times=times,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def log_line(self) -> str:
        return (f"llm {self.mode}: {self.new_tokens} tokens in {self.total_s:.2f}s ({self.tokens_per_s:.2f} tok/s), "
                f"ttft {self.ttft_s * 1000:.0f} ms, prefill {self.prefill_tokens}/{self.prompt_tokens} tokens, "
                f"target calls {self.target_calls}, accepted/drafted {self.accepted}/{self.drafted}, "
                f"alpha {self.alpha_estimate:.2f}, mean accepted length {self.mean_accepted_length:.2f}")


class Engine:
    """A target model, an optional draft, and the one worker thread that runs them."""

    def __init__(self, target_model, tokenizer, draft_model=None, *, mode: Mode = "draft", context_limit: int = 4096,
                 draft_out_ids: torch.Tensor | None = None, settings: DecodeSettings | None = None):
        if mode == "draft" and draft_model is None:
            raise ValueError("mode 'draft' needs a draft model; fix: give one, or use mode 'ngram' or 'target'")
        self.target_model, self.draft_model, self.tokenizer = target_model, draft_model, tokenizer
        self.mode = mode
        self.context_limit = context_limit
        self.draft_out_ids = draft_out_ids
        self.vocab_size = target_model.get_output_embeddings().weight.shape[0]
        self.settings = settings or DecodeSettings(mode=mode)
        self.stop_ids = _stop_ids(tokenizer, target_model)
        self.lock = threading.Lock()  # held around every use of the models and of a conversation's caches
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specvoice-llm")
        # adaptive draft length: one policy per proposer kind, as their costs and acceptance differ
        self.policies = {m: DraftLengthPolicy(max_k=self.settings.max_draft_length) for m in ("draft", "ngram")}

    @classmethod
    def load(cls, target: str, draft: str | None = None, *, device: str = "cpu", dtype: str = "bfloat16",
             mode: Mode = "draft", draft_quantize: Literal["none", "int8"] = "none", draft_vocab: int | None = None,
             threads: int | None = None, context_limit: int = 4096, settings: DecodeSettings | None = None) -> Engine:
        """Load the pair; refuse a draft whose tokenizer differs from the target's (IncompatibleDraftError)."""
        if mode == "draft":
            if not draft:
                raise ValueError("mode 'draft' needs a draft model; fix: set models.draft, or llm.mode = 'ngram'")
            check_compatible(load_tokenizer(target), load_tokenizer(draft))  # before loading any weights
        target_model, tokenizer = load_causal_lm(target, device=device, dtype=dtype, threads=threads)
        draft_model, out_ids = None, None
        if mode == "draft":
            draft_model, _ = load_causal_lm(draft, device=device, dtype=dtype, threads=threads)
            if draft_vocab:
                out_ids = frequent_token_ids(tokenizer, draft_vocab)
                reduce_vocab_head(draft_model, out_ids)
            if draft_quantize == "int8":
                if device != "cpu":
                    raise ValueError("draft_quantize = 'int8' is CPU-only (torch dynamic quantization); "
                                     "fix: set llm.draft_quantize = 'none' on this device")
                quantize_int8(draft_model)
        settings = settings or DecodeSettings(mode=mode)
        return cls(target_model, tokenizer, draft_model, mode=mode, context_limit=context_limit,
                   draft_out_ids=out_ids, settings=settings)

    def conversation(self, system_prompt: str, history_tokens: int = 1536) -> Conversation:
        return Conversation(self, system_prompt, history_tokens)

    # --- building blocks shared by conversations, tests and the benchmark -------------------------------------

    def new_caches(self) -> tuple[CachedLM, CachedLM | None]:
        target = CachedLM(self.target_model)
        draft = None
        if self.draft_model is not None:
            draft = CachedLM(self.draft_model, out_ids=self.draft_out_ids, vocab_size=self.vocab_size)
        return target, draft

    def generation(self, prompt: list[int], settings: DecodeSettings, target: CachedLM,
                   draft: CachedLM | None) -> Generation:
        mode = settings.mode
        if mode == "draft" and draft is None:
            raise ValueError("mode 'draft' needs a draft model, and this engine was loaded without one; "
                             "fix: use mode 'ngram' or 'target', or load the engine with a draft")
        width, max_nodes = settings.width, settings.tree_nodes
        proposer = {"draft": lambda: DraftModelProposer(draft, width, max_nodes),
                    "ngram": lambda: NgramProposer(settings.ngram_max), "target": lambda: None}[mode]()
        if settings.draft_length == "adaptive" and mode != "target" and settings.seed is None:
            policy = self.policies[mode]  # shared by chain and tree runs: the costs and alpha are the same
            policy.max_k, policy.width, policy.max_nodes = settings.max_draft_length, width, max_nodes
        elif settings.draft_length == "adaptive":
            # a seeded run must be reproducible, and the adaptive length reads the clock (which changes how many
            # random numbers a step uses): use the length the policy's prior picks, which is fixed
            k = DraftLengthPolicy(max_k=settings.max_draft_length, width=width, max_nodes=max_nodes
                                  ).choose(settings.max_draft_length + 1)
            policy = DraftLengthPolicy(fixed=k, max_k=k)
        else:
            policy = DraftLengthPolicy(fixed=settings.draft_length, max_k=settings.draft_length)
        generator = None
        if not settings.sampling.greedy:
            generator = torch.Generator().manual_seed(settings.seed if settings.seed is not None
                                                      else int(time.time_ns() % (1 << 62)))
        return Generation(target, proposer, prompt, settings.sampling, settings.max_new_tokens, self.stop_ids,
                          policy, generator)

    def check_prompt(self, prompt: list[int], settings: DecodeSettings) -> int:
        """Return how many new tokens fit; raise ContextLimitError when the prompt alone does not fit."""
        if not prompt:
            raise ValueError("empty prompt: nothing to continue; fix: give at least one token of text")
        room = self.context_limit - len(prompt)
        if room < 1:
            raise ContextLimitError(
                f"the prompt is {len(prompt)} tokens but llm.context_limit is {self.context_limit}; "
                "fix: shorten the input, lower dialog.history_tokens, or raise llm.context_limit")
        return min(settings.max_new_tokens, room)

    def decode(self, prompt: list[int], settings: DecodeSettings | None = None, *, caches=None
               ) -> tuple[list[int], DecodeStats]:
        """Synchronous decode of token ids (fresh caches unless given): for tests and the benchmark."""
        settings = settings or self.settings
        limit = self.check_prompt(prompt, settings)
        target, draft = caches or self.new_caches()
        with self.lock:
            start = time.monotonic()
            reused = target.keep_prefix_of(prompt)
            gen = self.generation(prompt, _with_limit(settings, limit), target, draft)
            while not gen.done:
                gen.step()
        return gen.new_tokens, DecodeStats.from_generation(gen, settings.mode, start, len(prompt) - reused)

    async def run(self, fn, *args):
        """Run fn(*args) on the engine's worker thread, holding the model lock there."""

        def locked():
            with self.lock:
                return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self._executor, locked)


def _with_limit(settings: DecodeSettings, limit: int) -> DecodeSettings:
    if limit == settings.max_new_tokens:
        return settings
    return DecodeSettings(**{**asdict(settings), "max_new_tokens": limit})


def _stop_ids(tokenizer, model) -> set[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return {i for i in ids if i is not None}


class Conversation:
    """One chat with its own KV caches (target and draft), kept across turns."""

    def __init__(self, engine: Engine, system_prompt: str, history_tokens: int = 1536):
        self.engine = engine
        self.history_tokens = history_tokens
        self.messages: list[dict] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self._target, self._draft = engine.new_caches()
        self._busy = False
        self._before_turn: list[dict] | None = None  # the messages before the latest reply (forget_last_turn)
        self._pending: list[dict] | None = None  # reply(commit=False): the history it answers, until commit()
        self.last_stats: DecodeStats | None = None
        # functions the model may call, in the chat template's format ([{"type": "function", "function": {...}}]);
        # the template shows them to the model, which answers with a call in its own syntax (Qwen2.5: <tool_call>)
        self.tools: list[dict] | None = None

    @property
    def cached_tokens(self) -> tuple[int, int | None]:
        """How many tokens the target's and the draft's caches hold (for tests and diagnostics)."""
        return len(self._target.ids), (len(self._draft.ids) if self._draft is not None else None)

    def prompt_ids(self, messages: list[dict] | None = None) -> list[int]:
        ids = self.engine.tokenizer.apply_chat_template(messages if messages is not None else self.messages,
                                                        tools=self.tools or None, add_generation_prompt=True,
                                                        tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def _fit_history(self, messages: list[dict]) -> tuple[list[dict], list[int]]:
        """The messages to keep and their prompt: the oldest exchanges (never the system prompt or the newest
        user turn) are dropped while the prompt is longer than history_tokens."""
        messages = list(messages)
        prompt = self.prompt_ids(messages)
        first = 1 if messages and messages[0]["role"] == "system" else 0
        while len(prompt) > self.history_tokens and len(messages) - first > 1:
            drop = 2 if len(messages) - first > 2 else 1
            del messages[first:first + drop]
            prompt = self.prompt_ids(messages)
        return messages, prompt

    async def reply(self, user_text: str | None, settings: DecodeSettings | None = None, *, commit: bool = True
                    ) -> AsyncIterator[Emission]:
        """Stream the accepted reply to ``user_text`` (None: to the history as it is, e.g. a greeting, or the
        answer after a function's output).

        ``commit=True``: the user turn and what was streamed join the history when the stream ends (also when it
        is cancelled). ``commit=False``: the history is left untouched while streaming; the caller then calls
        ``commit(text)`` once with what the user actually heard, or ``discard()`` (a reply started early on a
        guess, or one cancelled before anything was heard). A voice turn commits once, with the heard text."""
        settings = settings or self.engine.settings
        if user_text is not None and not user_text.strip():
            raise ValueError("empty user text: there is nothing to reply to; fix: send some words")
        if user_text is None and not self.messages:
            raise ValueError("no history and no user text: there is nothing to reply to; fix: send some words")
        if self._busy:
            raise RuntimeError("this conversation is already streaming a reply; fix: finish or cancel it first")
        if settings.max_new_tokens == 0:
            return  # defined result: no reply, and the conversation is left as it was
        new = [{"role": "user", "content": user_text}] if user_text is not None else []
        self._busy = True
        try:  # tokenizing a long history takes a while: on the engine's thread, never on the event loop
            kept, prompt = await self.engine.run(self._fit_history, self.messages + new)
            limit = self.engine.check_prompt(prompt, settings)  # before any change: a refused turn leaves no trace
        except BaseException:
            self._busy = False
            raise
        self._pending = kept  # the history this reply answers, the user turn included
        if commit:
            self._before_turn = list(self.messages)
            self.messages[:] = kept
        text = ""
        failed = False
        # with tools, a call's tags are special tokens (Qwen2.5: <tool_call>) that must reach the caller's parser;
        # stop tokens never reach the text either way
        skip_special = not self.tools
        try:
            start = time.monotonic()
            gen, reused = await self.engine.run(self._start, prompt, _with_limit(settings, limit))
            tokens: list[int] = []
            pending: list[int] = []
            while not gen.done:
                committed = await self.engine.run(gen.step)
                t = gen.records[-1].t
                for token in committed:
                    if token in self.engine.stop_ids:
                        continue
                    tokens.append(token)
                    pending.append(token)
                    full = self.engine.tokenizer.decode(tokens, skip_special_tokens=skip_special)
                    if full.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for the next token
                        continue
                    piece, text = full[len(text):], full
                    yield Emission(piece, pending, t)
                    pending = []
            self.last_stats = DecodeStats.from_generation(gen, settings.mode, start, len(prompt) - reused)
            log.info(self.last_stats.log_line(), extra={"llm_stats": self.last_stats.to_dict()})
        except Exception:
            # a failure (bad prompt, model error): the turn did not happen unless part of it was streamed
            failed = not text
            if failed and commit:
                self.messages[:] = self._before_turn or []
            raise
        finally:
            # normal end, cancellation (barge-in) or a failure after streaming: history keeps what was streamed
            if commit and not failed:
                self.messages.append({"role": "assistant", "content": text})
            if commit:
                self._pending = None
            self._busy = False

    @property
    def uncommitted(self) -> bool:
        """A ``reply(commit=False)`` turn waits for ``commit`` or ``discard``."""
        return self._pending is not None

    def commit(self, heard_text: str) -> None:
        """Write the latest ``reply(commit=False)`` turn into the history: the user's words, and the assistant's
        reply as far as the user heard it (no assistant message when nothing was heard). Once per reply."""
        if self._busy:
            raise RuntimeError("a reply is still streaming; fix: let it end or cancel it, then commit")
        if self._pending is None:
            raise ValueError("there is no uncommitted reply; fix: call reply(..., commit=False) first")
        self._before_turn = list(self.messages)
        self.messages[:] = self._pending + ([{"role": "assistant", "content": heard_text}] if heard_text else [])
        self._pending = None

    def discard(self) -> None:
        """Forget the latest ``reply(commit=False)`` turn: the history stays as it was (the caches drop its
        tokens at the next turn, as they fall outside the common prefix of the next prompt)."""
        self._pending = None

    async def warm(self) -> int:
        """Prefill both caches with what every next prompt starts with (system prompt and history, up to the
        next user message), so the next turn's time to first token pays only for the user's words. Returns the
        number of tokens now cached. Safe to skip: it only moves work earlier."""
        one = self.prompt_ids(self.messages + [{"role": "user", "content": "a"}])
        two = self.prompt_ids(self.messages + [{"role": "user", "content": "b c"}])
        prefix = one[:common_prefix(one, two)]
        if len(prefix) < 2 or self._busy:
            return 0

        def prefill() -> int:
            self._target.logits(prefix)
            if self._draft is not None:
                self._draft.logits(prefix)
            return len(prefix)

        return await self.engine.run(prefill)

    def _start(self, prompt: list[int], settings: DecodeSettings) -> tuple[Generation, int]:
        reused = self._target.keep_prefix_of(prompt)
        if self._draft is not None:
            self._draft.keep_prefix_of(prompt)
        return self.engine.generation(prompt, settings, self._target, self._draft), reused

    def forget_last_turn(self) -> None:
        """Undo the latest reply entirely (its user message too), as if it never happened: for a reply started
        early on a guess of what the user said, when the guess turned out wrong. The caches need no work: the
        next prompt no longer contains those tokens, so they fall outside the common prefix and are cropped."""
        if self._busy:
            raise RuntimeError("a reply is still streaming; fix: cancel it and wait for it to end first")
        if self._before_turn is None:
            raise ValueError("there is no reply to forget")
        self.messages[:] = self._before_turn
        self._before_turn = None

    def trim_last_reply(self, spoken_text: str) -> None:
        """Barge-in: the last assistant message becomes what the user heard, and the caches drop the rest.

        spoken_text must be a prefix of the reply, either exactly or word by word (whitespace may differ, as
        when the speaker rebuilt it from words). The caches are cropped now if the engine is idle, otherwise at
        the start of the next turn (a step still running for this conversation finishes first).
        """
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("there is no assistant reply to trim; fix: call trim_last_reply after a reply")
        reply = self.messages[-1]["content"]
        kept = _spoken_prefix(reply, spoken_text)
        if kept is None:
            raise ValueError(f"spoken text {spoken_text[:60]!r} is not a prefix of the last reply {reply[:60]!r}; "
                             "fix: pass the words that were actually played, in order")
        self.messages[-1]["content"] = kept
        if self.engine.lock.acquire(blocking=False):
            try:
                keep = self.prompt_ids()
                self._target.keep_prefix_of(keep)
                if self._draft is not None:
                    self._draft.keep_prefix_of(keep)
            finally:
                self.engine.lock.release()


def _spoken_prefix(reply: str, spoken: str) -> str | None:
    """The part of reply that was spoken: exact prefix, or the reply up to the end of the spoken words."""
    if reply.startswith(spoken):
        return spoken
    words = spoken.split()
    pos = 0
    for word in words:
        found = reply.find(word, pos)
        if found < 0 or reply[pos:found].strip():
            return None
        pos = found + len(word)
    return reply[:pos]
