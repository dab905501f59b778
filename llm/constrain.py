"""A short constrained decode inside a free reply: after a trigger text, only one of a few given continuations.

Why: the model decides freely whether to act (it writes the trigger, e.g. ``[ACTION``), but the few tokens after
it must name something that exists; measured on `specvoice bench home`, most wrong actions of the markers format
were invented topics ("home/living_room/ceiling_lamp/set" for the ceiling light), each then refused. From the
token after the trigger until a continuation is complete, the target's choice is taken among the tokens that keep
the text on one of the continuations (their token trie); elsewhere nothing changes.

An ``opening`` is a constrained stretch from the reply's first token, with no trigger: a caller that already knows
what the reply must start with (a home command the user's words decide alone, voice/dialog/home.py ``opening``)
has the model write it, then go on freely; the trigger rule holds after it as before.

How it meets speculation: no drafted token may complete the trigger (``free_drafts`` cuts the draft before it), so
only a step's own target token can; the steps after it are single constrained target passes (``allowed``), which
the generation runs instead of draft + verify, and where the continuation leaves one way on (``forced``) its
tokens are fed and committed in one pass. The continuations are tokenized on their own: the trigger ends a
word, so a continuation starting with a space tokenizes as it would in the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TAIL_TOKENS = 6  # tokens decoded to look for the trigger at the end of the text (it is shorter than this)


class ChoiceConstraint:
    """After ``trigger`` (case-insensitive), the text continues with one of ``choices``; with an ``opening``, the
    text starts with one of those."""

    def __init__(self, tokenizer: Any, trigger: str, choices: list[str], opening: Sequence[str] = ()) -> None:
        if not choices and not opening:
            raise ValueError("a choice constraint needs at least one choice or opening")
        self.tokenizer, self.trigger = tokenizer, trigger.upper()
        self.next = _trie(tokenizer, choices)  # token prefix of a choice -> the tokens that can follow
        self._opening = _trie(tokenizer, opening) if opening else None  # the same for the opening, until it is out
        self._armed_at: int | None = 0 if opening else None  # where in the new tokens the continuation started
        self._done_at = 0  # tokens before this were decided: the trigger is looked for after it
        self.used = 0  # constrained tokens chosen, for tests and benchmarks

    def _ends_with_trigger(self, tokens: list[int]) -> bool:
        if len(tokens) <= self._done_at:
            return False
        tail = tokens[max(self._done_at, len(tokens) - TAIL_TOKENS) :]
        return self.tokenizer.decode(tail).upper().endswith(self.trigger)

    def allowed(self, new_tokens: list[int]) -> list[int] | None:
        """The tokens the next one may be (None: any; the decode is free here)."""
        if self._armed_at is None:
            if not self._ends_with_trigger(new_tokens):
                return None
            self._armed_at = len(new_tokens)
        trie = self._opening if self._opening is not None else self.next
        following = trie.get(tuple(new_tokens[self._armed_at :]))
        if following is None:  # a continuation is complete (or the text left them): free again after it
            self._armed_at, self._done_at, self._opening = None, len(new_tokens), None
            return None
        self.used += 1
        return sorted(following)

    def forced(self, new_tokens: list[int]) -> list[int]:
        """The tokens that must come next, as far as the continuation leaves only one way on ([] where it leaves
        a choice, or the decode is free). Call it after ``allowed``: the generation feeds and commits them in one
        pass instead of one pass each (a 13-token marker opening: one pass, not 13)."""
        if self._armed_at is None:
            return []
        trie = self._opening if self._opening is not None else self.next
        path, run = list(new_tokens[self._armed_at :]), []
        while (following := trie.get(tuple(path))) is not None and len(following) == 1:
            run.append(token := next(iter(following)))
            path.append(token)
        self.used += max(len(run) - 1, 0)  # ``allowed`` counted the first
        return run

    def free_drafts(self, new_tokens: list[int], drafts: list[int]) -> int:
        """How many of ``drafts`` may be verified freely: those before the one that would complete the trigger."""
        if self._armed_at is not None:
            return 0
        for i in range(len(drafts)):
            if self._ends_with_trigger(new_tokens + drafts[: i + 1]):
                return i
        return len(drafts)


def _trie(tokenizer: Any, choices: Sequence[str]) -> dict[tuple[int, ...], set[int]]:
    """Each token prefix of a choice -> the tokens that can follow it. Each choice is tokenized on its own."""
    trie: dict[tuple[int, ...], set[int]] = {}
    for choice in choices:
        ids = tokenizer.encode(choice, add_special_tokens=False)
        for i in range(len(ids)):
            trie.setdefault(tuple(ids[:i]), set()).add(ids[i])
    return trie
