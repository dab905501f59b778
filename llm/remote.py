"""The LLM on another machine: any OpenAI-compatible chat-completions server, streamed into the same voice loop.

vLLM, SGLang, llama.cpp's server, Ollama and ``transformers serve`` all stream ``/v1/chat/completions``; vLLM and
SGLang also run speculative decoding on the GPU. We do not schedule anything ourselves: each reply is one
streaming request, and the server batches many front-ends. What this module keeps for the voice loop:

- ``RemoteConversation`` has the local ``Conversation``'s interface (``reply(commit=False)`` -> ``commit(heard)``
  / ``discard()``, ``trim_last_reply``, ``messages``, ``last_stats``), so Session and Turn do not know which one
  they hold. The history is ours (the server is stateless): every request sends it, trimmed to what the user
  heard and to ``history_tokens`` (counted with a local tokenizer when there is one, else estimated).
- Tokens are yielded the moment their chunk arrives, stamped with the arrival time (the latency trace's
  ``llm_first_token`` and the per-token ``token_times``).
- Cancelling the consuming task (a barge-in) closes the HTTP response at once: the server sees the connection
  go and stops generating (vLLM aborts the request; transformers serve cancels its generate loop).
- Failures before the first token are retried (connection refused, 429, 5xx) within one deadline,
  ``first_token_timeout_s``; after the first token nothing is retried (the user has heard part of the reply).
  Every failure is a ``RemoteLLMError`` whose ``kind`` says what happened and whose ``spoken`` sentence the turn
  says aloud; the conversation stays usable and the next turn simply tries again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from openai import (
    APIConnectionError,
    APIError,
    APIStatusError,
    AsyncOpenAI,
    AsyncStream,
    InternalServerError,
    RateLimitError,
    Timeout,
)

from llm.engine import DecodeSettings, DecodeStats, Emission
from llm.history import ChatHistory
from llm.remote_errors import RemoteLLMError, refused, retry_delay, unavailable
from llm.remote_metrics import SpecScraper, default_metrics_url
from llm.settings import HISTORY_TOKENS, RemoteSettings

log = logging.getLogger("specvoice.llm.remote")

CHARS_PER_TOKEN = 4.0  # history estimate without a tokenizer: English text in a BPE vocabulary of 32k-150k
MESSAGE_OVERHEAD = 4  # tokens a chat template adds around each message (role markers, separators)


@dataclass
class RemoteStats(DecodeStats):
    """One remote reply's numbers. Drafting happens on the server: ``server_spec`` holds its counters when it
    reports them (vLLM), else ``{"reported": False, ...}``; our own drafted/accepted stay 0."""

    backend: str = "openai"
    server_model: str = ""
    attempts: int = 0
    finish_reason: str | None = None
    server_spec: dict | None = None

    def log_line(self) -> str:
        spec = self.server_spec or {}
        served = (
            f"server acceptance {spec.get('window_acceptance')}"
            if spec.get("reported")
            else "server speculation: not reported"
        )
        return (
            f"llm remote {self.server_model}: {self.new_tokens} tokens in {self.total_s:.2f}s "
            f"({self.tokens_per_s:.2f} tok/s), ttft {self.ttft_s * 1000:.0f} ms, {self.attempts} attempt(s), "
            f"prompt {self.prompt_tokens} tokens, {served}"
        )


class RemoteEngine:
    """The server and how to reach it; ``conversation()`` like the local ``Engine``. ``concurrent``: the server
    batches sessions itself, so the assistant must not queue whole generations behind each other."""

    concurrent = True

    def __init__(self, remote: RemoteSettings, tokenizer: Any = None, settings: DecodeSettings | None = None) -> None:
        self.remote = remote
        self.tokenizer = tokenizer  # optional: exact history token counts, and prompt_ids()
        self.settings = settings or DecodeSettings(mode="target")
        metrics = remote.metrics_url if remote.metrics_url is not None else default_metrics_url(remote.base_url)
        self.spec = SpecScraper(metrics)
        self._model = remote.model
        self._client: tuple[asyncio.AbstractEventLoop, AsyncOpenAI] | None = None
        self._ids = itertools.count(1)

    def conversation(self, system_prompt: str, history_tokens: int = HISTORY_TOKENS) -> RemoteConversation:
        return RemoteConversation(self, system_prompt, history_tokens)

    def client(self) -> AsyncOpenAI:
        """The SDK client of the running event loop (its connection pool belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client[0] is not loop:
            r = self.remote
            timeout = Timeout(r.first_token_timeout_s, connect=r.connect_timeout_s)
            self._client = (
                loop,
                AsyncOpenAI(base_url=r.base_url, api_key=r.api_key or "unused", max_retries=0, timeout=timeout),
            )
        return self._client[1]

    async def model_name(self) -> str:
        """``remote.model``, else the first model the server lists (asked once)."""
        if self._model is None:
            listed = [m.id for m in (await self.client().models.list()).data]
            if not listed:
                raise RemoteLLMError(
                    "refused",
                    f"the LLM server at {self.remote.base_url} lists no model; fix: "
                    "load one there, or set llm.remote_model",
                )
            self._model = listed[0]
        return self._model

    async def open(
        self, messages: list[dict], settings: DecodeSettings, stats: RemoteStats
    ) -> tuple[AsyncStream[Any], str, float]:
        """Send the request and wait for the first token, retrying what may be retried before it; returns the
        open stream, the first token's text ("" when the reply is empty) and its arrival time."""
        r = self.remote
        loop = asyncio.get_running_loop()
        last: BaseException | None = None
        try:
            async with asyncio.timeout_at(loop.time() + r.first_token_timeout_s):
                for attempt in range(r.retries + 1):
                    stats.attempts = attempt + 1
                    stream = None
                    try:
                        stream = await self._request(messages, settings)
                        while (chunk := await anext(stream, None)) is not None:
                            text = _record(chunk, stats)
                            if text:
                                return stream, text, time.monotonic()
                        return stream, "", time.monotonic()
                    except (APIConnectionError, RateLimitError, InternalServerError) as exc:
                        last = exc
                        if stream is not None:
                            await stream.close()
                        if attempt < r.retries:
                            await asyncio.sleep(retry_delay(exc, attempt))
                    except BaseException:
                        if stream is not None:
                            await stream.close()
                        raise
        except TimeoutError:
            if last is None:
                raise RemoteLLMError(
                    "slow",
                    f"no first token from the LLM server at {r.base_url} within "
                    f"{r.first_token_timeout_s:g} s (llm.first_token_timeout_s); fix: a less loaded "
                    "server, or raise llm.first_token_timeout_s",
                ) from None
        except APIStatusError as exc:
            raise refused(exc, r.base_url) from None
        assert last is not None
        raise unavailable(last, r.base_url, stats.attempts) from None

    async def _request(self, messages: list[dict], settings: DecodeSettings) -> AsyncStream[Any]:
        params: dict[str, Any] = {
            "model": await self.model_name(),
            "messages": _alternating(messages),
            "stream": True,
            "max_tokens": settings.max_new_tokens,
            "temperature": settings.temperature,
            "stream_options": {"include_usage": True},  # token counts in the last chunk (vLLM needs asking)
            "extra_headers": {"X-Request-ID": f"specvoice-{uuid.uuid4().hex[:12]}-{next(self._ids)}"},
        }
        if settings.top_p < 1:
            params["top_p"] = settings.top_p
        if settings.seed is not None:
            params["seed"] = settings.seed
        if settings.top_k:
            params["extra_body"] = {"top_k": settings.top_k}  # vLLM, SGLang, llama.cpp and Ollama read it
        return await self.client().chat.completions.create(**params)


class RemoteConversation(ChatHistory):
    """One chat whose history lives here and whose replies come from the server (no KV cache of ours)."""

    def __init__(self, engine: RemoteEngine, system_prompt: str, history_tokens: int = HISTORY_TOKENS) -> None:
        super().__init__(system_prompt)
        self.engine = engine
        self.history_tokens = history_tokens
        self.last_stats: RemoteStats | None = None
        self.closed_t: float | None = None  # when the latest reply's HTTP response was closed (benchmarks)

    # ---- history ---------------------------------------------------------------------------------------------

    def prompt_ids(self, messages: list[dict] | None = None) -> list[int]:
        """The prompt the server's chat template would build, with the local tokenizer (llm.tokenizer)."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise RuntimeError("no local tokenizer for the remote model; fix: set llm.tokenizer to its tokenizer")
        ids = tokenizer.apply_chat_template(
            messages if messages is not None else self.messages, add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def count_tokens(self, messages: list[dict]) -> int:
        """Exact with a local tokenizer; else ~4 characters a token plus a few per message (documented in the
        README): good to ~20% for English, which is what a history budget needs."""
        if self.engine.tokenizer is not None:
            return len(self.prompt_ids(messages))
        return sum(MESSAGE_OVERHEAD + math.ceil(len(m["content"]) / CHARS_PER_TOKEN) for m in messages)

    def _fit_history(self, messages: list[dict]) -> list[dict]:
        """Drop the oldest exchanges (never the system prompt or the newest user turn) beyond history_tokens."""
        messages = list(messages)
        first = 1 if messages and messages[0]["role"] == "system" else 0
        while self.count_tokens(messages) > self.history_tokens and len(messages) - first > 1:
            del messages[first : first + (2 if len(messages) - first > 2 else 1)]
        return messages

    async def warm(self, user_start: str = "", yield_to: Callable[[], Awaitable[None]] | None = None) -> int:
        """Nothing to prefill here: the server keeps its own prefix cache (vLLM: --enable-prefix-caching)."""
        return 0

    # ---- replies ---------------------------------------------------------------------------------------------

    async def reply(
        self, user_text: str | None, settings: DecodeSettings | None = None, *, commit: bool = True
    ) -> AsyncIterator[Emission]:
        """Stream the reply to ``user_text`` as the server sends it; same contract as the local
        ``Conversation.reply``, None included: the reply to the history as it is (a websocket client's
        ``conversation.item.create`` + ``response.create`` put the user's words there already). ``Emission.token_ids``
        is empty: the server sends text, not ids."""
        settings = settings or self.engine.settings
        if user_text is not None and not user_text.strip():
            raise ValueError("empty user text: there is nothing to reply to; fix: send some words")
        if user_text is None and not self.messages:
            raise ValueError("no history and no user text: there is nothing to reply to; fix: send some words")
        if self._busy:
            raise RuntimeError("this conversation is already streaming a reply; fix: finish or cancel it first")
        if settings.max_new_tokens == 0:
            return
        new = [{"role": "user", "content": user_text}] if user_text is not None else []
        kept = self._fit_history(self.messages + new)
        self._busy, self._pending = True, kept
        if commit:
            self._before_turn = list(self.messages)
            self.messages[:] = kept
        start = time.monotonic()
        stats = RemoteStats(mode="remote", prompt_tokens=self.count_tokens(kept))
        text, stream, done, failed = "", None, False, False
        try:
            stream, first, t = await self.engine.open(kept, settings, stats)
            stats.server_model = self.engine._model or ""
            piece: str | None = first
            while piece is not None:
                if piece:
                    stats.token_times.append(t)
                    text += piece
                    yield Emission(piece, [], t)
                piece, t = await _next_piece(stream, stats, self.engine.remote, len(stats.token_times))
            done = True
        except Exception:
            failed = True
            raise
        finally:
            if stream is not None:
                await stream.close()  # a barge-in lands here: the server sees the connection close
            self.closed_t = time.monotonic()
            if failed and not text:  # the server gave nothing: the turn did not happen, the next one starts clean
                self._pending = None
                if commit:
                    self.messages[:] = self._before_turn or self.messages
            elif commit:
                self.messages.append({"role": "assistant", "content": text})
                self._pending = None
            self._busy = False
            self.last_stats = _finish(stats, start)
        if done:  # after the last token: the reply never waits for the counters
            stats.server_spec = await self.engine.spec.read(self.engine.client())
            log.info(stats.log_line(), extra={"llm_stats": stats.to_dict()})


async def _next_piece(
    stream: AsyncStream[Any], stats: RemoteStats, remote: RemoteSettings, received: int
) -> tuple[str | None, float]:
    """The next chunk's text ("" for a chunk without any) and arrival time; None at the end of the stream."""
    try:
        chunk = await anext(stream, None)
    except APIError as exc:  # the server died, the network dropped, or a token gap passed the read timeout
        raise RemoteLLMError(
            "dropped",
            f"the LLM server at {remote.base_url} broke off the reply after {received} "
            f"tokens ({type(exc).__name__}: {exc}); the next turn tries again",
        ) from None
    if chunk is None:
        return None, time.monotonic()
    return _record(chunk, stats), time.monotonic()


def _record(chunk: Any, stats: RemoteStats) -> str:
    """Note a chunk's usage and finish reason; return its text."""
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        stats.prompt_tokens = usage.prompt_tokens or stats.prompt_tokens
        stats.new_tokens = usage.completion_tokens or 0
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) or 0
        stats.prefill_tokens = stats.prompt_tokens - cached  # what the server had to prefill (prefix cache)
    if not chunk.choices:
        return ""
    choice = chunk.choices[0]
    stats.finish_reason = choice.finish_reason or stats.finish_reason
    return choice.delta.content or "" if choice.delta is not None else ""


def _finish(stats: RemoteStats, start: float) -> RemoteStats:
    times = stats.token_times
    stats.new_tokens = stats.new_tokens or len(times)  # the server's count when it sent one (usage)
    stats.ttft_s = times[0] - start if times else 0.0
    stats.total_s = (times[-1] if times else time.monotonic()) - start
    stats.tokens_per_s = stats.new_tokens / stats.total_s if times and stats.total_s > 0 else 0.0
    return stats


def _alternating(messages: list[dict]) -> list[dict]:
    """Consecutive user messages joined into one: a turn cancelled before any word of the reply was heard leaves
    its question without an answer, and many servers' chat templates refuse two user turns in a row."""
    out: list[dict] = []
    for m in messages:
        if out and m["role"] == "user" and out[-1]["role"] == "user":
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{m['content']}"}
        else:
            out.append(dict(m))
    return out
