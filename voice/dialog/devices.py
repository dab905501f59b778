"""A device of the named home (``mqtt.devices``), and how the user's words name it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from voice.dialog.wording import words


@dataclass(frozen=True)
class HomeDevice:
    """One device the assistant may command: ``payloads`` are the allow-list for ``topic``."""

    name: str
    topic: str
    payloads: tuple[str, ...]
    area: str | None = None
    state_topic: str | None = None

    @property
    def kind(self) -> str:
        """The last word of the name ("light" for "counter lights"): what "the lights in the kitchen" matches."""
        return words(self.name)[-1]

    def named_in(self, said: Sequence[str], plurals: set[str]) -> bool:
        """The words name this device: its name's words in a row, or all of its area's words and its kind said
        in the plural ("the lights in the kitchen"). Only the plural: "the kitchen light lamp" names the kitchen
        light, not the kitchen's counter lights (measured: the model switched those too). In a row: "Light up
        minor, Ceiling lamp in nursery." names no ceiling light (it was switched on in a spoken run)."""
        name = words(self.name)
        if any(list(said[i : i + len(name)]) == name for i in range(len(said) - len(name) + 1)):
            return True
        return bool(self.area) and set(words(self.area or "")) <= set(said) and self.kind in plurals
