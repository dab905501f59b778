"""``specvoice serve``: run ``voice.server.serve`` until SIGTERM or SIGINT, then shut down gracefully."""

from __future__ import annotations

import argparse
import asyncio
import signal

from voice.config import Config
from voice.server import serve


async def _run(config: Config) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(config, stop=stop)
    return 0


def main(config: Config, args: argparse.Namespace, extra: list[str]) -> int:
    return asyncio.run(_run(config))
