"""One chat: its messages, its own KV caches for both models (kept across turns), streaming replies.

- ``reply`` is an async iterator of ``Emission``s: accepted text with the time it was verified. Between steps
  it awaits, so cancelling the consuming task stops it within one step (a prefill runs in chunks, so that
  holds before the first token too); the step that was running finishes in the worker thread and leaves the
  caches consistent (they always hold exactly the ids they record, see cache.CachedLM). A reply cancelled or
  failed before its first token commits nothing: the history is as it was before the call.
- History trimming keeps the prompt cache. Dropping the oldest exchange whenever the prompt is over budget
  would change the start of every later prompt, so every later turn would re-prefill the whole history (time
  to first token went from 0.3 s to 6-8 s after ~36 turns). Instead, once over budget, the oldest exchanges
  go in one block, down to ``trim_to`` of the budget: the kept prefix is then stable for many turns, and the
  prefill after a trim is bounded by that fraction. ``warm`` trims ahead of time when the next turn would
  cross the budget, and prefills the trimmed history while nobody waits. Call it when a reply's last token is
  out (the exchange is not committed yet, but the history before it is: a voice reply's audio is still
  playing, so the prefill after a trim costs the user nothing) and again after the commit.
- A trim still means one prefill of everything kept (trim_to of the budget: seconds on a CPU), more than one
  pause between turns may hold. So it is prepared over several: once the history is within PLAN_AHEAD
  exchanges of the budget, the trim's cut is planned (the same oldest exchanges a trim would drop then), and
  each warm-up prefills a second pair of caches (the shadow) with what will be kept, a chunk at a time. When
  the trim comes it cuts at the planned point, and whichever caches share more of the prompt are used: the
  turn after a trim prefills only the exchanges since the plan. Exact either way: a cache only ever holds
  the tokens of the prompt it serves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from llm.cache import CachedLM, common_prefix
from llm.constrain import ChoiceConstraint
from llm.history import ChatHistory
from llm.settings import HISTORY_TOKENS, DecodeSettings, DecodeStats, Emission
from llm.speculative import Generation

T = TypeVar("T")


class Engine(Protocol):
    """What a conversation needs from ``llm.engine.Engine`` (which creates conversations, so this module does
    not import it back)."""

    tokenizer: Any
    settings: DecodeSettings
    stop_ids: set[int]
    lock: threading.Lock

    def new_caches(self) -> tuple[CachedLM, CachedLM | None]: ...

    def check_prompt(self, prompt: list[int], settings: DecodeSettings) -> int: ...

    def generation(
        self,
        prompt: list[int],
        settings: DecodeSettings,
        target: CachedLM,
        draft: CachedLM | None,
        constraint: ChoiceConstraint | None = None,
    ) -> Generation: ...

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


log = logging.getLogger("specvoice.llm")

# Background prefill tokens per pass: at most this much work runs when the listener needs the CPU. The 1.5B
# GGUF target on 2 cores: 16 tokens 210 ms a pass (77 tok/s), 32 350 ms (92), 128 1.2-1.3 s (102).
WARM_CHUNK = 16
PLAN_AHEAD = 4  # exchanges before the budget is reached when the next trim's cut is planned (module docstring)


class Conversation(ChatHistory):
    """One chat with its own KV caches (target and draft), kept across turns."""

    def __init__(self, engine: Engine, system_prompt: str, history_tokens: int = HISTORY_TOKENS, trim_to: float = 0.5):
        if not 0 < trim_to <= 1:
            raise ValueError(f"trim_to must be in (0, 1], got {trim_to}")
        super().__init__(system_prompt)
        self.engine = engine
        self.history_tokens, self.trim_to = history_tokens, trim_to
        self._target, self._draft = engine.new_caches()
        self._pending_reply = ""  # ... and what it streamed, until commit() or discard()
        self._pending_before: int | None = 0  # ... the prompt length before it (None: a trim came between)
        self._pending_new = 0  # ... and how many of the pending messages are new (the user's, if any)
        self._exchange_tokens: list[int] = []  # prompt tokens each recent exchange added (to trim ahead)
        self.trims = 0  # how many times old exchanges were dropped (for tests and the soak benchmark)
        # the next trim, planned ahead: the first message it keeps after the system prompt, the prompt prefix
        # that will then be kept, and the caches (target, draft) being prefilled with it while nobody waits
        self._cut_at: dict[str, Any] | None = None
        self._cut_prefix: list[int] = []
        self._shadow: tuple[CachedLM, CachedLM | None] | None = None
        self.warm_tokens = 0  # prompt tokens the warm-ups fed the target (in the background; tests, benchmarks)
        self.last_stats: DecodeStats | None = None
        # functions the model may call, in the chat template's format ([{"type": "function", "function": {...}}]);
        # the template shows them to the model, which answers with a call in its own syntax (voice/dialog/toolcalls.py)
        self.tools: list[dict[str, Any]] | None = None
        self.constraint: ChoiceConstraint | None = None  # the next reply's constrained stretch (``constrain``)

    def constrain(self, trigger: str, choices: list[str], opening: Sequence[str] = ()) -> ChoiceConstraint | None:
        """The next reply continues its text after ``trigger`` only with one of ``choices`` (llm/constrain.py), and
        starts with one of ``opening`` if any; neither: no constraint. Returns it (its ``used`` counts the
        constrained tokens)."""
        tokenizer = self.engine.tokenizer
        self.constraint = ChoiceConstraint(tokenizer, trigger, choices, opening) if choices or opening else None
        return self.constraint

    @property
    def cached_tokens(self) -> tuple[int, int | None]:
        """How many tokens the target's and the draft's caches hold (for tests and diagnostics)."""
        return len(self._target.ids), (len(self._draft.ids) if self._draft is not None else None)

    def prompt_ids(self, messages: list[dict[str, Any]] | None = None) -> list[int]:
        ids = self.engine.tokenizer.apply_chat_template(
            messages if messages is not None else self.messages,
            tools=self.tools or None,
            add_generation_prompt=True,
            tokenize=True,
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def _trim(self, messages: list[dict[str, Any]], limit: int, keep: int) -> tuple[list[dict[str, Any]], list[int]]:
        """The messages to keep and their prompt. Under ``limit`` tokens nothing changes; over it, the oldest
        exchanges are dropped (never the system prompt or the newest ``keep`` messages) down to trim_to of the
        budget, so that the kept prefix stays stable for the next turns. Pure: the caller applies and counts."""
        messages = list(messages)
        prompt = self.prompt_ids(messages)
        if len(prompt) <= limit:
            return messages, prompt
        first = 1 if messages and messages[0]["role"] == "system" else 0
        at = next((i for i, m in enumerate(messages) if m is self._cut_at), None)
        if at is not None and at > first and len(messages) - at >= keep:  # the planned cut, if it makes room
            planned = messages[:first] + messages[at:]
            prompt = self.prompt_ids(planned)
            if len(prompt) <= limit:
                return planned, prompt
        return self._drop_oldest(messages, min(int(self.history_tokens * self.trim_to), limit), keep)

    def _drop_oldest(
        self, messages: list[dict[str, Any]], goal: int, keep: int
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """Drop the oldest exchanges (never the system prompt or the newest ``keep`` messages) until the prompt
        is at most ``goal`` tokens."""
        messages = list(messages)
        prompt = self.prompt_ids(messages)
        first = 1 if messages and messages[0]["role"] == "system" else 0
        while len(prompt) > goal and len(messages) - first > keep:
            drop = 2 if len(messages) - first > keep + 1 else 1
            del messages[first : first + drop]
            prompt = self.prompt_ids(messages)
        return messages, prompt

    async def reply(
        self, user_text: str | None, settings: DecodeSettings | None = None, *, commit: bool = True
    ) -> AsyncIterator[Emission]:
        """Stream the accepted reply to ``user_text`` (None: to the history as it is, e.g. a greeting, or the
        answer after a function's output).

        ``commit=True``: the user turn and what was streamed join the history when the stream ends (also when it
        is cancelled after the first token). ``commit=False``: the history is left untouched; the caller then
        calls ``commit(heard)`` once with what the user actually heard, or ``discard()`` (a reply started early
        on a guess). A voice turn commits once, with the heard text, so the history is never written twice."""
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
            before_len, (kept, prompt) = await self.engine.run(self._prepare, new)
            limit = self.engine.check_prompt(prompt, settings)  # before anything changes: a refusal leaves no trace
        except BaseException:
            self._busy = False
            raise
        trimmed = len(kept) < len(self.messages) + len(new)
        if commit:
            self._before_turn = list(self.messages)
            self.messages[:] = kept
        else:
            self._pending, self._pending_reply, self._pending_new = kept, "", len(new)
            self._pending_before = None if trimmed else before_len
        text = ""
        streamed = False
        # with tools, a call's tags are special tokens (Qwen2.5: <tool_call>) that must reach the caller's parser;
        # stop tokens never reach the text either way
        skip_special = not self.tools
        try:
            start = time.monotonic()
            gen, reused = await self.engine.run(self._start, prompt, settings.but(max_new_tokens=limit))
            if trimmed:
                self._drop_plan()  # the trim happened here (no warm-up came between): the shadow was taken, or is stale
            tokens: list[int] = []
            pending: list[int] = []
            while not gen.done:
                committed = await self.engine.run(gen.step)
                for token in committed:
                    if token in self.engine.stop_ids:
                        continue
                    tokens.append(token)
                    pending.append(token)
                    full = self.engine.tokenizer.decode(tokens, skip_special_tokens=skip_special)
                    if full.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for the next token
                        continue
                    piece, text = full[len(text) :], full
                    self._pending_reply = text if not commit else ""
                    streamed = True
                    yield Emission(piece, pending, gen.records[-1].t)
                    pending = []
            streamed = True  # a complete reply, even an empty one, is a turn that happened
            self.last_stats = gen.stats(settings.mode, start, len(prompt) - reused)
            log.info(self.last_stats.log_line(), extra={"llm_stats": self.last_stats.to_dict()})
        finally:
            # normal end, cancellation (barge-in) or a failure after streaming: history keeps what was streamed;
            # nothing streamed yet (cancelled or failed during the prefill): the turn never happened
            if streamed:
                self.trims += trimmed
            if commit and streamed:
                self.messages.append({"role": "assistant", "content": text})
                self._note_exchange(None if trimmed else before_len)
            elif commit:
                self.messages[:] = self._before_turn or []
                self._before_turn = None
            self._busy = False

    def _prepare(self, new: list[dict[str, Any]]) -> tuple[int, tuple[list[dict[str, Any]], list[int]]]:
        """The prompt's length now, and the messages (with ``new``) to keep with their prompt."""
        return len(self.prompt_ids()), self._trim(self.messages + new, self.history_tokens, 1)

    def commit(self, heard_text: str) -> None:
        before = self._pending_before
        super().commit(heard_text)
        self._note_exchange(before)  # what was heard may be less than the reply: a fine estimate all the same
        self._pending_reply = ""

    def _note_exchange(self, before_len: int | None) -> None:
        if before_len is not None:
            self._exchange_tokens = (self._exchange_tokens + [len(self.prompt_ids()) - before_len])[-4:]

    async def warm(self, user_start: str = "", yield_to: Callable[[], Awaitable[None]] | None = None) -> int:
        """Prefill both caches with what every next prompt starts with (system prompt and history, up to the
        next user message), so the next turn's time to first token pays only for the user's words. If the next
        turn would cross the history budget, trim now (see the module docstring), so the prefill after the trim
        happens here, while nobody waits. Between a reply's end and its commit, the history before that exchange
        is what gets trimmed and prefilled. Runs in chunks and stops when a reply starts. Returns the number of
        tokens now cached. Safe to skip: it only moves work earlier. ``user_start``: the words of the next user
        message already known (committed while the user still speaks): the open user turn is prefilled up to
        them, so the reply after the end of the turn prefills only the rest. ``yield_to``: awaited before each
        chunk (WARM_CHUNK tokens), so more urgent work (the listener deciding the end of a turn) has the CPU."""
        if self._busy:
            return 0
        pending = self._pending is not None
        messages = list(self._pending if self._pending is not None else self.messages)
        plan = await self.engine.run(self._plan_warm, messages, self._pending_new if pending else 0, user_start)
        now = self._pending if self._pending is not None else self.messages
        if self._busy or (self._pending is not None) != pending or now != messages:
            return 0  # a reply started, or the history changed, while the plan was made: it is stale
        kept, prefix, cut = plan
        trimmed = len(kept) < len(messages)
        if trimmed:
            now[:] = kept
            self.trims += 1
            self._pending_before = None  # the exchange's size can no longer be read from the prompt's
        elif cut is not None and not any(m is self._cut_at for m in kept):
            self._drop_plan()
            self._cut_at, self._cut_prefix = cut
        if len(prefix) < 2:
            return 0
        chunk = min(self.engine.settings.prefill_chunk or len(prefix), WARM_CHUNK)

        async def step(work: Callable[..., bool], *args: Any) -> bool:
            if yield_to is not None:
                await yield_to()
            return await self.engine.run(work, *args)

        while await step(self._prefill_chunk, prefix, chunk):
            pass
        if trimmed:
            self._drop_plan()  # its caches were taken by the prefill (or were of no use)
        cached = len(prefix) if common_prefix(self._target.ids, prefix) == len(prefix) else 0
        while await step(self._prefill_shadow_chunk, chunk):
            pass
        return cached

    def _plan_warm(
        self, messages: list[dict[str, Any]], current: int, user_start: str
    ) -> tuple[list[dict[str, Any]], list[int], tuple[dict[str, Any], list[int]] | None]:
        """warm's plan (on the engine's thread: tokenizing a long history takes a while): the messages to keep,
        trimmed with a margin for the exchanges still to come (``current`` of them are the uncommitted user
        message, whose reply also comes); the prompt prefix every next turn starts with; and, within
        PLAN_AHEAD exchanges of the budget, the next trim's cut (its first kept message and kept prefix)."""
        margin = max(self._exchange_tokens, default=64)
        limit = self.history_tokens - margin * (2 if current else 1)
        kept = messages
        if len(messages) - current > 2:
            kept, _ = self._trim(messages, limit, current + 2)
        history = kept[: len(kept) - current]
        prefix = self._open_prefix(history, user_start)
        cut = None
        first = 1 if history and history[0]["role"] == "system" else 0
        if len(prefix) + PLAN_AHEAD * margin > limit and len(history) - first > 2:
            # a trim when the prompt reaches the limit drops (limit - low) tokens of the oldest exchanges
            goal = len(prefix) - (limit - int(self.history_tokens * self.trim_to))
            future, _ = self._drop_oldest(history, goal, 2)
            if len(future) < len(history):
                cut = (future[first], self._open_prefix(future, ""))
        return kept, prefix, cut

    def _open_prefix(self, history: list[dict[str, Any]], user_start: str) -> list[int]:
        """The prompt tokens every next turn after ``history`` starts with: up to the next user message's words
        (``user_start`` of them when they are known)."""
        one = self.prompt_ids(history + [{"role": "user", "content": f"{user_start} a".lstrip()}])
        two = self.prompt_ids(history + [{"role": "user", "content": f"{user_start} b c".lstrip()}])
        return one[: common_prefix(one, two)]

    def _prefill_chunk(self, prefix: list[int], chunk: int) -> bool:
        """One chunk of warm's prefill (target first, then the draft); False when done or a reply started."""
        if self._busy:
            return False
        self._take_shadow(prefix)
        return self._feed((self._target, self._draft), prefix, chunk)

    def _prefill_shadow_chunk(self, chunk: int) -> bool:
        """One chunk of the planned trim's prefill into the shadow caches; False when done or a reply started."""
        if self._busy or not self._cut_prefix:
            return False
        if self._shadow is None:
            self._shadow = self.engine.new_caches()
        return self._feed(self._shadow, self._cut_prefix, chunk)

    def _feed(self, caches: tuple[CachedLM, CachedLM | None], ids: list[int], chunk: int) -> bool:
        """Up to ``chunk`` more of ``ids`` into the first of ``caches`` (target, draft) that lacks them; False
        when both hold them all."""
        for lm in caches:
            if lm is not None and (have := common_prefix(lm.ids, ids)) < len(ids):
                fed = lm.prefill(ids, have + chunk)
                self.warm_tokens += fed if lm is caches[0] else 0
                return True
        return False

    def _take_shadow(self, ids: list[int]) -> None:
        """After a trim, the shadow caches share more of the prompt than the live ones: use them."""
        shadow = self._shadow
        if shadow is not None and common_prefix(shadow[0].ids, ids) > common_prefix(self._target.ids, ids):
            (self._target, self._draft), self._shadow = shadow, None

    def _drop_plan(self) -> None:
        self._cut_at, self._cut_prefix, self._shadow = None, [], None

    def _start(self, prompt: list[int], settings: DecodeSettings) -> tuple[Generation, int]:
        self._take_shadow(prompt)
        reused = self._target.keep_prefix_of(prompt)
        if self._draft is not None:
            self._draft.keep_prefix_of(prompt)
        constraint, self.constraint = self.constraint, None  # for this reply only
        return self.engine.generation(prompt, settings, self._target, self._draft, constraint), reused

    def trim_last_reply(self, spoken_text: str) -> None:
        """Barge-in: the last assistant message becomes what the user heard, and the caches drop the rest.

        spoken_text must be a prefix of the reply, either exactly or word by word (whitespace may differ, as
        when the speaker rebuilt it from words). The caches are cropped now if the engine is idle, otherwise at
        the start of the next turn (a step still running for this conversation finishes first).
        """
        super().trim_last_reply(spoken_text)
        if self.engine.lock.acquire(blocking=False):
            try:
                keep = self.prompt_ids()
                self._target.keep_prefix_of(keep)
                if self._draft is not None:
                    self._draft.keep_prefix_of(keep)
            finally:
                self.engine.lock.release()
