"""The history's own write methods (llm/history.py): the only way voice/ changes a chat's messages."""

from __future__ import annotations

import pytest

from llm.history import ChatHistory


def _contents(history: ChatHistory) -> list[str]:
    return [m["content"] for m in history.messages]


def test_a_new_system_prompt_replaces_its_own_message_and_comes_back_first_when_gone():
    history = ChatHistory("be brief")
    client_system = {"role": "system", "content": "a client's note"}
    history.insert(client_system)  # after the system prompt
    history.set_system("be kind")
    assert _contents(history) == ["be kind", "a client's note"]
    assert history.remove(history.messages[0])
    history.set_system("be brief again")  # the client's note is not the session's prompt
    assert _contents(history) == ["be brief again", "a client's note"]


def test_insert_places_a_message_after_another_or_at_the_end_when_that_one_is_gone():
    history = ChatHistory("sys")
    first, second = {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
    history.add(first)
    history.add(second)
    history.insert({"role": "user", "content": "between"}, after=first)
    history.insert({"role": "user", "content": "root"})
    assert _contents(history) == ["sys", "root", "a", "between", "b"]
    gone = {"role": "user", "content": "gone"}
    history.insert({"role": "user", "content": "last"}, after=gone)
    assert _contents(history)[-1] == "last"
    assert not history.remove(gone)


def test_nothing_is_written_between_a_reply_and_its_commit():
    history = ChatHistory("sys")
    history._pending = [*history.messages, {"role": "user", "content": "hi"}]  # as reply(commit=False) leaves it
    for write in (
        lambda: history.add({"role": "user", "content": "x"}),
        lambda: history.insert({"role": "user", "content": "x"}),
        lambda: history.remove(history.messages[0]),
    ):
        with pytest.raises(RuntimeError, match="in flight"):
            write()
    history.commit("hello")
    history.add({"role": "tool", "content": "42"})
    assert _contents(history) == ["sys", "hi", "hello", "42"]


def test_forget_keeps_only_the_system_prompt():
    history = ChatHistory("sys")
    history.add({"role": "user", "content": "hi"})
    history.forget()
    assert _contents(history) == ["sys"]
    with pytest.raises(ValueError, match="no reply to forget"):
        history.forget_last_turn()
