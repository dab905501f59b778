"""How much a cheaper served target loses against the bf16 reference (`specvoice bench llm --quality`).

On ``prompts.HELD_OUT`` (not used to build anything), greedy, chat template:
- the bf16 target's own replies are the reference;
- greedy agreement: teacher-forced on the reference reply, the share of positions where the candidate's top
  token is the reference's token (1.0 = it would have chosen the same token everywhere);
- identical replies: the share of prompts where the candidate's own greedy reply equals the reference;
- mean log-likelihood per token of the reference reply under each model (the candidate's drop in nats is the
  loss; the reference's own value is the scale).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from llm.prompts import HELD_OUT
from llm.vocab import chat_prompt, generate_replies


@torch.no_grad()
def reply_scores(model, prompt: list[int], reply: list[int]) -> tuple[float, float]:
    """(mean log-likelihood per token of reply after prompt, share of reply tokens that are the model's argmax)."""
    ids = torch.tensor([prompt + reply])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    target = torch.tensor(reply)
    logp = torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0]
    return float(logp.mean()), float((logits.argmax(-1) == target).float().mean())


def compare(
    reference, candidate, tokenizer, prompts: list[str] = HELD_OUT, max_new_tokens: int = 64, progress: bool = True
) -> dict[str, Any]:
    start = time.monotonic()
    ref_replies = generate_replies(reference, tokenizer, prompts, max_new_tokens, progress=progress)
    cand_replies = generate_replies(candidate, tokenizer, prompts, max_new_tokens, progress=progress)
    rows = []
    for text, ref, cand in tqdm(
        list(zip(prompts, ref_replies, cand_replies, strict=False)), desc="scoring", disable=not progress or None
    ):
        prompt = chat_prompt(tokenizer, text)
        ref_ll, _ = reply_scores(reference, prompt, ref)
        cand_ll, agree = reply_scores(candidate, prompt, ref)
        diverge = next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b), None)
        if diverge is None and len(ref) != len(cand):
            diverge = min(len(ref), len(cand))
        rows.append(
            {
                "prompt": text,
                "tokens": len(ref),
                "reference_ll": ref_ll,
                "candidate_ll": cand_ll,
                "agreement": agree,
                "identical": diverge is None,
                "first_divergence": diverge,
            }
        )
    tokens = sum(r["tokens"] for r in rows)

    def weighted(key: str) -> float:
        return sum(r[key] * r["tokens"] for r in rows) / max(tokens, 1)

    return {
        "prompts": len(rows),
        "reference_tokens": tokens,
        "greedy_agreement": round(weighted("agreement"), 4),
        "identical_replies": round(sum(r["identical"] for r in rows) / max(len(rows), 1), 4),
        "reference_mean_ll": round(weighted("reference_ll"), 4),
        "candidate_mean_ll": round(weighted("candidate_ll"), 4),
        "ll_drop_nats": round(weighted("reference_ll") - weighted("candidate_ll"), 4),
        "seconds": round(time.monotonic() - start, 1),
        "per_prompt": rows,
    }


def run(target: str, out: str, max_new_tokens: int = 64) -> int:
    """Compare the int4 served target (as Engine.load builds it) with the bf16 reference; print, write JSON."""
    from llm.engine import _quantize
    from llm.models import load_causal_lm

    reference, tokenizer = load_causal_lm(target, dtype="bfloat16")
    candidate = copy.deepcopy(reference)
    layers = _quantize(candidate, target, 4, off_grid_bits=8)
    result = compare(reference, candidate, tokenizer, max_new_tokens=max_new_tokens)
    result["candidate"] = {"target_quantize": "int4", "layers": layers}
    print(
        f"int4 target vs bf16 on {result['prompts']} held-out prompts ({result['reference_tokens']} reference "
        f"tokens): greedy agreement {result['greedy_agreement']:.4f}, identical replies "
        f"{result['identical_replies']:.2f}, mean log-likelihood {result['candidate_mean_ll']:.4f} vs "
        f"{result['reference_mean_ll']:.4f} (drop {result['ll_drop_nats']:.4f} nats per token)"
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0
