"""The assistant on MQTT, with Home Assistant's conventions: triggers in, state and results out, home actions.

Topics (``<p>`` = ``mqtt.prefix``; every message QoS 1):

    in   <p>/say        text to speak now (plain text, or {"text": ...})
         <p>/ask        a question: plain text, or {"text", "id", "speak", "conversation_id"}
         <p>/cancel     stop the speech or reply in progress (any payload)
         <mqtt.events>  configured triggers: topic (wildcards allowed) -> sentence template, filled from the
                        payload's JSON fields, {payload} (the raw text) and {topic}
         homeassistant/status  "online": Home Assistant restarted, so the discovery configs are sent again
                        (at most once per 30 s: any client can publish there)
    out  <p>/availability  online / offline (retained; "offline" is also the last will)
         <p>/state         idle / listening / thinking / speaking (retained)
         <p>/transcript    {"text", "session"}: the last final transcript
         <p>/reply         {"text", "session", "turn_id", "interrupted"}: the last reply
         <p>/latency       {"ms", "stage", "acceptance_pct", "over_budget", ...} of the last turn (retained)
         <p>/turn          every finished turn: transcript, reply, interrupted, full latency trace
         <p>/answer        the answer to an ask: {"id", "question", "reply", "conversation_id", ...}
         <p>/spoken        a say or an event announcement was spoken: {"text", "source", "audio_s"}
         <p>/event         {"event_type": "wake_word" | "turn_end", ...} (a Home Assistant event entity)
         <p>/action        a home action the broker took: {"topic", "payload", "session"}
         <p>/error         what went wrong and how to fix it: bad payloads, refused actions, a command not
                           done (the broker away: home_commands.py), a full queue

Whose turns are published (``mqtt.publish_turns``): by default only the MQTT-originated ones and the local
device's (``specvoice run``); a websocket or Wyoming client's words never reach the broker. Transcripts and
replies are not retained unless ``mqtt.retain_results``. Each ``conversation_id`` of ``ask`` has its own
conversation; an ask without one starts afresh, so no asker reads another's history.

Why a persistent session (``clean_session=False``, a client id per host): the broker keeps our subscriptions
and queues QoS 1 commands while we are away, so none is lost. Retained messages on command topics are ignored:
the broker would replay them at every reconnect (yesterday's ``say`` spoken again). Our own messages wait in a
bounded outbox (voice/transports/mqtt/outbox.py) and leave it once the broker acknowledged them; a message over
the broker's packet size (``mqtt.max_packet_bytes``, or one that made the broker drop us twice) is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import aiomqtt

from voice.config import Config
from voice.dialog.home import not_switched
from voice.events import ActionRequested, Event, State, StateChanged, TranscriptFinal, TurnDone, TurnError
from voice.tasks import cancel_and_wait, start
from voice.transports.common import package_version
from voice.transports.mqtt.commands import CommandRunner
from voice.transports.mqtt.discovery import discovery_messages
from voice.transports.mqtt.home_commands import CommandDelivery, HomeCommand, NotDone
from voice.transports.mqtt.outbox import Outbox, QuietLog, TokenBucket
from voice.transports.mqtt.payloads import (
    Command,
    Outgoing,
    PayloadError,
    Priority,
    Topics,
    decode_payload,
    parse_ask,
    parse_text_command,
    render_event,
)
from voice.transports.mqtt.settings_check import check_settings, explain
from voice.transports.mqtt.turn_messages import finished_turn

log = logging.getLogger("specvoice.mqtt")

PUBLISH_TIMEOUT_S = 10.0
OUTBOX_LIMIT = 1000  # results and telemetry waiting while the broker is away (control messages never pile up)


class MqttBridge:
    """Runs until cancelled: connects, serves, and reconnects with exponential backoff when the link drops.

    ``sink``: where MQTT-triggered speech plays (a lane of the home device's speaker); None: nowhere.
    ``add_local(session)``: the local device's session, whose turns are published and which ``cancel`` stops."""

    rediscovery_interval_s = 30.0

    def __init__(self, config: Config, assistant, *, sink=None) -> None:
        self.config = config
        self.cfg = cfg = config.mqtt
        self.assistant = assistant
        self.sink = sink
        self.prefix = cfg.prefix.rstrip("/")
        self.topics = Topics.under(self.prefix)
        self.allowed = cfg.allow_list
        check_settings(cfg, self.prefix, self.allowed)
        # the devices' state topics: followed (retained values too) so that state questions have an answer
        self.state_topics = {d.state_topic for d in cfg.devices if d.state_topic}
        self.connected = asyncio.Event()
        self.last_error: str | None = None  # the last connection problem, phrased with its fix
        self.outbox = Outbox(OUTBOX_LIMIT)
        self.home_commands = CommandDelivery(self.outbox, cfg.command_timeout_s, self._not_done)
        self._stopping = False  # a clean stop: the publisher ends after the message in flight
        self.skipped = 0  # messages too big for the broker
        self.commands = CommandRunner(self)
        self._published: set[str] = set()  # session ids whose turns go out (publish_turns = "local")
        self._state = State.IDLE
        self._in_flight: Outgoing | None = None
        self._suspect: Outgoing | None = None  # was in flight when the broker dropped us
        self._last_discovery = float("-inf")
        self._discovery_timer: asyncio.TimerHandle | None = None
        self._errors = TokenBucket(rate=2.0, burst=20.0)  # error reports per topic
        self._quiet = QuietLog(log)

    def add_local(self, session) -> None:
        """The local device's conversation (``specvoice run``): published, and stopped by ``<p>/cancel``."""
        self.commands.local.append(session)
        self._published.add(session.id)

    # ---- connection ------------------------------------------------------------------------------------------

    def _client(self) -> aiomqtt.Client:
        cfg = self.cfg
        tls = (
            aiomqtt.TLSParameters(ca_certs=cfg.ca_file, certfile=cfg.cert_file, keyfile=cfg.key_file)
            if cfg.tls
            else None
        )
        return aiomqtt.Client(
            cfg.host,
            cfg.port,
            username=cfg.username,
            password=cfg.password,
            identifier=cfg.client_id,
            clean_session=False,
            keepalive=cfg.keepalive_s,
            tls_params=tls,
            timeout=PUBLISH_TIMEOUT_S,
            will=aiomqtt.Will(self.topics.availability, "offline", qos=1, retain=True),
            logger=logging.getLogger("specvoice.mqtt.paho"),
        )

    async def run(self) -> None:
        self.assistant.add_listener(self._on_event)
        worker = self.commands.start(self._new_session)
        delay = self.cfg.reconnect_min_s
        try:
            while True:
                was_connected = False
                try:
                    async with self._client() as client:
                        was_connected = True
                        await self._serve(client)
                except aiomqtt.MqttError as exc:
                    self.last_error = explain(exc, self.cfg)
                finally:
                    self.connected.clear()
                    self._reachable(False)
                    self._lost_in_flight()
                if was_connected:
                    delay = self.cfg.reconnect_min_s
                self._quiet.warning(
                    "connection",
                    "mqtt connection lost or refused; retrying",
                    error=self.last_error,
                    retry_in_s=delay,
                    broker=self._where(),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.cfg.reconnect_max_s)
        finally:
            self.assistant.remove_listener(self._on_event)
            if self._discovery_timer is not None:
                self._discovery_timer.cancel()
            self.home_commands.close()
            await cancel_and_wait(worker)
            await self.commands.close()

    async def _serve(self, client: aiomqtt.Client) -> None:
        await self._on_connected(client)
        self._stopping = False
        reader = start(self._read(client), name="mqtt reader")
        publisher = start(self._publish_outbox(client), name="mqtt publisher")
        try:
            done, _ = await asyncio.wait({reader, publisher}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises the MqttError that ended it
        except asyncio.CancelledError:
            # a clean stop. A publish still waiting for its acknowledgement gets it first (cancelled mid-flight,
            # aiomqtt's disconnect would wait for the broker forever); then "offline", said by us (a graceful
            # disconnect does not fire the last will)
            self._stopping = True
            self.outbox.changed.set()
            await asyncio.wait({publisher}, timeout=PUBLISH_TIMEOUT_S)
            with contextlib.suppress(aiomqtt.MqttError):
                await client.publish(self.topics.availability, "offline", qos=1, retain=True, timeout=2)
            raise
        finally:
            await cancel_and_wait(reader, publisher)

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        t = self.topics
        subscriptions = [t.say, t.ask, t.cancel, *self.cfg.events, *sorted(self.state_topics)]
        if self.cfg.discovery:
            subscriptions.append(f"{self.cfg.discovery_prefix}/status")
        granted = await client.subscribe([(topic, 1) for topic in subscriptions])
        codes = [code if isinstance(code, int) else int(code.value) for code in granted]
        refused = [topic for topic, code in zip(subscriptions, codes, strict=False) if code >= 0x80]
        if refused:  # e.g. a broker ACL: the bridge still runs, but those triggers will never arrive
            self.last_error = f"the broker refused subscriptions to {refused}; fix: allow them in its ACL"
            log.error("mqtt subscriptions refused", extra={"topics": refused})
        # through the outbox like everything else: ahead of results, and a config too big for the broker is
        # skipped instead of making the bridge reconnect forever
        for message in [
            Outgoing(t.availability, "online", True, Priority.CONTROL),
            *self._discovery(),
            Outgoing(t.state, self._state.value, True, Priority.CONTROL),
        ]:
            self.outbox.put(message)
        if not refused:
            self.last_error = None
        log.info(
            "mqtt connected",
            extra={"broker": self._where(), "client_id": self.cfg.client_id, "subscriptions": subscriptions},
        )

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = message.topic.value
            try:
                self._dispatch(message)
            except PayloadError as exc:
                self._error("payload", str(exc), topic=topic)
                self._quiet.warning(f"payload {topic}", "bad mqtt payload", topic=topic, error=str(exc))
            except Exception as exc:  # a bug must cost one message, not the bridge
                log.exception("mqtt message handling failed", extra={"topic": topic})
                self._error("internal", f"{type(exc).__name__}: {exc}", topic=topic)

    async def _publish_outbox(self, client: aiomqtt.Client) -> None:
        """Control, then results, then telemetry; a message leaves once the broker has acknowledged it."""
        while True:
            if not self.connected.is_set() and not self.outbox.waiting(Priority.CONTROL):
                self.connected.set()  # connected and announced: availability, discovery and state are out
                self._reachable(True)
            message = await self.outbox.wait()
            if self._stopping:
                return
            if message is None:
                continue
            if message.packet_bytes > self.cfg.max_packet_bytes:
                self._skip(
                    message, f"{message.packet_bytes} bytes is over mqtt.max_packet_bytes ({self.cfg.max_packet_bytes})"
                )
                continue
            self._in_flight = message
            if isinstance(message, HomeCommand):
                self.home_commands.sending(message)
            await client.publish(message.topic, message.payload, qos=1, retain=message.retain)
            self._in_flight = None
            if self._suspect is message:
                self._suspect = None
            self.outbox.done(message)
            if isinstance(message, HomeCommand):
                self.home_commands.published(message)
                notice = {"topic": message.topic, "payload": message.payload, "session": message.session}
                self._send(self.topics.action, notice)

    def _lost_in_flight(self) -> None:
        """The connection dropped while a message was in flight. Twice for the same message: the broker refuses
        it (over its max_packet_size, which MQTT 3.1.1 cannot tell us): skip it rather than loop forever."""
        lost, self._in_flight = self._in_flight, None
        if isinstance(lost, HomeCommand):
            self.home_commands.lost(lost)  # never sent twice: a device could switch twice
        elif lost is not None and lost is self._suspect:
            self._suspect = None
            self._skip(
                lost,
                "the broker closed the connection twice while it was being sent (over the broker's max_packet_size?)",
            )
        elif lost is not None:
            self._suspect = lost

    def _skip(self, message: Outgoing, why: str) -> None:
        if isinstance(message, HomeCommand):
            self.home_commands.withdraw(message)
        self.outbox.done(message)
        self.skipped += 1
        log.warning(
            "mqtt message skipped",
            extra={
                "topic": message.topic,
                "bytes": message.packet_bytes,
                "reason": why + "; fix: raise the broker's max_packet_size",
            },
        )

    def _send(
        self, topic: str, payload: str | dict, retain: bool = False, priority: Priority = Priority.RESULT
    ) -> None:
        if isinstance(payload, dict):
            payload = json.dumps(payload, default=str)
        self._put(Outgoing(topic, payload, retain, priority))

    def _put(self, message: Outgoing) -> None:
        dropped = self.outbox.put(message)
        if dropped is not None:
            self._quiet.warning(
                "outbox", "mqtt outbox full: dropped a message", topic=dropped.topic, dropped_total=self.outbox.dropped
            )

    def _error(self, kind: str, message: str, **details: Any) -> None:
        """Report on <p>/error, at most 20 at once and 2 a second per topic: a flood earns no flood."""
        if self._errors.allow(str(details.get("topic", kind))):
            self._send(
                self.topics.error,
                {"kind": kind, "error": message, **details, "t": round(time.time(), 3)},
                priority=Priority.TELEMETRY,
            )

    def _where(self) -> str:
        return f"{'mqtts' if self.cfg.tls else 'mqtt'}://{self.cfg.host}:{self.cfg.port}"

    # ---- Home Assistant discovery ------------------------------------------------------------------------------

    def _discovery(self) -> list[Outgoing]:
        if not self.cfg.discovery:
            return []
        return discovery_messages(self.topics, self.cfg.node_id, self.cfg.discovery_prefix, package_version())

    def _rediscover(self) -> None:
        """Home Assistant (or anyone) said it came online: the configs again, at most once per interval."""
        now = time.monotonic()
        wait = self._last_discovery + self.rediscovery_interval_s - now
        if wait <= 0:
            self._last_discovery = now
            for message in self._discovery():
                self.outbox.put(message)
            log.info("home assistant came online: discovery sent again")
        elif self._discovery_timer is None:

            def later() -> None:
                self._discovery_timer = None
                self._rediscover()

            self._discovery_timer = asyncio.get_running_loop().call_later(wait, later)

    # ---- commands in -----------------------------------------------------------------------------------------

    def _dispatch(self, message: aiomqtt.Message) -> None:
        topic, t = message.topic.value, self.topics
        if topic in self.state_topics:  # a state, retained or not: kept, never acted on
            if self.assistant.home is not None:
                self.assistant.home.set_state(topic, decode_payload(message.payload))
            return
        if message.retain:
            # a retained command would be replayed at every (re)connection: never act on one
            self._quiet.warning(
                f"retained {topic}",
                "ignored a retained message on a command topic; fix: publish "
                "commands without the retain flag (and clear it: an empty retained message)",
                topic=topic,
            )
            return
        if topic == t.say:
            self.commands.enqueue(Command("say", parse_text_command(message.payload, fields={})["text"], topic))
        elif topic == t.ask:
            command = parse_ask(message.payload)
            command.source = topic
            self.commands.enqueue(command)
        elif topic == t.cancel:
            self.commands.cancel_soon(local=True)
        elif topic == f"{self.cfg.discovery_prefix}/status":
            if decode_payload(message.payload).strip() == "online":
                self._rediscover()
        else:
            for pattern, template in self.cfg.events.items():
                if message.topic.matches(pattern):
                    self.commands.enqueue(Command("say", render_event(template, topic, message.payload), topic))
                    return

    def preempted(self) -> None:
        """Our speaker lane was taken by the local conversation: stop the command that was speaking."""
        self.commands.cancel_soon(local=False)

    # ---- events out ------------------------------------------------------------------------------------------

    def _new_session(self, name: str) -> Any:
        session = self.assistant.session(self.commands.on_session_event, sink=self.sink, name=name)
        self._published.add(session.id)
        return session

    def publish_event(self, event_type: str, **details: Any) -> None:
        """A Home Assistant event entity's event (``wake_word``, ``turn_end``)."""
        self._send(self.topics.event, {"event_type": event_type, **details})

    def _publishes(self, session_id: str) -> bool:
        turns = self.cfg.publish_turns
        return turns == "all" or (turns == "local" and session_id in self._published)

    def _on_event(self, session_id: str, event: Event) -> None:
        """Every session's events (listener on the Assistant): actions carried out; state and results out for the
        sessions whose turns are published."""
        if isinstance(event, ActionRequested):
            self._action(session_id, event)
            return
        if not self._publishes(session_id):
            return
        t, retain = self.topics, self.cfg.retain_results
        if isinstance(event, StateChanged):
            self._state = event.state
            self._send(t.state, event.state.value, retain=True, priority=Priority.CONTROL)
        elif isinstance(event, TranscriptFinal) and event.text.strip():
            self._send(t.transcript, {"text": event.text, "session": session_id}, retain=retain)
        elif isinstance(event, TurnDone) and session_id not in self.commands.saying:
            for message in finished_turn(t, session_id, event, retain=retain):
                self._put(message)
            self.publish_event("turn_end", session=session_id, turn_id=event.turn_id, interrupted=event.interrupted)
        elif isinstance(event, TurnError):
            self._error(
                "turn",
                f"turn {event.turn_id} failed in {event.stage}: {event.message}",
                session=session_id,
                turn_id=event.turn_id,
                stage=event.stage,
            )

    def _action(self, session_id: str, request: ActionRequested) -> None:
        """Publish an allowed action; refuse anything else. The allow-list is checked again here: the request
        may come from any session, and only this check stands between the model and the home."""
        reason = request.reason
        if request.allowed and request.payload not in self.allowed.get(request.topic, []):
            reason = f"{request.topic!r} {request.payload!r} is not on this bridge's mqtt.allowed_actions"
        elif request.allowed:
            self.home_commands.send(request.topic, request.payload, session_id)
            log.info("home action", extra={"topic": request.topic, "payload": request.payload})
            return
        self._error(
            "action",
            f"action refused: {reason or 'not allowed'}",
            topic=request.topic,
            payload=request.payload,
            session=session_id,
        )
        log.warning("home action refused", extra={"topic": request.topic, "payload": request.payload, "reason": reason})

    def _reachable(self, reachable: bool) -> None:
        """Tell the home whether its commands can go out now (voice/dialog/home.py ``Home.reachable``)."""
        if self.assistant.home is not None:
            self.assistant.home.reachable = reachable

    def _not_done(self, failed: NotDone) -> None:
        """A command that did not happen: on the error topic, and aloud where the home device's user waits."""
        command = failed.command
        self._error("action", failed.reason, topic=command.topic, payload=command.payload, session=command.session)
        log.warning("home command not done", extra={"topic": command.topic, "reason": failed.reason})
        name = next((d.name for d in self.cfg.devices if d.topic == command.topic), "device")
        sentence = not_switched(name, sure=failed.sure)
        for session in self.commands.local:
            if session.id == command.session:
                self.assistant.spawn(session.say(sentence))
