"""How people say a device's name besides the name itself: in part, without the words of its room, head word
first ("the door of the cellar"), with its room before it. Each form is a slot value of the matcher's ``{name}``
list (voice/dialog/understanding.py), given to one device only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from voice.dialog.devices import HomeDevice

Spelling = tuple[str, int, dict[str, Any]]  # what is said, the device's index, the device's context


def partial_names(devices: Sequence[HomeDevice]) -> list[tuple[str, int, dict[str, Any], str]]:
    """Each name of several words without its first or its last word ("side gate" of "side gate lock"), where
    that part belongs to one device only and is no area's or floor's name; with the last word it drops ("" for
    the first: "the door" for the garage door is no sure name)."""
    places = {p.casefold() for d in devices for p in (d.area, d.floor) if p}
    found: dict[str, set[int]] = {}
    dropped: dict[str, str] = {}
    for i, d in enumerate(devices):
        for name in (d.name, *d.aliases):
            words = name.casefold().split()
            for part, word in ((words[1:], ""), (words[:-1], words[-1])) if len(words) > 1 else ():
                found.setdefault(" ".join(part), set()).add(i)
                dropped[" ".join(part)] = word
    whole = {n.casefold() for d in devices for n in (d.name, *d.aliases)}
    return [
        (part, i, {"domain": devices[i].domain}, dropped[part])
        for part, owners in found.items()
        if len(owners) == 1 and part not in places and part not in whole
        for i in owners
    ]


def without_area(devices: Sequence[HomeDevice], kinds: frozenset[str], places: set[str]) -> list[Spelling]:
    """Each name that opens with words of its device's own area, without them ("skylight" for the loft skylight in
    the loft, "chandelier" for the dining chandelier in the dining room), where what is left belongs to that device
    only, is no place's name, and is more than a kind word ("lamp" for the lounge lamp could be any lamp)."""
    found: dict[str, set[int]] = {}
    for i, d in enumerate(devices):
        area = set((d.area or "").casefold().split())
        for name in (d.name, *d.aliases):
            words = name.casefold().split()
            while words and words[0] in area:
                words = words[1:]
            rest = " ".join(words)
            if rest and rest != name.casefold() and not set(words) <= kinds and rest not in places:
                found.setdefault(rest, set()).add(i)
    whole = {n.casefold() for d in devices for n in (d.name, *d.aliases)}
    return [
        (rest, i, {"domain": devices[i].domain})
        for rest, owners in found.items()
        if len(owners) == 1 and rest not in whole
        for i in owners
    ]


def said_otherwise(names: Sequence[Spelling], devices: Sequence[HomeDevice]) -> list[Spelling]:
    """The same names in the other orders people use: its head word with "of" before its other words ("the door
    of the cellar" for the cellar door), and its area before it ("the bathroom floor heating"). Only ones that
    say no other device's name."""
    taken = {said.casefold() for said, _, _ in names}
    out: dict[str, Spelling] = {}
    for said, i, context in names:
        words = said.casefold().split()
        forms = [
            f"{' '.join(words[k:])} of{the} {' '.join(words[:k])}" for k in range(1, len(words)) for the in ("", " the")
        ]
        area = (devices[i].area or "").casefold()
        if area and not said.casefold().startswith(area):
            forms.append(f"{area} {said.casefold()}")
        for form in forms:
            if form not in taken:
                out.setdefault(form, (form, i, context))
    return list(out.values())
