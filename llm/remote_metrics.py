"""The remote server's own speculative-decoding counters, read from its Prometheus page.

With ``llm.backend = "openai"`` the speculation happens on the server (vLLM with a draft model or EAGLE), so our
own drafted/accepted counters stay at zero; what the server counts is shown next to them instead. Only vLLM
publishes such counters today (``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
summed over their labels); a server without them (transformers serve, Ollama, SGLang, llama.cpp at the time of
writing) is "not reported", never zero. The counters are server-wide: with several front-ends or sessions at once,
the acceptance over a window covers everyone's requests in it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit, urlunsplit

from openai import AsyncOpenAI, NotFoundError
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("specvoice.llm.remote")

# our name -> the sample names a server uses for it (without the _total suffix a counter sample carries)
COUNTERS = {
    "drafts": ("vllm:spec_decode_num_drafts",),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
}
NOT_REPORTED = "not reported by the server"


@dataclass(frozen=True)
class SpecCounters:
    """The server's cumulative speculative-decoding counters at one moment."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float

    def window(self, before: SpecCounters | None) -> dict:
        """Acceptance since ``before`` (a previous reading; None: since the server started), as plain data."""
        base = before or SpecCounters(0, 0, 0)
        drafts, drafted = self.drafts - base.drafts, self.draft_tokens - base.draft_tokens
        accepted = self.accepted_tokens - base.accepted_tokens
        if drafts < 0 or drafted < 0:  # the server restarted: its counters began again
            drafts, drafted, accepted = self.drafts, self.draft_tokens, self.accepted_tokens
        return {
            "reported": True,
            **asdict(self),
            "window_acceptance": accepted / drafted if drafted > 0 else None,
            "window_mean_accepted_length": 1 + accepted / drafts if drafts > 0 else None,
        }


def parse_spec_counters(text: str) -> SpecCounters | None:
    """The counters in a Prometheus text page, or None when the page has none of them (not reported)."""
    found: dict[str, float] = {}
    wanted = {name: ours for ours, names in COUNTERS.items() for name in names}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in wanted and not sample.name.endswith("_created"):
                found[wanted[name]] = found.get(wanted[name], 0.0) + float(sample.value)
    if "draft_tokens" not in found or "accepted_tokens" not in found:
        return None
    return SpecCounters(found.get("drafts", 0.0), found["draft_tokens"], found["accepted_tokens"])


def default_metrics_url(base_url: str) -> str:
    """``http://host:8000/v1`` -> ``http://host:8000/metrics`` (where vLLM serves them)."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


class SpecScraper:
    """Reads the server's counters after a reply; remembers a server that has none so it stops asking."""

    def __init__(self, url: str | None) -> None:
        self.url = url or None  # "" or None: never scrape
        self.previous: SpecCounters | None = None
        self._absent = self.url is None

    async def read(self, client: AsyncOpenAI) -> dict:
        """The server's counters and the acceptance since the previous reading, or ``{"reported": False}``.
        Never raises: metrics are a side show, the reply itself was fine."""
        if self._absent or self.url is None:
            return {"reported": False, "note": NOT_REPORTED}
        try:
            text = await client.get(self.url, cast_to=str, options={"timeout": 2.0})
            counters = parse_spec_counters(text)
        except NotFoundError:
            counters = None
        except Exception as exc:  # unreachable, not Prometheus text
            log.info("server metrics unreadable", extra={"url": self.url, "error": repr(exc)})
            return {"reported": False, "note": f"{NOT_REPORTED} ({type(exc).__name__})"}
        if counters is None:
            self._absent = True
            log.info("server reports no speculative-decoding counters", extra={"url": self.url})
            return {"reported": False, "note": NOT_REPORTED}
        out = counters.window(self.previous)
        self.previous = counters
        return out
