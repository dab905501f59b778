"""Work a session does before anyone waits for it: the LLM caches filled while the user speaks or nobody talks,
and a reply started on the pause transcript before the end of the turn is decided.

Both only move work earlier. A prefill is safe to skip; an early reply is held until a turn adopts it and
dropped without a trace otherwise (voice/dialog/early_reply.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from voice.config import DialogConfig
from voice.dialog.context import TurnContext
from voice.dialog.early_reply import EarlyReply
from voice.tasks import Job, cancel_and_wait

Spawn = Callable[[Job], "asyncio.Task[object] | None"]  # the assistant's background tasks (Host.spawn)
YieldTo = Callable[[], Awaitable[None]]  # awaited before each prefill chunk: the listener's pause decision first


class WorkAhead:
    """The prefill and the early reply of one session. ``yield_to`` gives the listener the CPU while it decides a
    pause; ``spawn`` runs the background prefills."""

    def __init__(self, ctx: TurnContext, dialog: DialogConfig, spawn: Spawn, yield_to: YieldTo) -> None:
        self.ctx = ctx
        self.dialog = dialog
        self._spawn = spawn
        self._yield_to = yield_to
        self._warm: asyncio.Task[object] | None = None
        self._rewarm = False
        self._closed = False
        self._early: EarlyReply | None = None
        self.early_replies = {"started": 0, "adopted": 0}  # the rest were dropped; for benchmarks and tests

    # ---- the caches ------------------------------------------------------------------------------------------

    def prefill_heard(self, heard: str, replying: bool) -> None:
        """The words heard so far go into the LLM caches now, right after the Whisper pass that heard them, so the
        reply at the end of the turn prefills only what changed since: the caches keep the prompt's common
        prefix, and a word the next pass hears otherwise costs only the tokens from it on. One prefill at a
        time, none while a reply runs; it yields to a reply at its next chunk."""
        if not self.dialog.prefill_during_speech or not heard or replying or self._early is not None or self._warming:
            return
        self._warm = self._spawn(self.ctx.conversation.warm(heard, self._yield_to))

    def warm_idle(self) -> None:
        """Prefill (and trim ahead) while nobody waits: at the start, when a reply's last token is out and when a
        turn has committed. A call while a warm-up runs asks for one more pass after it (the history changed)."""
        self._rewarm = True
        if not self._closed and not self._warming:
            self._warm = self._spawn(self._warm_passes())

    async def warmed(self) -> None:
        """Until the background prefill is done (benchmarks and tests: how long the idle work takes)."""
        while self._warm is not None and not self._warm.done():
            await asyncio.shield(self._warm)

    @property
    def _warming(self) -> bool:
        return self._warm is not None and not self._warm.done()

    async def _warm_passes(self) -> None:
        while self._rewarm and not self._closed:
            self._rewarm = False
            await self.ctx.conversation.warm(yield_to=self._yield_to)

    # ---- the early reply -------------------------------------------------------------------------------------

    def start_reply(self, text: str, replying: bool) -> None:
        """The user paused and the transcript covers all their speech: start the reply now, while the end of the
        turn is still being decided. Its tokens are held, not spoken, until the turn confirms the same words;
        if the user goes on, or the final transcript differs, it is dropped and the history never sees it."""
        if not self.dialog.early_reply or not text.strip() or replying or self._early is not None:
            return
        self._early = EarlyReply(self.ctx, text, on_adopt=self._count_adopted)
        self.early_replies["started"] += 1

    @property
    def reply(self) -> EarlyReply | None:
        """The reply started on the pause transcript and not yet taken or dropped, if any."""
        return self._early

    def take_reply(self) -> EarlyReply | None:
        """The early reply, for the turn that answers this utterance (it adopts it or drops it)."""
        early, self._early = self._early, None
        return early

    async def drop_reply(self) -> None:
        if (early := self.take_reply()) is not None:
            await early.discard()

    def _count_adopted(self) -> None:
        self.early_replies["adopted"] += 1

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait(self._warm)
        await self.drop_reply()
