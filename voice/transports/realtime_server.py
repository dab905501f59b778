"""The websocket listener: handshake checks (path, token, session slots), HTTP routes, one connection each.

The same port answers ``/metrics`` (Prometheus) and the Realtime API at ``/v1/realtime`` (also ``/realtime``).
Localhost by default; any other bind needs ``server.token`` (checked in ``voice.server``), sent as
``Authorization: Bearer <token>`` (the openai SDK's api key) or ``?token=``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from voice.metrics import CONTENT_TYPE
from voice.transports.common import Shared
from voice.transports.realtime import CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TRY_AGAIN, RealtimeConnection

log = logging.getLogger("specvoice.realtime")

PATHS = ("/v1/realtime", "/realtime")
METRICS_PATH = "/metrics"


class RealtimeServer:
    """The websocket API's listener; every accepted connection is a RealtimeConnection with its own session."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.config = shared.config
        self.connections: set[RealtimeConnection] = set()
        self._server: Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        s = self.config.server
        self._server = await serve(self._handle, s.host, s.port, max_size=s.max_message_bytes,
                                   process_request=self._process_request, ping_interval=20, ping_timeout=20,
                                   close_timeout=3)

    def _authorized(self, request: Request) -> bool:
        token = self.config.server.token
        if token is None:
            return True
        header = request.headers.get("Authorization", "")
        offered = header[7:] if header.lower().startswith("bearer ") else None
        if offered is None:
            offered = (parse_qs(urlsplit(request.path).query).get("token") or [None])[0]
        return offered is not None and hmac.compare_digest(offered.encode(), token.encode())

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == METRICS_PATH:
            if not self._authorized(request):
                return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong token; send "
                                          "'Authorization: Bearer <server.token>'\n")
            response = connection.respond(HTTPStatus.OK, self.shared.metrics.render().decode())
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = CONTENT_TYPE
            return response
        if path not in PATHS:
            return connection.respond(HTTPStatus.NOT_FOUND, f"no such path {path!r}; the websocket API is at "
                                      f"{PATHS[0]} and metrics at {METRICS_PATH}\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        metrics, slots = self.shared.metrics, self.shared.slots
        assert ws.request is not None
        if not self._authorized(ws.request):
            metrics.rejected.labels("websocket", "token").inc()
            await ws.close(CLOSE_POLICY, "missing or wrong token: send 'Authorization: Bearer <token>' or "
                                         "?token=<token>")
            return
        if not slots.acquire():
            metrics.rejected.labels("websocket", "sessions").inc()
            await ws.close(CLOSE_TRY_AGAIN, f"server busy: {slots.limit} sessions open (server.max_sessions); "
                                            "try again later")
            return
        try:
            conn = RealtimeConnection(ws, self.shared)
            self.connections.add(conn)
            metrics.session_opened("websocket")
            log.info("websocket session", extra={"session": conn.id, "peer": str(ws.remote_address)})
            try:
                await conn.run()
            finally:
                self.connections.discard(conn)
                metrics.session_closed("websocket")
        finally:
            slots.release()

    async def stop(self, grace: float) -> None:
        """Stop listening, let turns finish for up to ``grace`` s, close every connection with 1001."""
        if self._server is None:
            return
        self._server.close(close_connections=False)
        await asyncio.gather(*(c.finish(grace) for c in list(self.connections)), return_exceptions=True)
        self._server.close(close_connections=True)
        await self._server.wait_closed()
        self._server = None


__all__ = ["RealtimeServer", "PATHS", "METRICS_PATH", "CLOSE_GOING_AWAY"]
