"""The assistant on MQTT, with Home Assistant's conventions: triggers in, state and results out, home actions.

Topics (``<p>`` = ``mqtt.prefix``; every message QoS 1):

    in   <p>/say        text to speak now (plain text, or {"text": ...})
         <p>/ask        a question: plain text, or {"text": ..., "id": ..., "speak": true}
         <p>/cancel     stop the speech or reply in progress (any payload)
         <mqtt.events>  configured triggers: topic (wildcards allowed) -> sentence template, filled from the
                        payload's JSON fields, {payload} (the raw text) and {topic}
         homeassistant/status  "online": Home Assistant restarted, so the discovery configs are sent again
    out  <p>/availability  online / offline (retained; "offline" is also the last will)
         <p>/state         idle / listening / thinking / speaking (retained)
         <p>/transcript    the last final transcript (retained)
         <p>/reply         the last reply (retained)
         <p>/latency       {"ms", "stage", "over_budget", ...} of the last spoken turn (retained)
         <p>/turn          every finished turn: transcript, reply, interrupted, full latency trace
         <p>/answer        the answer to an ask: {"id", "question", "reply", ...}
         <p>/spoken        a say or an event announcement was spoken: {"text", "source", "audio_s"}
         <p>/action        a home action that was published: {"topic", "payload", "session"}
         <p>/error         what went wrong and how to fix it: bad payloads, refused actions, failed turns

Why a persistent session (``clean_session=False`` and a fixed client id): the broker keeps our subscriptions
and queues QoS 1 commands while we are away (a broker restart, a network blip), so none is lost. Our own
messages wait in an outbox that survives reconnections and leave it only once the broker acknowledged them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiomqtt

from voice.actions import check_allowed
from voice.config import Config
from voice.events import (ActionRequested, Event, ReplyAudio, State, StateChanged, TranscriptFinal, TurnDone,
                          TurnError)
from voice.transports.mqtt_payloads import (Command, Outgoing, PayloadError, Topics, decode_payload,
                                            parse_text_command, render_event, template_fields)

log = logging.getLogger("specvoice.mqtt")

PUBLISH_TIMEOUT_S = 10.0
OUTBOX_LIMIT = 1000  # while the broker is away; beyond this the oldest messages are dropped (and logged)
HA_TEXT_MAX = 255  # Home Assistant sensor states and text entities hold at most 255 characters


# ---- the bridge ---------------------------------------------------------------------------------------------------

class MqttBridge:
    """Runs until cancelled: connects, serves, and reconnects with exponential backoff when the link drops."""

    def __init__(self, config: Config, assistant, *, sink=None) -> None:
        self.config = config
        self.cfg = config.mqtt
        self.assistant = assistant
        self.sink = sink  # where MQTT-triggered speech is played (the speaker in desktop serve); None: nowhere
        self.prefix = self.cfg.prefix.rstrip("/")
        self.topics = Topics.under(self.prefix)
        self.allowed = {topic: list(payloads) for topic, payloads in self.cfg.allowed_actions.items()}
        check_allowed(self.allowed)
        for topic in self.allowed:
            if topic.startswith((self.prefix + "/", self.cfg.discovery_prefix + "/")):
                raise ValueError(f"mqtt.allowed_actions[{topic!r}] would let the model command the assistant or "
                                 "Home Assistant discovery itself; fix: allow only device command topics")
        for topic, template in self.cfg.events.items():
            try:
                template_fields(template)
            except ValueError as exc:
                raise ValueError(f"mqtt.events[{topic!r}]: the sentence {template!r} is not a valid template "
                                 f"({exc}); fix: write fields as {{name}} and a literal brace as {{{{ or }}}}")
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self.cfg, key)
            if self.cfg.tls and path and not Path(path).expanduser().is_file():
                raise ValueError(f"mqtt.{key} = {path!r} does not exist; fix: point it at a PEM file readable by "
                                 "the service (or unset it)")
        self.connected = asyncio.Event()
        self.last_error: str | None = None  # the last connection problem, phrased with its fix
        self._outbox: deque[Outgoing] = deque(maxlen=OUTBOX_LIMIT)
        self._outbox_changed = asyncio.Event()
        self._commands: asyncio.Queue[Command] = asyncio.Queue()
        self._session = None
        self._current: asyncio.Task | None = None
        self._current_kind = ""
        self._audio_samples = 0
        self._state = State.IDLE
        self._tasks: set[asyncio.Task] = set()  # fire-and-forget tasks, kept alive until done

    # ---- connection ------------------------------------------------------------------------------------------

    def _client(self) -> aiomqtt.Client:
        cfg = self.cfg
        tls = aiomqtt.TLSParameters(ca_certs=cfg.ca_file, certfile=cfg.cert_file, keyfile=cfg.key_file) \
            if cfg.tls else None
        return aiomqtt.Client(
            cfg.host, cfg.port, username=cfg.username, password=cfg.password, identifier=cfg.client_id,
            clean_session=False, keepalive=cfg.keepalive_s, tls_params=tls, timeout=PUBLISH_TIMEOUT_S,
            will=aiomqtt.Will(self.topics.availability, "offline", qos=1, retain=True),
            logger=logging.getLogger("specvoice.mqtt.paho"))

    async def run(self) -> None:
        self.assistant.add_listener(self._on_event)
        self._session = self.assistant.session(self._on_session_event, sink=self.sink, name="mqtt")
        worker = asyncio.create_task(self._work(), name="mqtt commands")
        delay = self.cfg.reconnect_min_s
        try:
            while True:
                was_connected = False
                try:
                    async with self._client() as client:
                        was_connected = True
                        await self._serve(client)
                except aiomqtt.MqttError as exc:
                    self.last_error = _explain(exc, self.cfg)
                finally:
                    self.connected.clear()
                if was_connected:
                    delay = self.cfg.reconnect_min_s
                log.warning("mqtt connection lost or refused; retrying",
                            extra={"error": self.last_error, "retry_in_s": delay, "broker": self._where()})
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.cfg.reconnect_max_s)
        finally:
            self.assistant.remove_listener(self._on_event)
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            await self._session.close()

    async def _serve(self, client: aiomqtt.Client) -> None:
        try:
            await self._on_connected(client)
            reader = asyncio.create_task(self._read(client))
            publisher = asyncio.create_task(self._publish_outbox(client))
            try:
                done, _ = await asyncio.wait({reader, publisher}, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # raises the MqttError that ended it
            finally:
                for task in (reader, publisher):
                    task.cancel()
                await asyncio.gather(reader, publisher, return_exceptions=True)
        except asyncio.CancelledError:
            # a clean stop: say so ourselves (a graceful disconnect does not fire the last will)
            with contextlib.suppress(aiomqtt.MqttError):
                await client.publish(self.topics.availability, "offline", qos=1, retain=True, timeout=2)
            raise

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        t = self.topics
        subscriptions = [t.say, t.ask, t.cancel, *self.cfg.events]
        if self.cfg.discovery:
            subscriptions.append(f"{self.cfg.discovery_prefix}/status")
        granted = await client.subscribe([(topic, 1) for topic in subscriptions])
        refused = [topic for topic, code in zip(subscriptions, granted) if int(getattr(code, "value", code)) >= 0x80]
        if refused:  # e.g. a broker ACL: the bridge still runs, but those triggers will never arrive
            self.last_error = f"the broker refused subscriptions to {refused}; fix: allow them in its ACL"
            log.error("mqtt subscriptions refused", extra={"topics": refused})
        for message in [Outgoing(t.availability, "online", True), *self._discovery(),
                        Outgoing(t.state, self._state.value, True)]:
            await client.publish(message.topic, message.payload, qos=1, retain=message.retain)
        self.connected.set()
        if not refused:
            self.last_error = None
        log.info("mqtt connected", extra={"broker": self._where(), "client_id": self.cfg.client_id,
                                          "subscriptions": subscriptions})

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = message.topic.value
            try:
                self._dispatch(message)
            except PayloadError as exc:
                self._error("payload", str(exc), topic=topic)
                log.warning("bad mqtt payload", extra={"topic": topic, "error": str(exc)})
            except Exception as exc:  # a bug must cost one message, not the bridge
                log.exception("mqtt message handling failed", extra={"topic": topic})
                self._error("internal", f"{type(exc).__name__}: {exc}", topic=topic)

    async def _publish_outbox(self, client: aiomqtt.Client) -> None:
        """Oldest first; a message leaves the outbox only when the broker has acknowledged it."""
        while True:
            if not self._outbox:
                self._outbox_changed.clear()
                await self._outbox_changed.wait()
                continue
            message = self._outbox[0]
            await client.publish(message.topic, message.payload, qos=1, retain=message.retain)
            if self._outbox and self._outbox[0] is message:  # (a full outbox may have dropped it meanwhile)
                self._outbox.popleft()

    def _send(self, topic: str, payload: str | dict, retain: bool = False) -> None:
        if isinstance(payload, dict):
            payload = json.dumps(payload, default=str)
        if len(self._outbox) == OUTBOX_LIMIT:
            log.warning("mqtt outbox full: dropping the oldest message", extra={"topic": self._outbox[0].topic})
        self._outbox.append(Outgoing(topic, payload, retain))
        self._outbox_changed.set()

    def _error(self, kind: str, message: str, **details: Any) -> None:
        self._send(self.topics.error, {"kind": kind, "error": message, **details, "t": round(time.time(), 3)})

    def _where(self) -> str:
        return f"{'mqtts' if self.cfg.tls else 'mqtt'}://{self.cfg.host}:{self.cfg.port}"

    # ---- Home Assistant discovery ------------------------------------------------------------------------------

    def _discovery(self) -> list[Outgoing]:
        if not self.cfg.discovery:
            return []
        t, node = self.topics, self.cfg.node_id
        device = {"identifiers": [f"specvoice_{node}"], "name": f"specvoice {node}", "manufacturer": "specvoice",
                  "model": "local voice assistant"}
        common = {"availability_topic": t.availability, "payload_available": "online",
                  "payload_not_available": "offline", "device": device}
        short = f"{{{{ value[:{HA_TEXT_MAX}] }}}}"
        entities = {
            ("sensor", "state"): {"name": "State", "state_topic": t.state, "device_class": "enum",
                                  "options": [s.value for s in State], "icon": "mdi:account-voice"},
            ("sensor", "transcript"): {"name": "Last transcript", "state_topic": t.transcript,
                                       "value_template": short, "icon": "mdi:microphone-message"},
            ("sensor", "reply"): {"name": "Last reply", "state_topic": t.reply, "value_template": short,
                                  "icon": "mdi:message-reply-text"},
            ("sensor", "latency"): {"name": "Response latency", "state_topic": t.latency,
                                    "value_template": "{{ value_json.ms }}", "json_attributes_topic": t.latency,
                                    "unit_of_measurement": "ms", "device_class": "duration",
                                    "state_class": "measurement", "icon": "mdi:timer-outline"},
            ("text", "say"): {"name": "Say", "command_topic": t.say, "mode": "text", "max": HA_TEXT_MAX,
                              "icon": "mdi:bullhorn"},
            ("text", "ask"): {"name": "Ask", "command_topic": t.ask, "mode": "text", "max": HA_TEXT_MAX,
                              "icon": "mdi:chat-question"},
            ("button", "stop"): {"name": "Stop", "command_topic": t.cancel, "payload_press": "PRESS",
                                 "icon": "mdi:stop"},
        }
        out = []
        for (component, object_id), config in entities.items():
            body = {**config, **common, "unique_id": f"specvoice_{node}_{object_id}", "qos": 1}
            topic = f"{self.cfg.discovery_prefix}/{component}/{node}/{object_id}/config"
            out.append(Outgoing(topic, json.dumps(body), retain=True))
        return out

    # ---- commands in -----------------------------------------------------------------------------------------

    def _dispatch(self, message: aiomqtt.Message) -> None:
        topic, t = message.topic.value, self.topics
        if topic == t.say:
            data = parse_text_command(message.payload, fields={})
            self._commands.put_nowait(Command("say", data["text"], topic))
        elif topic == t.ask:
            data = parse_text_command(message.payload, fields={"id": (str, int), "speak": bool})
            self._commands.put_nowait(Command("ask", data["text"], topic, data.get("id"), data.get("speak", True)))
        elif topic == t.cancel:
            task = asyncio.create_task(self._cancel())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif topic == f"{self.cfg.discovery_prefix}/status":
            if decode_payload(message.payload).strip() == "online":
                for item in self._discovery():
                    self._send(item.topic, item.payload, item.retain)
                log.info("home assistant came online: discovery sent again")
        else:
            for pattern, template in self.cfg.events.items():
                if message.topic.matches(pattern):
                    sentence = render_event(template, topic, message.payload)
                    self._commands.put_nowait(Command("say", sentence, topic))
                    return

    async def _cancel(self) -> None:
        if self._current is not None and not self._current.done() and self._current_kind == "say":
            self._current.cancel()
        await self._session.cancel()

    async def _work(self) -> None:
        """One command at a time, in arrival order, on the bridge's own session."""
        while True:
            command = await self._commands.get()
            self._current_kind = command.kind
            self._current = asyncio.create_task(self._run(command))
            try:
                await asyncio.shield(self._current)
            except asyncio.CancelledError:
                if not self._current.cancelled():  # the bridge itself is stopping
                    self._current.cancel()
                    raise
            except Exception as exc:
                log.exception("mqtt command failed", extra={"kind": command.kind})
                self._error("command", f"{command.kind} failed: {type(exc).__name__}: {exc}", topic=command.source)

    async def _run(self, command: Command) -> None:
        self._audio_samples = 0
        rate = self.assistant.tts_sample_rate
        if command.kind == "say":
            interrupted = False
            try:
                await self._session.say(command.text)
            except asyncio.CancelledError:
                interrupted = True
            self._send(self.topics.spoken, {"text": command.text, "source": command.source,
                                            "audio_s": round(self._audio_samples / rate, 3),
                                            "interrupted": interrupted})
            return
        done: TurnDone = await self._session.ask(command.text, speak=command.speak)
        self._send(self.topics.answer, {"id": command.id, "question": command.text, "reply": done.reply,
                                        "turn_id": done.turn_id, "interrupted": done.interrupted,
                                        "audio_s": round(self._audio_samples / rate, 3)})

    # ---- events out ------------------------------------------------------------------------------------------

    def _on_session_event(self, event: Event) -> None:
        if isinstance(event, ReplyAudio):
            self._audio_samples += len(event.samples)

    def _on_event(self, session_id: str, event: Event) -> None:
        """Every session's events (listener on the Assistant): state and results out, actions carried out."""
        t = self.topics
        if isinstance(event, StateChanged):
            self._state = event.state
            self._send(t.state, event.state.value, retain=True)
        elif isinstance(event, TranscriptFinal) and event.text.strip():
            self._send(t.transcript, event.text, retain=True)
        elif isinstance(event, TurnDone):
            self._send(t.reply, event.reply, retain=True)
            stages = event.trace.get("stages_ms", {})
            stage = next((s for s in ("voice_to_voice", "text_to_voice") if s in stages), None)
            if stage is not None:
                self._send(t.latency, {"ms": stages[stage], "stage": stage, "session": session_id,
                                       "turn_id": event.turn_id, "over_budget": event.trace.get("over_budget", [])},
                           retain=True)
            self._send(t.turn, {"session": session_id, "turn_id": event.turn_id, "transcript": event.transcript,
                                "reply": event.reply, "interrupted": event.interrupted, "trace": event.trace})
        elif isinstance(event, ActionRequested):
            self._action(session_id, event)
        elif isinstance(event, TurnError):
            self._error("turn", f"turn {event.turn_id} failed in {event.stage}: {event.message}",
                        session=session_id, turn_id=event.turn_id, stage=event.stage)

    def _action(self, session_id: str, request: ActionRequested) -> None:
        """Publish an allowed action; refuse anything else. The allow-list is checked again here: the request
        may come from any session, and only this check stands between the model and the home."""
        reason = request.reason
        if request.allowed and request.payload not in self.allowed.get(request.topic, []):
            reason = f"{request.topic!r} {request.payload!r} is not on this bridge's mqtt.allowed_actions"
        elif request.allowed:
            self._send(request.topic, request.payload)
            self._send(self.topics.action, {"topic": request.topic, "payload": request.payload,
                                            "session": session_id})
            log.info("home action", extra={"topic": request.topic, "payload": request.payload})
            return
        self._error("action", f"action refused: {reason or 'not allowed'}", topic=request.topic,
                    payload=request.payload, session=session_id)
        log.warning("home action refused", extra={"topic": request.topic, "payload": request.payload,
                                                  "reason": reason})


def _explain(exc: aiomqtt.MqttError, cfg) -> str:
    """The connection error, with the setting to look at."""
    text = str(exc)
    lowered = text.lower()
    if "not authori" in lowered or "bad user" in lowered or "credentials" in lowered:
        return f"{text}; fix: check mqtt.username and mqtt.password (the broker refused them)"
    if "certificate" in lowered or "ssl" in lowered or "tls" in lowered:
        return f"{text}; fix: check mqtt.tls, mqtt.ca_file (the CA that signed the broker's certificate) and mqtt.host"
    if "refused" in lowered or "connect" in lowered or "errno" in lowered:
        return f"{text}; fix: check that the broker runs at mqtt.host:mqtt.port ({cfg.host}:{cfg.port})"
    return text
