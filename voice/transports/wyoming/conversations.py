"""Sessions for Wyoming requests: what a request collects from its session's events, and the conversations that
outlive a connection.

Home Assistant opens a new connection for every request and sends the conversation's id in the ``transcript``
event's context (``{"conversation_id": ...}``), so a history that lived only as long as its connection would
forget every turn. ``Conversations`` keeps one Session per conversation id for the whole server, bounded in count
(``wyoming.max_conversations``, least recently used out first) and in age (``wyoming.conversation_idle_s``
since its last turn). Turns of one conversation take turns (a lock), so two requests with the same id never
interrupt each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from voice.dialog.session import Session
from voice.events import ReplyTextDelta, TurnError
from voice.tasks import cancel_and_wait, start


@dataclass
class Collector:
    """What one request needs from its session's events: the reply text not yet sent, and any failure. Audio
    is not kept (it goes out through the sink), so nothing here grows beyond one reply's text."""

    pending: list[str] = field(default_factory=list)
    errors: list[TurnError] = field(default_factory=list)
    woken: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, event: Any) -> None:
        if isinstance(event, ReplyTextDelta) and event.text:
            self.pending.append(event.text)
            self.woken.set()
        elif isinstance(event, TurnError):
            self.errors.append(event)
            self.woken.set()

    def take_text(self) -> str:
        text, self.pending = "".join(self.pending), []
        return text

    def failure(self) -> str | None:
        """The first failure, as a sentence (None: the turn went through)."""
        if not self.errors:
            return None
        error = self.errors[0]
        return f"the {error.stage} stage failed: {error.message}"


class Routed:
    """A Session whose events go to whichever request is using it now (a Collector), or nowhere."""

    def __init__(self, make: Callable[[Callable[[Any], None]], Session]) -> None:
        self.collector: Collector | None = None
        self.session = make(self._route)
        self.used = 0.0  # when its last request ended (Conversations' clock)
        self.lock = asyncio.Lock()

    def _route(self, event: Any) -> None:
        if self.collector is not None:
            self.collector(event)

    async def run(
        self,
        work: Callable[[Session], Coroutine[Any, Any, Any]],
        on_text: Callable[[str], Awaitable[None]] | None = None,
    ) -> tuple[Any, str | None]:
        """Run ``work(session)`` (an ask or a say), handing reply text to ``on_text`` as it comes. Returns its
        result and the failure (None when it went through): a failed turn is never reported as a success."""
        collector = self.collector = Collector()
        task = start(work(self.session))
        try:
            while not task.done():
                woken = start(collector.woken.wait())
                await asyncio.wait({task, woken}, return_when=asyncio.FIRST_COMPLETED)
                await cancel_and_wait(woken)
                collector.woken.clear()
                if on_text is not None and (text := collector.take_text()):
                    await on_text(text)
            if on_text is not None and (text := collector.take_text()):
                await on_text(text)
        finally:
            await cancel_and_wait(task)
            self.collector = None
        if task.cancelled():
            return None, "the turn was cancelled"
        if task.exception() is not None:
            exc = task.exception()
            return None, f"{type(exc).__name__}: {exc}"
        return task.result(), collector.failure()


class ConversationsFull(Exception):
    """Every kept conversation is answering a request right now; none can make room."""


class Conversations:
    """conversation id -> Routed session, for one Wyoming server; see the module docstring."""

    def __init__(
        self,
        make: Callable[[Callable[[Any], None]], Session],
        limit: int,
        idle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make, self.limit, self.idle_s, self._clock = make, limit, idle_s, clock
        self._kept: OrderedDict[str, Routed] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, conversation_id: str) -> bool:
        return conversation_id in self._kept

    @contextlib.asynccontextmanager
    async def use(self, conversation_id: str) -> AsyncIterator[Routed]:
        """The conversation's session, held for one request (other requests with this id wait)."""
        await self.expire()
        routed = self._kept.pop(conversation_id, None)
        if routed is None:
            await self._make_room()  # no await between its last check and the insertion: the bound holds
            routed = Routed(self._make)
        self._kept[conversation_id] = routed  # most recently used last
        async with routed.lock:
            try:
                yield routed
            finally:
                routed.used = self._clock()

    async def expire(self) -> None:
        """Close the conversations idle for longer than ``idle_s``."""
        now = self._clock()
        for key in list(self._kept):
            routed = self._kept.get(key)  # another request may have taken or dropped it meanwhile
            if routed is not None and not routed.lock.locked() and now - routed.used > self.idle_s:
                await self._drop(key)

    async def _make_room(self) -> None:
        while len(self._kept) >= self.limit:
            idle = next((k for k, r in self._kept.items() if not r.lock.locked()), None)
            if idle is None:
                raise ConversationsFull(
                    f"all {self.limit} conversations are answering a request "
                    "(wyoming.max_conversations); try again in a moment"
                )
            await self._drop(idle)

    async def _drop(self, key: str) -> None:
        routed = self._kept.pop(key, None)
        if routed is not None:
            await routed.session.close()

    async def close(self) -> None:
        for key in list(self._kept):
            await self._drop(key)
