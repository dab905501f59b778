"""Home commands on their way to the broker: sent once and soon, or reported as not done.

A command is what a person is waiting on ("turn on the kitchen light"), so it is not like the bridge's other
messages. It goes ahead of everything else, the outbox's bound never drops it, and it is never sent late: a
command the broker has not taken within ``mqtt.command_timeout_s`` (the broker away, the connection slow to come
back) is withdrawn, because a light that switches minutes after it was asked for is a surprise, not a service.
A command in flight when the connection drops may or may not have reached the broker. Sending it again on the
next connection could switch the device twice, so it is not sent again. Either way the person is told: the error
topic names the command, and the home device's own sessions say it aloud (``CommandDelivery.not_done``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from voice.transports.mqtt.outbox import Outbox
from voice.transports.mqtt.payloads import Outgoing, Priority

log = logging.getLogger("specvoice.mqtt")


@dataclass(eq=False)
class HomeCommand(Outgoing):
    """A home action for the broker, and the session whose turn asked for it."""

    session: str = ""
    priority: Priority = Priority.COMMAND


@dataclass(frozen=True)
class NotDone:
    """A command that did not happen, or may not have: ``sure`` is False when it was lost in flight."""

    command: HomeCommand
    sure: bool

    @property
    def reason(self) -> str:
        if self.sure:
            return "not sent: the broker did not take it in time (mqtt.command_timeout_s); it will not be sent later"
        return "the connection to the broker dropped while it was being sent; it may not have been done"


class CommandDelivery:
    """Puts commands in the outbox with a deadline, and reports each one that misses it or is lost."""

    def __init__(self, outbox: Outbox, timeout_s: float, not_done: Callable[[NotDone], None]) -> None:
        self.outbox = outbox
        self.timeout_s = timeout_s
        self.not_done = not_done
        self._deadlines: dict[HomeCommand, asyncio.TimerHandle] = {}
        self._in_flight: HomeCommand | None = None

    def send(self, topic: str, payload: str, session: str) -> None:
        command = HomeCommand(topic, payload, session=session)
        self.outbox.put(command)
        loop = asyncio.get_running_loop()
        self._deadlines[command] = loop.call_later(self.timeout_s, self._expire, command)

    def sending(self, command: HomeCommand) -> None:
        """The publisher hands ``command`` to the broker now: its fate is the acknowledgement's."""
        self._in_flight = command

    def published(self, command: HomeCommand) -> None:
        self._in_flight = None
        self._forget(command)

    def lost(self, command: HomeCommand) -> None:
        """The connection dropped with ``command`` in flight: it leaves the outbox unsent-again."""
        self._in_flight = None
        self._forget(command)
        self.outbox.done(command)
        self.not_done(NotDone(command, sure=False))

    def withdraw(self, command: HomeCommand) -> None:
        """``command`` will not be sent (the broker cannot take it)."""
        self._forget(command)
        self.outbox.done(command)
        self.not_done(NotDone(command, sure=True))

    def close(self) -> None:
        """The bridge stops: what is still waiting is not done, and is said so in the log."""
        for command in list(self._deadlines):
            self._forget(command)
            log.warning("home command not sent: the bridge stopped", extra={"topic": command.topic})

    def _expire(self, command: HomeCommand) -> None:
        self._deadlines.pop(command, None)
        if command is self._in_flight:
            return  # the publish has a timeout of its own; a drop ends in ``lost``
        self.withdraw(command)

    def _forget(self, command: HomeCommand) -> None:
        timer = self._deadlines.pop(command, None)
        if timer is not None:
            timer.cancel()
