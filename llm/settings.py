"""Plain data of the LLM core: how a reply is decoded (``DecodeSettings``), what it streams (``Emission``) and
what it measured (``DecodeStats``). The config's llm section becomes settings in exactly one place:
``DecodeSettings.from_config``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from llm.speculative import Generation, SamplingParams

Mode = Literal["draft", "ngram", "target"]
DraftLength = int | Literal["adaptive", "confidence"]


@dataclass
class DecodeSettings:
    """How one reply is decoded. temperature 0 = greedy (output identical to the target alone).

    draft_length: a fixed k; "adaptive" (k from measured costs and live acceptance); or "confidence" (draft
    until the draft's confidence makes another token not worth its cost, up to max_draft_length).
    """

    mode: Mode = "draft"
    draft_length: DraftLength = "adaptive"
    max_draft_length: int = 6
    draft_confidence: float | None = None  # confidence stop at a fixed threshold instead of the cost rule
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 96
    ngram_max: int = 3
    tree: bool = False  # token-tree verification (mode draft): the draft's chain plus its next-best siblings
    tree_width: int = 2  # candidates per depth in a tree: the chain token and tree_width - 1 alternatives
    tree_nodes: int = 7  # most tree nodes per target pass: the verify cost is flat to ~6-8 fed tokens on a CPU
    prefill_chunk: int = 128  # prompt tokens per prefill pass: a cancel lands within one chunk (0: one pass)

    def __post_init__(self) -> None:
        if self.mode not in ("draft", "ngram", "target"):
            raise ValueError(f"mode {self.mode!r} is not one of draft, ngram, target")
        if self.draft_length not in ("adaptive", "confidence") and (
            not isinstance(self.draft_length, int) or self.draft_length < 1
        ):
            raise ValueError(
                f"draft_length must be a positive integer, 'adaptive' or 'confidence', got {self.draft_length!r}"
            )
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and top_k >= 0")
        if self.tree_width < 1 or self.tree_nodes < 1:
            raise ValueError(f"need tree_width >= 1 and tree_nodes >= 1, got {self.tree_width}, {self.tree_nodes}")
        if self.max_draft_length < 1 or self.prefill_chunk < 0:
            raise ValueError(
                f"need max_draft_length >= 1 and prefill_chunk >= 0, got {self.max_draft_length}, {self.prefill_chunk}"
            )
        if self.draft_confidence is not None and not 0 < self.draft_confidence < 1:
            raise ValueError(f"draft_confidence must be between 0 and 1, got {self.draft_confidence}")

    @classmethod
    def from_config(cls, llm: dict[str, Any]) -> DecodeSettings:
        """From the config's llm section (as a dict); keys that are not decode settings are ignored."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in llm.items() if k in names})

    def but(self, **changes: Any) -> DecodeSettings:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def width(self) -> int:
        """Candidates per depth the draft proposes: tree_width for a tree, 1 for a chain."""
        return self.tree_width if self.tree and self.mode == "draft" else 1


@dataclass
class Emission:
    text: str
    token_ids: list[int]
    t: float  # time.monotonic() when the token was accepted (verified)


@dataclass
class DecodeStats:
    """One reply's numbers, as plain data (latency trace, logs, benchmark)."""

    mode: str
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens the target actually ran (the rest came from the kept cache)
    new_tokens: int = 0
    target_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_drafted: float = 0.0
    alpha_estimate: float = 0.0  # accepted / (accepted + rejections): per-token acceptance, geometric MLE
    mean_accepted_length: float = 0.0  # tokens committed per verifying target pass (1 + accepted/pass)
    tokens_per_s: float = 0.0  # new tokens / (last token time - request time), prefill included
    decode_tokens_per_s: float = 0.0  # tokens after the first / (last token time - first token time)
    ttft_s: float = 0.0
    total_s: float = 0.0
    draft_lengths: list[int] = field(default_factory=list)  # per verify step
    accepted_lengths: list[int] = field(default_factory=list)  # per verify step
    token_times: list[float] = field(default_factory=list)  # monotonic acceptance time of each new token

    @classmethod
    def from_generation(cls, gen: Generation, mode: str, start: float, prefill_tokens: int) -> DecodeStats:
        steps = gen.records[1:]  # the first record is the first token, from the prefill
        drafted = sum(r.drafted for r in steps)
        accepted = sum(r.accepted for r in steps)
        rejections = sum(1 for r in steps if r.accepted < r.drafted)
        times = [r.t for r in gen.records for _ in r.committed]
        end = times[-1] if times else start
        n = len(gen.new_tokens)
        first = gen.first_token_t
        return cls(
            mode=mode,
            prompt_tokens=len(gen.prompt),
            prefill_tokens=prefill_tokens,
            new_tokens=n,
            target_calls=gen.target_calls,
            drafted=drafted,
            accepted=accepted,
            accepted_per_drafted=accepted / drafted if drafted else 0.0,
            alpha_estimate=accepted / (accepted + rejections) if accepted + rejections else 0.0,
            mean_accepted_length=(n - len(gen.records[0].committed)) / len(steps) if steps else 0.0,
            tokens_per_s=n / (end - start) if end > start else 0.0,
            decode_tokens_per_s=(n - len(gen.records[0].committed)) / (end - first)
            if first is not None and end > first
            else 0.0,
            ttft_s=(first - start) if first is not None else 0.0,
            total_s=end - start,
            draft_lengths=[r.drafted for r in steps],
            accepted_lengths=[r.accepted for r in steps],
            token_times=times,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def log_line(self) -> str:
        return (
            f"llm {self.mode}: {self.new_tokens} tokens in {self.total_s:.2f}s ({self.tokens_per_s:.2f} tok/s, "
            f"decode {self.decode_tokens_per_s:.2f} tok/s), ttft {self.ttft_s * 1000:.0f} ms, prefill "
            f"{self.prefill_tokens}/{self.prompt_tokens} tokens, target calls {self.target_calls}, "
            f"accepted/drafted {self.accepted}/{self.drafted}, alpha {self.alpha_estimate:.2f}, "
            f"mean accepted length {self.mean_accepted_length:.2f}"
        )
