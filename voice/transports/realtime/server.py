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
import sys
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from voice.health import HEALTH_PATH, health_response
from voice.logs import ClientWarnings
from voice.metrics import CONTENT_TYPE
from voice.transports.common import Shared
from voice.transports.realtime.connection import CLOSE_POLICY, CLOSE_TRY_AGAIN, RealtimeConnection
from voice.web import page_file

log = logging.getLogger("specvoice.realtime")

PATHS = ("/v1/realtime", "/realtime")
METRICS_PATH = "/metrics"
SUBPROTOCOL = "realtime"  # what a browser offers, and we select, for the Realtime API
KEY_SUBPROTOCOL = "openai-insecure-api-key."  # + the token: how a browser (no custom headers) sends it
MAX_LOGGED_CHARS = 200  # of text a client chose (an Origin, a request line) in one log line

# What websockets logs, with the exception chain, when an opening handshake fails (websockets.asyncio.server)
HANDSHAKE_FAILED = "opening handshake failed"
# Handshake failures the client caused: bytes that are not an HTTP request (or a hang-up before a whole one), a
# request that is no websocket upgrade, a peer that left or reset before the response. Any other exception is
# our bug (process_request raised) and keeps its traceback.
CLIENT_FAULTS = (InvalidHandshake, ConnectionClosed, ConnectionError, EOFError)


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


def client_host(connection: ServerConnection) -> str:
    """The peer's address without the port: the key of its warnings' rate limit (a port scan uses many ports)."""
    address = connection.remote_address
    return str(address[0]) if address else "?"


def exception_chain(error: BaseException) -> str:
    """The messages of an exception and its causes, outermost first, e.g. "did not receive a valid HTTP request;
    invalid HTTP request line: GARBAGE"; cut to MAX_LOGGED_CHARS, since the client chose part of it."""
    messages = []
    cause: BaseException | None = error
    while cause is not None:
        messages.append(str(cause) or type(cause).__name__)
        cause = cause.__cause__
    return "; ".join(messages)[:MAX_LOGGED_CHARS]


class HandshakeLog(logging.LoggerAdapter[logging.Logger]):
    """The logger handed to websockets: a handshake the client broke becomes one rate-limited warning line.

    Why: websockets logs every failed opening handshake as an error with its exception chain (three tracebacks
    for a port scan's or a load balancer's bare connect, two for a line of garbage), which reads as a crash and
    lets any client fill the journal. Here it is a warning through ``ClientWarnings`` naming the client and the
    reason. Every other record, and a failure that is our own bug, reaches websockets' logger unchanged."""

    def __init__(self, warnings: ClientWarnings) -> None:
        super().__init__(logging.getLogger("websockets.server"))
        self.warnings = warnings

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        # websockets logs from inside its ``except`` block (exc_info=True) and wraps this adapter in one of its
        # own that adds the connection as extra["websocket"]
        extra = kwargs.get("extra")
        connection = extra.get("websocket") if isinstance(extra, Mapping) else None
        error = sys.exception() if kwargs.get("exc_info") is True else None
        if msg == HANDSHAKE_FAILED and isinstance(error, CLIENT_FAULTS) and isinstance(connection, ServerConnection):
            self.warnings.warn(client_host(connection), "websocket handshake failed", reason=exception_chain(error))
            return
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # the record names websockets' line, not this one
        super().log(level, msg, *args, **kwargs)


class RealtimeServer:
    """The websocket API's listener; every accepted connection is a RealtimeConnection with its own session."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.config = shared.config
        self.connections: set[RealtimeConnection] = set()
        # a hostile page, or garbage, can retry in a loop: the journal sees a few of each client's refusals
        self._refusals = ClientWarnings(log)
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
            logger=HandshakeLog(self._refusals),
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
            self._refusals.warn(
                client_host(connection),
                "cross-origin websocket refused",
                origin=origin[:MAX_LOGGED_CHARS] if origin else None,
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
