"""Plain data of the LLM core: how the models are loaded (``LoadSettings``), how a reply is decoded
(``DecodeSettings``), what it streams (``Emission``) and what it measured (``DecodeStats``).

This module owns every default of the llm settings: the config (voice/config.py) and the engines read them
from here, so a default is written once. The config's llm section becomes settings in exactly one place
each: ``LoadSettings.from_config`` and ``DecodeSettings.from_config``. No torch at import: the config loads
without it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from llm.sampling import SamplingParams

Mode = Literal["draft", "ngram", "target"]
DraftLength = int | Literal["adaptive", "confidence"]
EngineKind = Literal["llama.cpp", "torch"]
Dtype = Literal["float32", "bfloat16", "float16"]
DraftQuantize = Literal["none", "int8", "int4"]
TargetQuantize = Literal["none", "int4"]
Compile = Literal["off", "draft", "both"]

HISTORY_TOKENS = 1536  # a conversation's history budget in tokens: the oldest turns are dropped beyond it


def _known(cls: type, llm: dict[str, Any]) -> dict[str, Any]:
    """The keys of the config's llm section that are fields of cls (the rest belong to other settings)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in llm.items() if k in names}


def default_engine(device: str) -> EngineKind:
    """The engine when none is named: llama.cpp on the CPU (GGUF on its kernels), torch on a GPU."""
    return "llama.cpp" if device == "cpu" else "torch"


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
        return cls(**_known(cls, llm))

    def but(self, **changes: Any) -> DecodeSettings:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @property
    def sampling(self) -> SamplingParams:
        from llm.sampling import SamplingParams  # torch: imported when a reply is decoded, not with the config

        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def width(self) -> int:
        """Candidates per depth the draft proposes: tree_width for a tree, 1 for a chain."""
        return self.tree_width if self.tree and self.mode == "draft" else 1


@dataclass(frozen=True)
class LoadSettings:
    """How the models are loaded: the config's llm section, its load keys (the decode keys are
    ``DecodeSettings``'). The defaults are the product's (the config takes them from here)."""

    engine: EngineKind | None = None  # None: ``default_engine(device)``
    device: str = "cpu"
    dtype: Dtype = "bfloat16"
    threads: int | None = None  # LLM compute threads; None: all cores (llama.cpp: those others leave free)
    mode: Mode = DecodeSettings.mode  # without a draft model unless "draft"
    draft_quantize: DraftQuantize = "int4"  # the draft need not be exact: verification keeps the output exact
    target_quantize: TargetQuantize = "none"
    draft_vocab: int | None = None  # rows of the draft's reduced head; None: the full vocabulary
    context_limit: int = 4096  # the longest prompt + reply, in tokens
    huge_pages: bool = True  # llama.cpp: the weights in huge pages after the load (llm/huge_pages.py)
    compile: Compile = "off"  # torch.compile the decode step (see Engine)
    compile_mode: str = "default"
    static_cache: int = 0  # positions of a preallocated cache (CUDA graphs); 0: a growing cache

    @classmethod
    def from_config(cls, llm: dict[str, Any]) -> LoadSettings:
        """From the config's llm section (as a dict); keys that are not load settings are ignored."""
        return cls(**_known(cls, llm))

    @property
    def engine_kind(self) -> EngineKind:
        return self.engine or default_engine(self.device)


@dataclass
class RemoteSettings:
    """Where the server is and how long to wait for it (the config's llm.* remote keys)."""

    base_url: str
    api_key: str | None = None
    model: str | None = None  # None: the first model the server lists
    connect_timeout_s: float = 3.0
    first_token_timeout_s: float = 10.0  # request -> first token, retries included; also the longest token gap
    retries: int = 2
    metrics_url: str | None = None  # None: <base_url host>/metrics; "": do not scrape

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"llm.base_url {self.base_url!r} is not an http(s) URL; fix: e.g. http://gpu-box:8000/v1")


@dataclass
class Emission:
    text: str
    token_ids: list[int]
    t: float  # time.monotonic() when the token was accepted (verified)


@dataclass
class DecodeStats:
    """One reply's numbers, as plain data (latency trace, logs, benchmark); ``Generation.stats`` makes them."""

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
