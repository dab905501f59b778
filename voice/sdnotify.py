"""sd_notify for ``Type=notify`` units: readiness, status lines and the watchdog, with the socket module only.

systemd passes a datagram socket in ``$NOTIFY_SOCKET`` (a path, or an abstract name starting with ``@``) and,
with ``WatchdogSec=``, the interval in ``$WATCHDOG_USEC``. Outside systemd both are unset and everything here
does nothing, so ``specvoice serve`` runs the same from a shell.

Why the watchdog is pinged from the event loop: a ping proves that the loop still turns. If a model call ever
blocks the loop (the bug class that would freeze every session), pings stop and systemd restarts the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger("specvoice.sdnotify")


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``, ``"STATUS=loading models"``, ``"STOPPING=1"``) to systemd.

    Returns True when it was sent, False when not running under systemd or when sending failed (logged):
    a failed notification must never take the service down."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError as exc:
        log.warning("sd_notify failed", extra={"socket": os.environ.get("NOTIFY_SOCKET"), "error": str(exc)})
        return False


def watchdog_interval() -> float | None:
    """Seconds between pings (half of ``$WATCHDOG_USEC``), or None when no watchdog is asked for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or not os.environ.get("NOTIFY_SOCKET"):
        return None
    if pid and pid != str(os.getpid()):  # the variables were meant for another process (we are a child)
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("ignoring a malformed WATCHDOG_USEC", extra={"value": usec})
        return None
    return value / 2e6 if value > 0 else None


async def watchdog() -> None:
    """Ping ``WATCHDOG=1`` at half the watchdog interval until cancelled; returns at once without a watchdog."""
    interval = watchdog_interval()
    if interval is None:
        return
    log.info("watchdog on", extra={"interval_s": interval})
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
