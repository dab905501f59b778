"""``serve()``: one process, models loaded once, many clients at the same time (``specvoice serve`` runs it).

What it runs on one event loop: the websocket API (voice/transports/realtime*.py, an OpenAI Realtime subset),
the Wyoming server (voice/transports/wyoming*.py), the MQTT bridge when ``mqtt.enabled``, Prometheus metrics at
``/metrics`` on the websocket port, and systemd readiness/watchdog notifications. Every connection gets its own
``Session`` (its own conversation); all sessions share the one ``Assistant``.

Scheduling: the LLM runs on one worker thread, one model step at a time (llm/engine.py); steps of concurrent
turns are queued in the order they are asked for, so on a CPU one generation runs at a time and every session
keeps moving. STT passes are serialised the same way (voice/hearing/stt.py).

Shutdown: SIGTERM (or SIGINT) stops the listeners, lets turns in progress finish for ``server.shutdown_grace_s``,
cancels what is left (a cancelled turn is trimmed in its history like a barge-in), closes websockets with 1001
and then unloads the models. Cancelling ``serve()`` does the same without the grace period.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from voice.config import Config, ConfigError
from voice.metrics import Metrics
from voice.sdnotify import notify, watchdog
from voice.tasks import cancel_and_wait, start
from voice.transports.common import SessionSlots, Shared, is_loopback
from voice.transports.realtime.server import PATHS, RealtimeServer
from voice.transports.wyoming.handler import Gate
from voice.transports.wyoming.server import WyomingServer

log = logging.getLogger("specvoice.serve")


def check_exposure(config: Config) -> None:
    """Localhost by default; anything wider needs a token (websocket) or an allow-list (Wyoming). Home actions
    need a token even on localhost: any local process (another user's, a browser extension) could otherwise
    switch them through the websocket."""
    s = config.server
    if not is_loopback(s.host) and not s.token:
        raise ConfigError(
            f"server.host = {s.host!r} exposes the websocket API without a token; fix: set "
            "server.token (e.g. SPECVOICE_SERVER__TOKEN=$(openssl rand -hex 16)) or bind to 127.0.0.1"
        )
    if config.mqtt.enabled and config.mqtt.allow_list and not s.token:
        raise ConfigError(
            "mqtt.allowed_actions lets the assistant switch things in the home, and the websocket API "
            "has no token; fix: set server.token (e.g. SPECVOICE_SERVER__TOKEN=$(openssl rand -hex 16))"
        )
    if config.wyoming.enabled:
        Gate.check_config(config)


def _report_failure(task: asyncio.Task) -> None:
    """A background service (MQTT bridge, watchdog) that dies says so at once; the other listeners go on."""
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", extra={"task": task.get_name(), "error": repr(task.exception())})


async def serve(
    config: Config,
    *,
    ready: asyncio.Event | None = None,
    assistant: Any = None,
    stop: asyncio.Event | None = None,
    mqtt: Any = None,
) -> None:
    """Serve until ``stop`` is set (graceful: turns get ``server.shutdown_grace_s``) or until cancelled (no grace).

    ``assistant``: an already loaded Assistant to share (tests, the home device); it is then left open. ``ready``
    is set once every listener accepts connections. ``mqtt``: a bridge to run instead of a new one (the home
    device's, which speaks on its speaker).
    """
    check_exposure(config)
    owned = assistant is None
    if assistant is None:
        from voice.assistant import Assistant
        from voice.memory import settle_after_load

        notify("STATUS=loading models")
        assistant = await Assistant.load(config)
        settle_after_load()  # this process keeps the models until it exits: see voice/memory.py
    metrics = Metrics()
    assistant.add_listener(metrics.on_event)
    shared = Shared(config, assistant, metrics, SessionSlots(config.server.max_sessions))
    websocket = RealtimeServer(shared)
    wyoming = WyomingServer(shared) if config.wyoming.enabled else None
    tasks: list[asyncio.Task] = []
    metrics_http = None
    graceful = False
    try:
        try:
            await websocket.start()
            if wyoming is not None:
                await wyoming.start()
        except OSError as exc:
            raise ConfigError(
                f"cannot listen ({exc}); fix: choose a free server.port / wyoming.port or stop the "
                "process that holds it"
            ) from None
        if config.server.metrics_port is not None:
            from prometheus_client import start_http_server

            metrics_http = start_http_server(config.server.metrics_port, addr="127.0.0.1", registry=metrics.registry)
        if mqtt is None and config.mqtt.enabled:
            from voice.transports.mqtt.bridge import MqttBridge

            mqtt = MqttBridge(config, assistant)
        if mqtt is not None:
            tasks.append(start(mqtt.run(), name="mqtt bridge"))
        tasks.append(start(watchdog(), name="sd watchdog"))
        for task in tasks:
            task.add_done_callback(_report_failure)
        where = [
            f"websocket ws://{config.server.host}:{websocket.port}{PATHS[0]} "
            f"(metrics http://{config.server.host}:{websocket.port}/metrics)"
        ]
        if wyoming is not None:
            where.append(f"wyoming tcp://{config.wyoming.host}:{wyoming.port}")
        if config.mqtt.enabled:
            where.append(f"mqtt {config.mqtt.host}:{config.mqtt.port}")
        notify("READY=1")
        notify("STATUS=serving " + ", ".join(where))
        log.info("serving", extra={"listeners": where})
        print("specvoice serve: " + "; ".join(where), file=sys.stderr, flush=True)
        if ready is not None:
            ready.set()
        if stop is None:
            await asyncio.Event().wait()  # until cancelled
        else:
            await stop.wait()
            graceful = True
    finally:
        notify("STOPPING=1")
        grace = config.server.shutdown_grace_s if graceful else 0.0
        await asyncio.gather(
            websocket.stop(grace), wyoming.stop(grace) if wyoming else asyncio.sleep(0), return_exceptions=True
        )
        await cancel_and_wait(*tasks)
        if metrics_http is not None:
            httpd, thread = metrics_http
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=2.0)
        assistant.remove_listener(metrics.on_event)
        if owned:
            await assistant.close()
        log.info("stopped", extra={"graceful": graceful})
