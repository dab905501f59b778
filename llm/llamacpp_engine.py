"""The engine on llama.cpp: GGUF weights as they ship, our speculative loop, drafting only where it pays.

Everything above the caches (conversations, the acceptance rule, the policy, cancellation, trims) is the
torch engine's code; this module loads the GGUF pair, makes llama.cpp caches, and decides from costs measured
on this device which drafter (if any) a "draft" request uses.

Why measure: on 4-bit weights a small CPU is compute-bound as soon as a pass holds two tokens, so verifying k
drafted tokens costs nearly k+1 target passes (measured on a 2-core EPYC: 1.5x one token for 2, 2.8x for 4),
and the 0.5B draft's step costs ~0.6-0.7 of a target pass. Speculation then cannot win, and a draft model that
is kept only costs its prefill on every turn. On a CPU with more cores per memory channel (or a GPU) the same
numbers favour drafting. ``calibrate`` times the target's pass over 1..4 tokens and one draft step at load, and
keeps the draft model only if the cost rule (policy.py) expects it to beat the target alone at the prior
acceptance; otherwise "draft" requests draft from the conversation (n-gram lookup, free to propose), whose
adaptive length falls to k = 0 (the target alone) when its live acceptance does not pay either.
"""

from __future__ import annotations

import logging
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

from llm.cache import CachedLM
from llm.engine import LOAD, Engine
from llm.llamacpp import GgufModel, LlamaCppError, LlamaCppLM, gguf_file
from llm.models import IncompatibleDraftError, ModelLoadError, check_compatible
from llm.settings import DecodeSettings, LoadSettings, Mode

log = logging.getLogger("specvoice.llm")

CALIBRATION_TEXT = "A calibration passage: the quick brown fox jumps over the lazy dog while the kettle boils."
LLAMA_CPP_BATCH = 512
CALIBRATION_TOKENS = 4  # target passes over 1..4 tokens are timed; longer ones are extrapolated (policy.py)


def gguf_location(location: str) -> str:
    """A local .gguf (or a prepared folder holding one), or "hub:<repo>:<file>.gguf" fetched once when online."""
    if not location.startswith("hub:"):
        return location
    repo, _, filename = location[4:].partition(":")
    if not filename.endswith(".gguf"):
        raise ModelLoadError(
            f"hub model {repo!r}: llm.engine = 'llama.cpp' needs one GGUF file of it; "
            "fix: name it as '<repo>:<file>.gguf', or point models.target at a local .gguf"
        )
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo, filename)
    except Exception as exc:  # offline, unknown repo or file: the library's many error types
        raise ModelLoadError(
            f"could not fetch {filename} from hub repo {repo!r} ({type(exc).__name__}: {exc}); "
            "fix: go online once, or point the model at a local .gguf"
        ) from exc


def gguf_tokenizer(location: str) -> Any:
    """The transformers tokenizer (with its chat template) of a GGUF: saved beside it by `models prepare`,
    else read from the GGUF itself."""
    from transformers import AutoTokenizer

    path = Path(location)
    if path.is_dir() and (path / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(path))
    file = gguf_file(path)
    return AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)


