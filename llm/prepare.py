"""What `specvoice models prepare` builds for the LLM beyond the weights: the token counts that choose the
draft's reduced head, and the quantized layers the config asks for (so the first start does not spend minutes
quantizing). Everything lands next to the model's weights; every step is skipped when its file exists."""

from __future__ import annotations

from typing import Any

from llm.models import load_causal_lm, reduce_vocab_head
from llm.settings import LoadSettings
from llm.vocab import build_counts, draft_head, head_key


def prepare_llm(target: str, draft: str | None, llm: dict[str, Any], force: bool = False) -> list[str]:
    """Build what the config's llm section needs; returns one line per thing built or found."""
    from llm.engine import _quantize

    lines = []
    load = LoadSettings.from_config(llm)
    drafting = load.mode == "draft" and bool(draft)
    if drafting and load.draft_vocab:
        path = build_counts(target, force=force)
        lines.append(f"token counts for the draft's head: {path}")
    if load.target_quantize == "int4":
        model, _ = load_causal_lm(target)
        lines.append(f"int4 target layers: {_quantize(model, target, 4, off_grid_bits=8)}")
        del model
    if drafting and draft and load.draft_quantize == "int4":
        model, tokenizer = load_causal_lm(draft)
        ids = None
        if load.draft_vocab:
            ids, _ = draft_head(tokenizer, target, load.draft_vocab)
            reduce_vocab_head(model, ids)
        lines.append(f"int4 draft layers: {_quantize(model, draft, 4, variant=head_key(ids))}")
    return lines
