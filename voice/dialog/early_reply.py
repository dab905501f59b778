"""A reply generated from the pause transcript before the end of the turn is decided (``EarlyReply``): held until
a turn adopts it, dropped without a trace otherwise."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from llm.settings import Emission
from voice.dialog.context import TurnContext, asked
from voice.tasks import cancel_and_wait, start

Pieces = AsyncGenerator["Emission | str", None]  # what a turn speaks: the LLM's emissions, or a fixed text


async def close_reply(stream: AsyncIterator[Emission]) -> None:
    """Stop a ``Chat.reply`` stream now, not when the garbage collector gets to it: until then the conversation
    is busy and its engine may still be stepping it. Every reply is an async generator (voice/ports.py)."""
    if isinstance(stream, AsyncGenerator):
        await stream.aclose()


class EarlyReply:
    """A reply generated from the pause transcript before the end of the turn is decided. Its emissions wait in
    a queue until a turn adopts it; until then nothing is spoken or sent, and a reply that is dropped leaves the
    conversation as if it never ran (it is never committed)."""

    def __init__(self, ctx: TurnContext, text: str, on_adopt: Callable[[], None] | None = None) -> None:
        self.ctx, self.text = ctx, text
        self.started = time.monotonic()  # how far ahead of the end of the turn it began: the eager end's gain
        self._on_adopt = on_adopt
        self._adopted = False
        self._queue: asyncio.Queue[Emission | Exception | None] = asyncio.Queue()  # ... then None at the end
        self._output = asyncio.Event()  # set at the first emission or the end (``first_output``)
        self._generated: list[str] = []  # the text of every emission so far (``generated``)
        self._task = start(self._generate(), name="early reply")

    @property
    def alive(self) -> bool:
        return not self._task.cancelled()

    async def _generate(self) -> None:
        ctx = self.ctx
        await ctx.generation_lock.acquire()
        try:
            stream = ctx.conversation.reply(asked(ctx, self.text, spoken=True), ctx.decode, commit=False)
            try:
                async for emission in stream:
                    self._queue.put_nowait(emission)
                    self._generated.append(emission.text)
                    self._output.set()
            finally:
                await close_reply(stream)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaces in the turn that adopts this reply
            self._queue.put_nowait(exc)
        finally:
            ctx.generation_lock.release()
            self._queue.put_nowait(None)
            self._output.set()

    async def first_output(self) -> None:
        """Until the reply has produced something or ended (a lockstep test holds the audio back until then)."""
        output = start(self._output.wait())
        await asyncio.wait({output, self._task}, return_when=asyncio.FIRST_COMPLETED)
        await cancel_and_wait(output)

    async def generated(self) -> str:
        """Until the whole reply is generated; its text so far (a lockstep test lets a guess run to its end)."""
        await asyncio.wait({self._task})
        return "".join(self._generated)

    async def discard(self) -> None:
        """Stop it and forget it: the history never sees it (the caches drop its tokens at the next turn)."""
        await cancel_and_wait(self._task)
        if not self._adopted and self.ctx.conversation.uncommitted:
            self.ctx.conversation.discard()

    def adopt(self) -> Pieces:
        """The reply is the turn's: what was generated so far, then the rest as it comes. Closing the stream
        early (barge-in) stops the generation; the turn then commits what was heard, like any reply."""
        self._adopted = True
        if self._on_adopt is not None:
            self._on_adopt()
        return self._pieces()

    async def _pieces(self) -> Pieces:
        try:
            while (item := await self._queue.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            await cancel_and_wait(self._task)
