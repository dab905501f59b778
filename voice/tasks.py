"""Every task of the voice package starts here and stops one way: cancel, then wait until it has really ended.

``start`` runs one coroutine whose task the caller keeps and awaits (a turn, a reader beside its writer);
``Tasks.spawn`` runs fire-and-forget work that a long-lived piece (a session's assistant, a transport, the MQTT
bridge) keeps in a set, so none is lost to the garbage collector mid-flight. Either is stopped by
``cancel_and_wait`` (one task) or ``Tasks.stop`` (the whole set). tests/test_architecture.py keeps it so: no
``create_task``/``ensure_future`` and no hand-written cancel-then-gather anywhere else in voice/.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

Job = Coroutine[Any, Any, object]  # what a background task runs: a coroutine, whatever it returns


def start(work: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
    """Run ``work`` in a task of the running loop; the caller keeps the task, awaits it (or waits on it beside
    others) and stops it with ``cancel_and_wait``."""
    return asyncio.get_running_loop().create_task(work, name=name)


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` and wait until all have ended (their ``finally`` blocks ran); their outcome is not
    raised. None entries (a task never started) are skipped."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


class Tasks:
    """A set of fire-and-forget tasks that are kept alive until done and can all be stopped at once."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, job: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T] | None:
        """Run ``job`` in the background; None (and the coroutine closed) when no event loop is running."""
        try:
            task = asyncio.get_running_loop().create_task(job, name=name)
        except RuntimeError:
            job.close()
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        """Cancel every task and wait until all have ended."""
        await cancel_and_wait(*self._tasks)
