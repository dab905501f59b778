"""The conversation as a Realtime client sees it: items with ids, tied to the chat messages the model reads.

A client builds and edits the conversation with items (``conversation.item.create`` / ``.delete`` /
``.retrieve``): user, assistant and system messages, function calls and their outputs. Each item that the model
should read is one message in ``Conversation.messages`` (llm/engine.py), bound to its item by identity, so a
deletion removes exactly that message and the next prompt is rebuilt from what is left (the KV caches keep the
common prefix). Replies and spoken user turns are written into the history by the Turn (voice/dialog/turn.py); the
items of that turn are bound to the new messages afterwards (``adopt``).

Edits wait while a turn is running: the turn commits its exchange over the history it started from, so an edit
made meanwhile would be lost. They are applied, in order, when it ends (``settle``). A committed audio buffer
holds the queue until its transcript is ready, so items keep the order the client created them in.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from voice.ports import Chat
from voice.transports.realtime.events import Item
from voice.transports.realtime.wire import ClientError


@dataclass
class Entry:
    """One conversation item."""

    id: str
    type: str  # message | function_call | function_call_output
    role: str | None = None  # messages: user | assistant | system
    part: str = "input_text"  # the content part's type: input_text | input_audio | output_text | output_audio
    text: str | None = None  # what the item says, when no chat message holds it (yet)
    message: dict[str, Any] | None = None  # the chat message the model reads, when there is one
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    status: str = "completed"

    def to_json(self) -> dict[str, Any]:
        item: dict[str, Any] = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        if self.type == "function_call":
            item.update(call_id=self.call_id, name=self.name, arguments=self.arguments or "")
        elif self.type == "function_call_output":
            item.update(call_id=self.call_id, output=self.output or "")
        else:
            text = self.message["content"] if self.message is not None else self.text
            key = "transcript" if self.part in ("input_audio", "output_audio") else "text"
            item.update(role=self.role, content=[{"type": self.part, key: text}])
        return item


class Items:
    """The item store of one connection, and the queue of edits to its conversation's messages."""

    def __init__(self, conversation: Chat, busy: Callable[[], bool], *, max_items: int, max_chars: int) -> None:
        self.conversation = conversation
        self.busy = busy  # a turn (or an early reply) is running: edits to the messages must wait
        self.max_items, self.max_chars = max_items, max_chars
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self._queue: list[tuple[Callable[[], None], asyncio.Task[str] | None]] = []

    @property
    def last_id(self) -> str | None:
        return next(reversed(self.entries), None)

    def get(self, item_id: str, param: str = "item_id", event_id: str | None = None) -> Entry:
        entry = self.entries.get(item_id)
        if entry is None:
            raise ClientError(
                "item_not_found",
                f"no item {json.dumps(item_id[:64])} in this conversation; use an id from conversation.item.added",
                param=param,
                event_id=event_id,
            )
        return entry

    # ---- adding --------------------------------------------------------------------------------------------

    def add(
        self,
        entry: Entry,
        message: dict[str, Any] | None = None,
        *,
        after: str | None = None,
        transcript: asyncio.Task[str] | None = None,
    ) -> str | None:
        """Register an item (after ``after``, "root" = first, default last); its message joins the history now,
        or when the turn in progress ends, or when ``transcript`` is ready. Returns the previous item's id."""
        if entry.id in self.entries:
            raise ClientError(
                "item_id_exists",
                f"an item with id {json.dumps(entry.id[:64])} already exists; "
                "leave the id out and the server picks one",
                param="item.id",
            )
        anchor = self._anchor(after)
        previous = self.last_id
        self.entries[entry.id] = entry
        if after is not None and after != previous:
            self._place(entry.id, after)
            previous = None if after == "root" else after

        def join() -> None:
            nonlocal message
            if transcript is not None:
                text = transcript.result() if not transcript.cancelled() and transcript.exception() is None else ""
                entry.text = text
                message = {"role": "user", "content": text} if text.strip() else None
            if message is not None and entry.id in self.entries:
                entry.message = message
                self._insert(message, anchor)
            self._bound()

        self._queue.append((join, transcript))
        self.settle()
        return previous

    def _anchor(self, after: str | None) -> Entry | str | None:
        if after is None or after == self.last_id:
            return None
        if after == "root":
            return "root"
        return self.get(after, "previous_item_id")

    def _place(self, item_id: str, after: str) -> None:
        """Reorder the store so that item_id follows ``after`` (what previous_item_id asks for)."""
        order = [k for k in self.entries if k != item_id]
        at = 0 if after == "root" else order.index(after) + 1
        order.insert(at, item_id)
        for key in order:
            self.entries.move_to_end(key)

    def _insert(self, message: dict[str, Any], anchor: Entry | str | None) -> None:
        if anchor == "root":
            self.conversation.insert(message)
        elif isinstance(anchor, Entry) and anchor.message is not None:
            self.conversation.insert(message, after=anchor.message)  # at the end when that one is gone
        else:
            self.conversation.add(message)

    def _is_item(self, message: dict[str, Any]) -> bool:
        return any(e.message is message for e in self.entries.values())

    # ---- deleting, settling ----------------------------------------------------------------------------------

    def delete(self, item_id: str, event_id: str | None = None) -> None:
        entry = self.get(item_id, event_id=event_id)
        del self.entries[item_id]

        def remove() -> None:
            if entry.message is not None:
                self.conversation.remove(entry.message)

        self._queue.append((remove, None))
        self.settle()

    @property
    def _system(self) -> dict[str, Any] | None:
        """The session's instructions (the first message, when it is a system message no item holds)."""
        messages = self.conversation.messages
        if messages and messages[0]["role"] == "system" and not self._is_item(messages[0]):
            return messages[0]
        return None

    def settle(self, *, force: bool = False) -> None:
        """Apply the queued edits, in order, up to the first transcript that is not ready. ``force``: the caller
        knows the turn has committed (its TurnDone is being handled)."""
        if not force and self.busy():
            return
        while self._queue:
            fn, waits_for = self._queue[0]
            if waits_for is not None and not waits_for.done():
                return
            self._queue.pop(0)
            fn()

    async def ready(self) -> None:
        """Wait for every committed buffer's transcript, then apply what waited for them."""
        tasks = [t for _, t in self._queue if t is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.settle()

    # ---- after a turn ----------------------------------------------------------------------------------------

    def adopt(self, user_item: str | None, reply_item: str | None) -> None:
        """A turn has committed: bind its new messages (the user's words of a spoken turn, the reply) to their
        items, and forget bindings to messages the history dropped (the context limit)."""
        messages = self.conversation.messages
        alive = {id(m) for m in messages}
        for entry in self.entries.values():
            if entry.message is not None and id(entry.message) not in alive:
                entry.text, entry.message = entry.message.get("content"), None
        bound = {id(e.message) for e in self.entries.values() if e.message is not None}
        targets = {"user": user_item, "assistant": reply_item}
        for m in reversed(messages):  # the turn's messages are the newest ones
            target = targets.get(m["role"])
            if target is None or m is self._system:
                continue
            targets[m["role"]] = None  # only the newest message of each role can be the turn's
            if id(m) not in bound and target in self.entries and self.entries[target].message is None:
                self.entries[target].message = m
                bound.add(id(m))
        self._bound()

    def _bound(self) -> None:
        """Keep the store and the history bounded: the oldest items go first (as the context limit would drop
        them anyway), and the history's text stays under ``max_chars`` so building a prompt stays cheap."""
        while len(self.entries) > self.max_items:
            oldest = next(iter(self.entries))
            entry = self.entries.pop(oldest)
            if entry.message is not None and not self.busy():
                self.conversation.remove(entry.message)
        if self.busy():
            return
        messages = self.conversation.messages
        first = 1 if self._system is not None else 0
        while len(messages) - first > 1 and sum(len(str(m.get("content") or "")) for m in messages) > self.max_chars:
            dropped = messages[first]
            self.conversation.remove(dropped)
            text = dropped.get("content")
            for entry in self.entries.values():
                if entry.message is dropped:
                    entry.text, entry.message = text, None


def from_client(item: Item, item_id: str, event_id: str | None) -> tuple[Entry, dict[str, Any] | None]:
    """A client's conversation.item.create -> the item and the chat message the model reads (None: nothing to
    read, e.g. an empty assistant message). Function calls and their outputs use the chat-template convention
    (``tool_calls`` on an assistant message, a ``tool`` message), which every tool-aware template renders."""

    def bad(code: str, message: str, param: str) -> ClientError:
        return ClientError(code, message, param=param, event_id=event_id)

    if item.type == "function_call":
        if item.name is None:
            raise bad("invalid_value", "a function_call item needs the function's name", "item.name")
        arguments = item.arguments or "{}"
        try:
            parsed: Any = json.loads(arguments)
        except ValueError:
            parsed = arguments
        entry = Entry(
            item_id,
            "function_call",
            call_id=item.call_id or f"call_{item_id[-20:]}",
            name=item.name,
            arguments=arguments,
        )
        return entry, {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": item.name, "arguments": parsed}}],
        }
    if item.type == "function_call_output":
        if item.call_id is None or item.output is None:
            raise bad(
                "invalid_value",
                "a function_call_output item needs call_id and output",
                "item.call_id" if item.call_id is None else "item.output",
            )
        entry = Entry(item_id, "function_call_output", call_id=item.call_id, output=item.output)
        return entry, {"role": "tool", "content": item.output, "tool_call_id": item.call_id}
    if item.role is None:
        raise bad("invalid_value", "a message item needs a role: user, assistant or system", "item.role")
    texts, part = [], {"user": "input_text", "system": "input_text", "assistant": "output_text"}[item.role]
    for i, p in enumerate(item.content or []):
        if p.type == "input_image":
            raise bad(
                "unsupported_content",
                "images are not supported (the model reads text); send input_text",
                f"item.content.{i}.type",
            )
        spoken = p.type in ("input_audio", "output_audio", "audio")
        text = p.transcript if spoken else p.text
        if text is None and spoken:
            raise bad(
                "unsupported_content",
                "an audio part needs its transcript here; send speech with "
                "input_audio_buffer.append (the server transcribes it)",
                f"item.content.{i}.transcript",
            )
        if spoken:
            part = "input_audio" if item.role == "user" else "output_audio"
        texts.append(text or "")
    text = "\n".join(t for t in texts if t)
    if item.role == "user" and not text.strip():
        raise bad("invalid_value", "the user message has no text", "item.content")
    entry = Entry(item_id, "message", item.role, part, text=text)
    return entry, ({"role": item.role, "content": text} if text.strip() else None)
