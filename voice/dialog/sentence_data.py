"""Home Assistant's sentence data for a language, with ours merged in (voice/dialog/sentences/), and what that data
says about kinds of devices: a cover's class, and the words that name a kind rather than a device."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hassil import Intents
from home_assistant_intents import get_intents

SENTENCES = Path(__file__).parent / "sentences"

# the two kinds of sentence that ask for nothing now (``not_now`` in the sentence data), by intent name
LATER_SHAPE, NEVER_SHAPE = "SpecvoiceLater", "SpecvoiceNotNow"
NOT_NOW = {LATER_SHAPE: "later", NEVER_SHAPE: "never"}
DOMAINS = frozenset({"light", "switch", "fan", "cover", "lock", "climate", "media_player", "valve", "vacuum"})


def device_class(name: str, aliases: Sequence[str], language: str = "en") -> str | None:
    """A cover's class as Home Assistant's ``cover_classes`` list names it ("blind" for "bay window blinds"): the
    list's own words, found in the name or an alias; None when none is there."""
    said = [f" {n.casefold()} " for n in (name, *aliases)]
    found = [
        (s.rfind(f" {form} ") + len(form), len(form), str(value.get("out")))
        for value in language_data(language).get("lists", {}).get("cover_classes", {}).get("values", [])
        for form in _forms(str(value.get("in", "")))
        for s in said
        if f" {form} " in s
    ]
    return max(found)[2] if found else None  # the word the name ends on, the longest: "garage door" is a garage


def _forms(template: str) -> list[str]:
    """The plain forms of a list entry like "blind[s]" (both) or "garage door[s]"."""
    if "[" not in template:
        return [template.casefold()]
    stem, _, rest = template.partition("[")
    optional, _, after = rest.partition("]")
    return [f"{stem}{after}".casefold(), f"{stem}{optional}{after}".casefold()]


@functools.cache
def language_data(language: str) -> dict[str, Any]:
    """Home Assistant's sentences for the language with ours merged in (both as hassil reads them)."""
    data = get_intents(language)
    if data is None:
        raise ValueError(
            f"home-assistant-intents has no sentences for language {language!r} (stt.language); fix: one of "
            "Home Assistant's languages, e.g. 'en', or no mqtt.devices"
        )
    data = {**data, "intents": dict(data["intents"]), "expansion_rules": dict(data.get("expansion_rules", {}))}
    ours_path = SENTENCES / f"{language}.yaml"
    if ours_path.exists():
        ours = yaml.safe_load(ours_path.read_text())
        for name, intent in ours.get("intents", {}).items():
            known = data["intents"].get(name, {"data": []})
            data["intents"][name] = {**known, "data": [*known["data"], *intent["data"]]}
        data["expansion_rules"].update(ours.get("expansion_rules", {}))
        data["lists"] = {**data.get("lists", {}), **ours.get("lists", {})}
        data["sample_rules"] = ours.get("sample_rules", {})
        data["value_forms"] = ours.get("value_forms", {})
        data["not_now"] = ours.get("not_now", {})
        data["pronouns"] = ours.get("pronouns", [])
        data["skip_words"] = [*data.get("skip_words", []), *ours.get("skip_words", [])]
    return data


@functools.cache
def intents_for(language: str) -> Intents:
    return Intents.from_dict(language_data(language))


@functools.cache
def not_now_for(language: str) -> Intents | None:
    """The shapes of a sentence that asks for nothing now (a condition or a later time; a negation, words taken
    back, someone else's words), as two intents of their own: read apart from the commands, so that their wildcards
    never slow the matching of a command. None when the language has none."""
    shapes = language_data(language).get("not_now") or {}
    intents = {name: {"data": [{"sentences": shapes[key]}]} for name, key in NOT_NOW.items() if shapes.get(key)}
    if not intents:
        return None
    data = language_data(language)
    return Intents.from_dict(
        {
            "language": language,
            "intents": intents,
            "lists": shapes.get("lists", {}),
            "expansion_rules": {**data.get("expansion_rules", {}), **shapes.get("expansion_rules", {})},
            "skip_words": data.get("skip_words", []),
        }
    )


@functools.cache
def kind_words(language: str) -> frozenset[str]:
    """The words that say what kind of thing a device is ("lamp", "blinds", "lock", "fan"): those of Home
    Assistant's rules for lights and lockable things, its cover classes, and the domains' own names."""
    data = language_data(language)
    rules = data.get("expansion_rules", {})
    said = " ".join(re.sub(r"<[^>]*>|\[s\]", " ", str(rules.get(rule, ""))) for rule in ("light", "lockable"))
    words = {w for w in re.findall(r"[^\W\d_]+", said.casefold()) if len(w) > 1}
    classes = data.get("lists", {}).get("cover_classes", {}).get("values", [])
    words |= {form.split()[-1] for value in classes for form in _forms(str(value.get("in", "")))}
    words |= {w for domain in DOMAINS for w in domain.split("_")}
    return frozenset(words | {f"{w}s" for w in words if not w.endswith("s")})
