"""The history of one chat as a voice turn needs it: one reply at a time, written once with what was heard.

A voice turn streams a reply with ``commit=False`` and then calls ``commit(heard_text)`` once (the words the
user actually heard), or ``discard()`` (a reply started early on a guess); a barge-in after the commit trims the
last assistant message (``trim_last_reply``). ``RemoteConversation`` keeps its history with this class; the
local ``Conversation`` (llm/conversation.py) builds on it and keeps its KV caches in step.
"""

from __future__ import annotations

from typing import Any


class ChatHistory:
    """``messages`` (system first) and the bookkeeping of the reply in flight."""

    def __init__(self, system_prompt: str) -> None:
        self._system: dict[str, Any] | None = {"role": "system", "content": system_prompt} if system_prompt else None
        self.messages: list[dict[str, Any]] = [self._system] if self._system is not None else []
        self._busy = False  # a reply is streaming
        self._pending: list[dict[str, Any]] | None = None  # reply(commit=False): the history it answers, until commit()
        self._before_turn: list[dict[str, Any]] | None = None  # the messages before the latest reply (forget_last_turn)

    @property
    def uncommitted(self) -> bool:
        return self._pending is not None

    def commit(self, heard_text: str) -> None:
        """The latest ``reply(commit=False)`` joins the history: the user's words, and the reply as far as the user
        heard it (no assistant message when nothing was heard)."""
        if self._busy:
            raise RuntimeError("a reply is still streaming; fix: let it end or cancel it, then commit")
        if self._pending is None:
            raise ValueError("there is no uncommitted reply; fix: call reply(..., commit=False) first")
        self._before_turn = list(self.messages)
        self.messages[:] = self._pending + ([{"role": "assistant", "content": heard_text}] if heard_text else [])
        self._pending = None

    def discard(self) -> None:
        """Forget the latest ``reply(commit=False)``: the history stays as it was."""
        self._pending = None

    def set_system(self, prompt: str) -> None:
        """The system prompt from now on. Its own message keeps its place (other system messages, a client's
        conversation items, are not it); gone or never there, it comes back first."""
        if self._system is not None and any(m is self._system for m in self.messages):
            self._system["content"] = prompt
        else:
            self._system = {"role": "system", "content": prompt}
            self.messages.insert(0, self._system)

    def add(self, message: dict[str, Any]) -> None:
        """One more message after the history (an assistant's tool calls in the chat template's form, a
        function's output): never while a reply streams, and never between a reply and its commit."""
        if self._busy or self._pending is not None:
            raise RuntimeError("a reply is in flight; fix: add messages after its commit (or discard)")
        self.messages.append(message)

    def insert(self, message: dict[str, Any], after: dict[str, Any] | None = None) -> None:
        """``message`` right after ``after`` (that very message), or first after the system prompt (None); at
        the end when ``after`` is no longer there. A client that edits the conversation (a realtime client's
        items) writes through this and ``remove``, between replies."""
        if self._busy or self._pending is not None:
            raise RuntimeError("a reply is in flight; fix: edit the history after its commit (or discard)")
        first = 1 if self.messages and self.messages[0] is self._system else 0
        at = first if after is None else next((i + 1 for i, m in enumerate(self.messages) if m is after), None)
        self.messages.insert(len(self.messages) if at is None else at, message)

    def remove(self, message: dict[str, Any]) -> bool:
        """Take ``message`` (that very one) out of the history; False when it is not there."""
        if self._busy or self._pending is not None:
            raise RuntimeError("a reply is in flight; fix: edit the history after its commit (or discard)")
        for i, m in enumerate(self.messages):
            if m is message:
                del self.messages[i]
                return True
        return False

    def forget(self) -> None:
        """A fresh conversation: only the system prompt stays."""
        if self._busy:
            raise RuntimeError("a reply is still streaming; fix: cancel it and wait for it to end first")
        self.messages[:] = [m for m in self.messages if m["role"] == "system"]
        self._pending = self._before_turn = None

    def forget_last_turn(self) -> None:
        """Undo the latest committed turn entirely, its user message too."""
        if self._busy:
            raise RuntimeError("a reply is still streaming; fix: cancel it and wait for it to end first")
        if self._before_turn is None:
            raise ValueError("there is no reply to forget")
        self.messages[:], self._before_turn = self._before_turn, None

    def trim_last_reply(self, spoken_text: str) -> None:
        """The last assistant message becomes what the user heard (a prefix of it, word by word): the next
        prompt carries only that."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("there is no assistant reply to trim; fix: call trim_last_reply after a reply")
        kept = _spoken_prefix(self.messages[-1]["content"], spoken_text)
        if kept is None:
            raise ValueError(
                f"spoken text {spoken_text[:60]!r} is not a prefix of the last reply "
                f"{self.messages[-1]['content'][:60]!r}; fix: pass the words that were actually played"
            )
        self.messages[-1]["content"] = kept


def _spoken_prefix(reply: str, spoken: str) -> str | None:
    """The part of reply that was spoken: exact prefix, or the reply up to the end of the spoken words."""
    if reply.startswith(spoken):
        return spoken
    words = spoken.split()
    pos = 0
    for word in words:
        found = reply.find(word, pos)
        if found < 0 or reply[pos:found].strip():
            return None
        pos = found + len(word)
    return reply[:pos]
