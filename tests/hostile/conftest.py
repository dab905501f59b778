"""Fixtures of the hostile-input suite: the small real models loaded once, and a capture of every log record
that carries a traceback (a client must never be able to cause one). Helpers are in hostile.py."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from hostile import Tracebacks

from voice.assistant import Assistant


@pytest.fixture(scope="session")
def hostile_assistant(small_config):
    """The small models with short replies: hostile inputs that reach the LLM cost little."""
    config = small_config.model_copy(deep=True)
    config.llm.max_new_tokens = 8
    return Assistant.load_sync(config)


@pytest.fixture(scope="module")
def tracebacks() -> Iterator[Tracebacks]:
    handler = Tracebacks()
    loggers = [logging.getLogger(name) for name in ("specvoice", "asyncio", "websockets", "")]
    for logger in loggers:
        logger.addHandler(handler)
    hook = threading.excepthook

    def thread_died(args: threading.ExceptHookArgs) -> None:
        handler.records.append(
            logging.makeLogRecord(
                {"name": "thread", "msg": repr(args.exc_value), "exc_info": (args.exc_type, args.exc_value, None)}
            )
        )
        hook(args)

    threading.excepthook = thread_died
    yield handler
    threading.excepthook = hook
    for logger in loggers:
        logger.removeHandler(handler)
