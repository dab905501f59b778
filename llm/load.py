"""Which engine runs the local LLM: the config's ``llm.engine`` names it, and this is the one place that reads it.

``llama.cpp`` (the CPU default) loads the GGUF files as they ship; ``torch`` loads transformers weights (GPUs,
and the float32 exactness reference). Both run the same speculative loop; each maps the rest of the llm section
to its own load arguments in its ``from_config``.
"""

from __future__ import annotations

from typing import Any

from llm.engine import Engine
from llm.llamacpp_engine import LlamaCppEngine
from llm.settings import LoadSettings


def load_engine(target: str, draft: str | None, llm: dict[str, Any], *, keep_draft: bool = False) -> Engine:
    """The engine the llm section (as a dict) asks for, loaded. keep_draft: see LlamaCppEngine.calibrate."""
    kind = LlamaCppEngine if LoadSettings.from_config(llm).engine_kind == "llama.cpp" else Engine
    return kind.from_config(target, draft, llm, keep_draft=keep_draft)
