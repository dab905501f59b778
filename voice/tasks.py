"""Background tasks with one stopping rule: cancel, then wait until the task has really ended.

Every long-lived piece (sessions, transports, the MQTT bridge) keeps its background tasks in a ``Tasks`` set, so
none is lost to the garbage collector mid-flight and shutdown can stop them all the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` and wait until it has ended (its ``finally`` blocks ran); its outcome is not raised."""
    if task is None:
        return
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class Tasks:
    """A set of fire-and-forget tasks that are kept alive until done and can all be stopped at once."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any] | None:
        """Run ``coro`` in the background; None (and the coroutine closed) when no event loop is running."""
        try:
            task = asyncio.get_running_loop().create_task(coro, name=name)
        except RuntimeError:
            coro.close()
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        """Cancel every task and wait until all have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
