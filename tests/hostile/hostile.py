"""Helpers for the hostile-input suite: server configs on free ports, ``serve()`` in a thread of its own (so
hypothesis tests can be plain synchronous functions with blocking sockets), and a log handler that keeps every
record with a traceback."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from voice.assistant import Assistant
from voice.server import serve

from broker import free_port


def server_config(assistant: Assistant, **limits: Any) -> Any:
    """The assistant's config on free loopback ports; ``limits`` as section__key=value."""
    config = assistant.config.model_copy(deep=True)
    config.server.port = free_port()
    config.wyoming.port = free_port()
    config.server.shutdown_grace_s = 0.0
    for key, value in limits.items():
        section, name = key.split("__")
        setattr(getattr(config, section), name, value)
    return config


class ServerThread:
    """``serve()`` on an event loop in its own thread, until ``stop()``."""

    def __init__(self, config: Any, assistant: Assistant) -> None:
        self.config, self.assistant = config, assistant
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="serve", daemon=True)

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(60) or self.error is not None:
            raise RuntimeError(f"serve() did not start: {self.error!r}")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001  (reported to the test thread)
            self.error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve(self.config, ready=ready, assistant=self.assistant, stop=self._stop))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        self._ready.set()
        waiter.cancel()
        await task

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the server's loop and return its result (to read server state safely)."""

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        if self.error is not None:
            raise self.error


class Tracebacks(logging.Handler):
    """Every log record with a traceback, or an asyncio error (an exception nobody retrieved)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._seen: set[int] = set()  # a record reaches both our logger and the root when it propagates

    def emit(self, record: logging.LogRecord) -> None:
        if id(record) in self._seen:
            return
        if record.exc_info or (record.name == "asyncio" and record.levelno >= logging.ERROR):
            self._seen.add(id(record))
            self.records.append(record)

    def lines(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}\n{self.format(r)}" for r in self.records]
