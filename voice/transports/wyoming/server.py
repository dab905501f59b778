"""The Wyoming TCP listener: where Home Assistant connects; each connection is a ``WyomingHandler``.

Zeroconf (``wyoming.zeroconf = true``) announces it on the LAN as Home Assistant expects; that needs the
``zeroconf`` package and a LAN bind with ``wyoming.allowed_clients`` (Wyoming itself has no authentication).
"""

from __future__ import annotations

import asyncio
from typing import Any

from wyoming.server import AsyncTcpServer

from voice.config import ConfigError
from voice.transports.common import Shared, is_loopback
from voice.transports.wyoming.handler import Gate, WyomingHandler


class WyomingServer:
    """The TCP listener (wyoming.server.AsyncTcpServer) plus what its handlers share."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.config = shared.config
        self.gate = Gate(shared)
        self._tcp: AsyncTcpServer | None = None
        self._zeroconf: Any = None

    @property
    def port(self) -> int:
        assert self._tcp is not None and self._tcp._server is not None
        return int(self._tcp._server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]  # an asyncio.Server

    async def start(self) -> None:
        w = self.config.wyoming
        self._tcp = AsyncTcpServer(w.host, w.port)
        await self._tcp.start(lambda reader, writer: WyomingHandler(reader, writer, self.gate))
        if w.zeroconf:
            await self._announce()

    async def _announce(self) -> None:
        host = self.config.wyoming.host
        if is_loopback(host):
            raise ConfigError(
                "wyoming.zeroconf = true announces the server on the network, but wyoming.host is "
                f"{host!r}; fix: bind wyoming.host to the LAN address (and set allowed_clients)"
            )
        try:
            from wyoming.zeroconf import HomeAssistantZeroconf
        except ImportError:
            raise ConfigError("wyoming.zeroconf = true needs the zeroconf package; fix: pip install zeroconf") from None
        self._zeroconf = HomeAssistantZeroconf(
            port=self.port, name="specvoice", host=None if host in ("0.0.0.0", "::") else host
        )
        await self._zeroconf.register_server()

    async def stop(self, grace: float) -> None:
        """Stop listening, let requests in progress finish for up to ``grace`` s, then close every connection."""
        if self._tcp is None:
            return
        if self._tcp._server is not None:
            self._tcp._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(h.busy for h in self.gate.handlers) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await self._tcp.stop()
        await self.gate.close()  # the conversations kept across connections
        if self._zeroconf is not None:
            await self._zeroconf._aiozc.async_close()
        self._tcp = None
