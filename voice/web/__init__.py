"""The browser page, served by the websocket server at ``/``: static files shipped inside this package.

Why a package: ``importlib.resources`` finds the files wherever the wheel put them, and the page needs no build
step and no CDN, so the files in this folder are exactly what the browser runs. Only names listed in this
folder with a known type are served, matched as one path segment, so no request can reach anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",  # module scripts and worklets are refused under any other type
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
INDEX = "index.html"
_HOST = re.compile(r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")


@dataclass(frozen=True)
class PageFile:
    """One file of the page, ready to send: its bytes and the HTTP headers that go with them."""

    body: bytes
    headers: list[tuple[str, str]]


def page_names() -> set[str]:
    """The file names the page is made of (what may be served)."""
    return {
        f.name
        for f in resources.files(__package__).iterdir()
        if f.is_file() and any(f.name.endswith(ext) for ext in CONTENT_TYPES)
    }


def page_file(path: str, host: str | None = None) -> PageFile | None:
    """The file for a URL path (``/`` is the page itself), or None when the path is not part of the page.

    ``host`` (the request's Host header) names the websocket origin in the Content-Security-Policy: CSP 3 lets
    ``'self'`` cover ws:// and wss:// of the same host, but saying it explicitly costs nothing.
    """
    name = INDEX if path in ("/", "") else path.removeprefix("/")
    if "/" in name or name not in page_names():
        return None
    body = resources.files(__package__).joinpath(name).read_bytes()
    content_type = CONTENT_TYPES[name[name.rindex(".") :]]
    return PageFile(
        body,
        [
            ("Content-Type", content_type),
            ("Content-Security-Policy", content_security_policy(host)),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("Cache-Control", "no-cache"),
        ],
    )


def content_security_policy(host: str | None) -> str:
    """Same origin only: scripts, styles, worklets and the websocket; nothing inline, no frames, no forms."""
    connect = "'self'"
    if host and _HOST.match(host):
        connect += f" ws://{host} wss://{host}"
    return (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; media-src 'self'; "
        f"connect-src {connect}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
