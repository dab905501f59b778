"""The MQTT bridge's commands: a bounded queue, run one at a time, each on the session it belongs to.

Why bounded: any client can publish; an unbounded queue is a memory leak on demand and hours of speech. A full
queue refuses the command and says so on ``<p>/error`` (kind ``busy``).

Sessions: ``say`` and event announcements speak on the bridge's own session (no history is touched); an ``ask``
with a ``conversation_id`` continues that conversation (one session each, at most ``mqtt.max_conversations``, the
least recently used closed first; idle longer than ``mqtt.conversation_idle_s``: it starts afresh); an ``ask``
without one starts a fresh history, so one household member never reads another's questions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from voice.events import Event, ReplyAudio, TurnDone
from voice.tasks import Tasks, cancel_and_wait, start
from voice.transports.mqtt.payloads import Command

log = logging.getLogger("specvoice.mqtt")


class CommandRunner:
    def __init__(self, bridge: Any) -> None:
        self.bridge = bridge  # voice.transports.mqtt.bridge.MqttBridge: config, assistant, sink, _send, _error, topics
        self.cfg = bridge.cfg
        self.queue: asyncio.Queue[Command] = asyncio.Queue(maxsize=self.cfg.max_queued_commands)
        self.speaker: Any = None  # the bridge's own session
        self.conversations: OrderedDict[str, tuple[Any, float]] = OrderedDict()
        self.local: list[Any] = []  # the home device's sessions (stopped by <p>/cancel too)
        self.saying: set[str] = set()  # sessions speaking a fixed text now (no reply to publish)
        self.current: asyncio.Task | None = None
        self.current_kind = ""
        self.current_session: Any = None
        self._audio_samples = 0
        self._tasks = Tasks()

    def start(self, new_session: Callable[[str], Any]) -> asyncio.Task:
        self._new_session = new_session
        self.speaker = new_session("mqtt")
        return start(self._work(), name="mqtt commands")

    async def close(self) -> None:
        for session in [self.speaker, *(s for s, _ in self.conversations.values())]:
            if session is not None:
                await session.close()

    def on_session_event(self, event: Event) -> None:
        if isinstance(event, ReplyAudio):
            self._audio_samples += len(event.samples)

    def enqueue(self, command: Command) -> None:
        try:
            self.queue.put_nowait(command)
        except asyncio.QueueFull:
            self.bridge._error(
                "busy",
                f"{self.queue.maxsize} commands are already waiting, so this "
                f"{command.kind} was refused; fix: send it again once the assistant is idle "
                "(see <p>/state), or raise mqtt.max_queued_commands",
                topic=command.source,
                id=command.id,
            )
            self.bridge._quiet.warning("busy", "mqtt command refused: queue full", topic=command.source)

    def cancel_soon(self, *, local: bool) -> None:
        self._tasks.spawn(self.cancel(local=local))

    async def cancel(self, *, local: bool) -> None:
        """Stop the command in progress (and, for <p>/cancel, the local device's reply too)."""
        if self.current is not None and not self.current.done() and self.current_kind == "say":
            await cancel_and_wait(self.current)  # a say ends here (an ask ends with its turn, as interrupted)
        if self.current_session is not None:
            await self.current_session.cancel()
        for session in self.local if local else []:
            await session.cancel()

    async def _work(self) -> None:
        """One command at a time, in arrival order."""
        while True:
            command = await self.queue.get()
            self.current_kind = command.kind
            self.current = start(self._run(command))
            try:
                await asyncio.shield(self.current)
            except asyncio.CancelledError:
                if not self.current.cancelled():  # the bridge itself is stopping
                    await cancel_and_wait(self.current)
                    raise
            except Exception as exc:
                log.exception("mqtt command failed", extra={"kind": command.kind})
                self.bridge._error(
                    "command", f"{command.kind} failed: {type(exc).__name__}: {exc}", topic=command.source
                )
            finally:
                self.current_session = None

    async def session_for(self, command: Command) -> Any:
        now = time.monotonic()
        if command.kind == "ask" and command.conversation is not None:
            key = command.conversation
            session, last = self.conversations.pop(key, (None, now))
            if session is not None and now - last > self.cfg.conversation_idle_s:
                await forget_history(session)
            if session is None:
                session = self._new_session(f"mqtt-{key}")
                while len(self.conversations) >= self.cfg.max_conversations:
                    _, (oldest, _) = self.conversations.popitem(last=False)
                    self.bridge.assistant.spawn(oldest.close())
            self.conversations[key] = (session, now)
            return session
        if command.kind == "ask":
            await forget_history(self.speaker)
        return self.speaker

    async def _run(self, command: Command) -> None:
        bridge, topics = self.bridge, self.bridge.topics
        self._audio_samples = 0
        rate = bridge.assistant.tts_sample_rate
        session = self.current_session = await self.session_for(command)
        if command.kind == "say":
            interrupted = False
            self.saying.add(session.id)
            try:
                await session.say(command.text)
            except asyncio.CancelledError:
                interrupted = True
            finally:
                self.saying.discard(session.id)
            bridge._send(
                topics.spoken,
                {
                    "text": command.text,
                    "source": command.source,
                    "audio_s": round(self._audio_samples / rate, 3),
                    "interrupted": interrupted,
                },
            )
            return
        done: TurnDone = await session.ask(command.text, speak=command.speak)
        bridge._send(
            topics.answer,
            {
                "id": command.id,
                "question": command.text,
                "reply": done.reply,
                "conversation_id": command.conversation,
                "turn_id": done.turn_id,
                "interrupted": done.interrupted,
                "audio_s": round(self._audio_samples / rate, 3),
            },
        )


async def forget_history(session: Any) -> None:
    """A fresh conversation on a kept session: only the system prompt stays (its KV cache stays warm; the rest
    of the caches falls outside the next prompt's common prefix and is cropped). A reply still running (the
    device's own turn, a turn the room kept open) is stopped first, as the new question would stop it."""
    await session.cancel()
    session.conversation.forget()