class LlamaCppEngine(Engine):
    """A GGUF target (and optional GGUF draft) on llama.cpp; the rest is ``Engine``'s."""

    def __init__(
        self,
        target: GgufModel,
        tokenizer: Any,
        draft: GgufModel | None = None,
        *,
        mode: Mode = LOAD.mode,
        context_limit: int = LOAD.context_limit,
        settings: DecodeSettings | None = None,
    ):
        if mode == "draft" and draft is None:
            raise ValueError("mode 'draft' needs a draft model; fix: give one, or use mode 'ngram' or 'target'")
        if draft is not None and draft.n_vocab != target.n_vocab:
            raise IncompatibleDraftError(
                f"the draft's output has {draft.n_vocab} rows but the target's {target.n_vocab}; fix: use a draft "
                "from the target's model family, or llm.mode = 'ngram'"
            )
        if (settings or DecodeSettings(mode=mode)).tree:
            raise ValueError(
                "token trees run on the torch engine only; fix: set llm.tree = false, or llm.engine = 'torch'"
            )
        self.target_model, self.draft_model = target, draft
        self.vocab_size, self.draft_out_ids = target.n_vocab, None
        eog = {i for i in tokenizer.added_tokens_decoder if target.is_end_of_generation(i)}
        self._setup(tokenizer, mode, context_limit, settings, eog | {tokenizer.eos_token_id} - {None})
        self.info = {
            "engine": "llama.cpp",
            "threads": target.threads,
            "target": str(target.path),
            "huge_pages_mb": target.huge.bytes >> 20,
        }

    @classmethod
    def from_config(
        cls, target: str, draft: str | None, llm: dict[str, Any], *, keep_draft: bool = False
    ) -> LlamaCppEngine:
        load = LoadSettings.from_config(llm)
        return cls.load_gguf(
            target,
            draft if load.mode == "draft" else None,
            mode=load.mode,
            threads=load.threads,
            context_limit=load.context_limit,
            huge_pages=load.huge_pages,
            settings=DecodeSettings.from_config(llm),
            keep_draft=keep_draft,
        )

    @classmethod
    def load_gguf(
        cls,
        target: str,
        draft: str | None = None,
        *,
        mode: Mode = LOAD.mode,
        threads: int | None = LOAD.threads,
        context_limit: int = LOAD.context_limit,
        huge_pages: bool = LOAD.huge_pages,
        settings: DecodeSettings | None = None,
        calibrate: bool = True,
        keep_draft: bool = False,
    ) -> LlamaCppEngine:
        """Load the GGUF pair (the draft refused unless it shares the target's tokenizer), then measure which
        drafter pays here (``calibrate``)."""
        settings = settings or DecodeSettings(mode=mode)
        target, draft = gguf_location(target), gguf_location(draft) if draft else None
        tokenizer = gguf_tokenizer(target)
        if mode == "draft":
            if not draft:
                raise ValueError("mode 'draft' needs a draft model; fix: set models.draft, or llm.mode = 'ngram'")
            check_compatible(tokenizer, gguf_tokenizer(draft))  # before loading any weights
        # the most tokens one llama_decode takes: llama.cpp's default of 512, which also measured ~2.5% faster
        # per decoded token here than 128 (0.9 ms of 36), at a larger compute buffer per cache (306 vs 76 MB)
        batch = max(settings.prefill_chunk, settings.max_draft_length + 1, LLAMA_CPP_BATCH)
        started = time.monotonic()
        load = partial(GgufModel.load, threads=threads, context_limit=context_limit, batch=batch, huge_pages=huge_pages)
        target_model = load(target)
        draft_model = load(draft) if mode == "draft" and draft else None
        engine = cls(target_model, tokenizer, draft_model, mode=mode, context_limit=context_limit, settings=settings)
        log.info(
            "llm loaded",
            extra={"engine": "llama.cpp", "target": target, "draft": draft, "seconds": time.monotonic() - started},
        )
        if calibrate and mode != "target":
            engine.calibrate(keep_draft=keep_draft)
        return engine

    def new_caches(self) -> tuple[CachedLM, CachedLM | None]:
        real = len(self.tokenizer)
        padded = real if self.vocab_size > real else None
        target = LlamaCppLM(self.target_model, real_vocab=padded)
        draft = LlamaCppLM(self.draft_model, real_vocab=padded) if self.draft_model is not None else None
        return target, draft

    def calibrate(self, repeats: int = 3, keep_draft: bool = False) -> dict[str, Any]:
        """Time the target's pass over 1..CALIBRATION_TOKENS tokens and one draft step on this device, seed the
        policies with them, and keep the draft model only where it is expected to pay (module docstring).

        Only the policy's requests ("adaptive", "confidence") switch drafter: a fixed draft length asks for the
        draft model. The draft model is unloaded when nothing can use it, unless ``keep_draft``."""
        ids = list(self.tokenizer(CALIBRATION_TEXT)["input_ids"])
        prompt, extra = ids[:-CALIBRATION_TOKENS], ids[-CALIBRATION_TOKENS:]
        target, draft = self.new_caches()
        with self.lock:
            verify = {m: self._median_pass(target, prompt, extra[:m], repeats) for m in range(1, len(extra) + 1)}
            draft_s = self._median_pass(draft, prompt, extra[:1], repeats) if draft is not None else None
        # a lookup in the conversation costs ~nothing to propose
        self.measured_costs = {"draft": (verify, draft_s), "ngram": (verify, 0.0)}
        for key, known in self.policies.items():  # policies made before: seeded like the ones made from now on
            known.verify_s, known.draft_s = dict(verify), self.measured_costs[key.mode][1]
        policy = self.policy_for(self.settings.but(mode="draft", draft_length="adaptive", seed=None))
        costs: dict[str, Any] = {
            "verify_ms": {m: round(1000 * s, 1) for m, s in verify.items()},
            "draft_step_ms": round(1000 * draft_s, 1) if draft_s is not None else None,
            "prior_alpha": round(policy.alpha, 2),
        }
        if draft_s is not None:
            gains = {
                k: policy.expected_rate(k) / policy.expected_rate(0) for k in range(self.settings.max_draft_length + 1)
            }
            best = max(gains, key=lambda k: gains[k])
            costs["draft_expected_speedup"] = {k: round(g, 2) for k, g in gains.items()}
            if best == 0:
                self.drafter = "ngram"
                fixed = self.settings.draft_length not in ("adaptive", "confidence")
                if not (keep_draft or fixed):
                    assert draft is not None and self.draft_model is not None
                    draft.close()
                    self.draft_model.close()  # its memory goes back; no cache is made of it again
                    self.draft_model = None
                log.info(
                    "the draft model does not pay on this device: drafting from the conversation instead",
                    extra={"llm_costs": costs},
                )
        costs["drafter"] = self.drafter
        self.info["calibration"] = costs
        return costs

    @staticmethod
    def _median_pass(lm: CachedLM, prompt: list[int], feed: list[int], repeats: int) -> float:
        lm.prefill(prompt, len(prompt))
        lm.logits(prompt, feed[:-1])  # once off the clock: the first pass of a shape allocates
        times = []
        for _ in range(repeats):
            lm.crop(len(prompt) - 1)
            start = time.perf_counter()
            lm.logits(prompt, feed[:-1])
            times.append(time.perf_counter() - start)
        return statistics.median(times)


__all__ = ["LlamaCppEngine", "LlamaCppError", "gguf_location", "gguf_tokenizer"]
