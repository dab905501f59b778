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
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
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
