"""Test helper: `specvoice serve` run in the test's own process, on an already loaded Assistant."""

from __future__ import annotations

import asyncio
import contextlib

from openai import AsyncOpenAI

from voice.server import serve


def sdk(url: str, token: str = "unused") -> AsyncOpenAI:
    """The OpenAI SDK pointed at our websocket endpoint (``ws://host:port/v1``)."""
    return AsyncOpenAI(api_key=token, websocket_base_url=url, base_url=url.replace("ws://", "http://"))


@contextlib.asynccontextmanager
async def serving(config, assistant):
    """Start serve(), wait until it is ready (or raise its startup error), stop it by cancelling on exit."""
    ready = asyncio.Event()
    task = asyncio.create_task(serve(config, ready=ready, assistant=assistant))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # raises the startup error
    assert ready.is_set(), "server did not start within 30 s"
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, waiter, return_exceptions=True)
