"""The websocket listener: handshake checks (path, origin, token, session slots), HTTP routes, one connection
each.

The same port answers the page at ``/``, ``/metrics`` (Prometheus) and the Realtime API at ``/v1/realtime`` (also
``/realtime``). Localhost by default; a wider bind, or home actions, need ``server.token`` (checked in
``voice.server``), sent as ``Authorization: Bearer <token>`` (the openai SDK's api key), as the subprotocol
``openai-insecure-api-key.<token>`` (browsers) or ``?token=``.

Browsers do not apply the same-origin rule to websockets: any page the user opens could connect to a server on
localhost and drive it. So a handshake that carries an ``Origin`` (every browser sends one; native clients do
not) must come from ``server.allowed_origins`` or from this server's own page, and is refused with HTTP 403
otherwise. "Own page" means the Origin names exactly the Host the request was sent to, and that host is an IP
address or ``localhost``: a DNS name could be pointed at this machine by the attacker (DNS rebinding), so names
must be listed.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from collections.abc import Sequence
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from voice.health import HEALTH_PATH, health_response
from voice.logs import ClientWarnings
from voice.metrics import CONTENT_TYPE
from voice.transports.common import Shared
from voice.transports.realtime import CLOSE_POLICY, CLOSE_TRY_AGAIN, RealtimeConnection
from voice.web import page_file

log = logging.getLogger("specvoice.realtime")

PATHS = ("/v1/realtime", "/realtime")
METRICS_PATH = "/metrics"
SUBPROTOCOL = "realtime"  # what a browser offers, and we select, for the Realtime API
KEY_SUBPROTOCOL = "openai-insecure-api-key."  # + the token: how a browser (no custom headers) sends it


# ---- the handshake: tokens, subprotocols, the page -----------------------------------------------------------


def offered_subprotocols(request: Request) -> list[str]:
    """The subprotocols a client offered (Sec-WebSocket-Protocol, comma-separated, possibly repeated)."""
    return [
        p.strip() for value in request.headers.get_all("Sec-WebSocket-Protocol") for p in value.split(",") if p.strip()
    ]


def offered_token(request: Request) -> str | None:
    """The client's token, from the first place that has one: ``Authorization: Bearer``, the subprotocol
    ``openai-insecure-api-key.<token>`` (the Realtime convention for browsers, which cannot set headers), or
    ``?token=``."""
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:]
    for protocol in offered_subprotocols(request):
        if protocol.startswith(KEY_SUBPROTOCOL):
            return protocol[len(KEY_SUBPROTOCOL) :]
    values = parse_qs(urlsplit(request.path).query).get("token")
    return values[0] if values else None


def select_subprotocol(connection: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """Select ``realtime`` when offered, else none. A browser fails a handshake that offered subprotocols and
    got none back; the key subprotocol is never echoed (it carries the token)."""
    return Subprotocol(SUBPROTOCOL) if SUBPROTOCOL in offered else None


def one_header(request: Request, name: str) -> str | None:
    """A header that must appear at most once: its value, None when absent, "" when repeated (never trusted)."""
    values = request.headers.get_all(name)
    return None if not values else values[0] if len(values) == 1 else ""


def origin_allowed(origin: str | None, host: str | None, allowed: Sequence[str]) -> bool:
    """May a handshake with this Origin header open the websocket? (See the module docstring.)"""
    if origin is None or origin in allowed:
        return True
    scheme, _, rest = origin.partition("://")
    if scheme not in ("http", "https") or not host or rest.lower() != host.lower():
        return False
    name = urlsplit(origin).hostname or ""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name == "localhost"
    return True


def page_response(request: Request) -> Response | None:
    """The browser page's files (``/``, ``/app.js``, ...) with their Content-Type and a same-origin CSP; None
    for any other path. The page holds no secret: the token is typed into it, never served."""
    page = page_file(urlsplit(request.path).path, request.headers.get("Host"))
    if page is None:
        return None
    headers = Headers(page.headers)
    headers["Content-Length"] = str(len(page.body))
    headers["Connection"] = "close"  # as websockets' own responses: one request per connection
    return Response(HTTPStatus.OK.value, HTTPStatus.OK.phrase, headers, page.body)


class RealtimeServer:
    """The websocket API's listener; every accepted connection is a RealtimeConnection with its own session."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.config = shared.config
        self.connections: set[RealtimeConnection] = set()
        self._refusals = ClientWarnings(log)  # a hostile page can retry in a loop: the journal sees a few
        self._server: Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(next(iter(self._server.sockets)).getsockname()[1])

    async def start(self) -> None:
        s = self.config.server
        self._server = await serve(
            self._handle,
            s.host,
            s.port,
            max_size=s.max_message_bytes,
            process_request=self._process_request,
            select_subprotocol=select_subprotocol,
            ping_interval=20,
            ping_timeout=20,
            close_timeout=3,
        )

    def _authorized(self, request: Request) -> bool:
        token = self.config.server.token
        if token is None:
            return True
        offered = offered_token(request)
        return offered is not None and hmac.compare_digest(offered.encode(), token.encode())

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == HEALTH_PATH:
            return health_response(connection, self.shared)
        if path == METRICS_PATH:
            if not self._authorized(request):
                return connection.respond(
                    HTTPStatus.UNAUTHORIZED, "missing or wrong token; send 'Authorization: Bearer <server.token>'\n"
                )
            response = connection.respond(HTTPStatus.OK, self.shared.metrics.render().decode())
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = CONTENT_TYPE
            return response
        page = page_response(request)
        if page is not None:
            return page
        if path not in PATHS:
            return connection.respond(
                HTTPStatus.NOT_FOUND,
                f"no such path {path!r}; the websocket API is at "
                f"{PATHS[0]}, the page at / and metrics at {METRICS_PATH}\n",
            )
        origin, host = one_header(request, "Origin"), one_header(request, "Host")
        if not origin_allowed(origin, host, self.config.server.allowed_origins):
            self.shared.metrics.rejected.labels("websocket", "origin").inc()
            address = connection.remote_address
            self._refusals.warn(
                str(address[0]) if address else "?",
                "cross-origin websocket refused",
                origin=origin[:200] if origin else None,
            )
            return connection.respond(
                HTTPStatus.FORBIDDEN,
                "this page's origin may not open the websocket; fix: "
                "add it to server.allowed_origins (scheme://host[:port])\n",
            )
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        metrics, slots = self.shared.metrics, self.shared.slots
        assert ws.request is not None
        if not self._authorized(ws.request):
            metrics.rejected.labels("websocket", "token").inc()
            await ws.close(
                CLOSE_POLICY,
                "missing or wrong token: send 'Authorization: Bearer <t>', subprotocol "
                "openai-insecure-api-key.<t> or ?token=<t>",
            )  # <= 123 bytes
            return
        if not slots.acquire():
            metrics.rejected.labels("websocket", "sessions").inc()
            await ws.close(
                CLOSE_TRY_AGAIN, f"server busy: {slots.limit} sessions open (server.max_sessions); try again later"
            )
            return
        try:
            conn = RealtimeConnection(ws, self.shared, peer=str(ws.remote_address))
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
