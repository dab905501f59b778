"""``GET /health`` on the server's HTTP port (the websocket port): 200 and ``{"status": "ready", ...}``.

Why nothing more is needed for readiness: ``serve`` opens its listeners only once every model is loaded, so
an answer at all means ready; a refused connection means loading (or down). It needs no token (a load
balancer or a container health check has none) and tells nothing but the state, the version and how many
sessions are open.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from voice.transports.common import package_version

HEALTH_PATH = "/health"


def health_body(shared: Any) -> dict[str, Any]:
    return {
        "status": "ready",
        "version": package_version(),
        "sessions": shared.slots.used,
        "max_sessions": shared.slots.limit,
    }


def health_response(connection: Any, shared: Any) -> Any:
    """The websockets ``Response`` for /health (``connection``: the handshake's ServerConnection)."""
    response = connection.respond(HTTPStatus.OK, json.dumps(health_body(shared)) + "\n")
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = "application/json"
    return response
