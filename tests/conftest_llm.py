"""Helpers for the LLM tests: tiny random models, a scripted draft, the real small model.

Imported by tests/test_llm_*.py (pytest puts tests/ on sys.path). Not a pytest conftest: nothing here is
collected or applied automatically.
"""

from __future__ import annotations

import functools

import torch

from llm.proposers import Proposal


def tiny_model(seed: int, vocab: int = 32, init: float = 0.5, arch: str = "llama"):
    """A 2-layer random causal LM. A large init range makes its distributions peaked, so a wrong draft is
    visibly wrong and sampling tests have power."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kind = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = kind(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=init,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


class ScriptedDraft:
    """A draft proposal source that proposes chosen tokens: at each position of the reply it proposes
    ``script(position)``. With the target's own greedy tokens at chosen positions and a wrong token elsewhere,
    it makes the verifier accept exactly up to a chosen point, so every branch of verification runs.
    Deterministic, so its q is one-hot (Proposal.q = None), as for any deterministic draft."""

    def __init__(self, prompt_len: int, script):
        self.prompt_len = prompt_len
        self.script = script
        self.calls: list[int] = []  # the k asked for at each call

    def catch_up(self, seq, chunk):
        return False  # no cache of its own

    def propose(self, seq, k, params, generator, stop_ids, keep_drafting):
        self.calls.append(k)
        start = len(seq) - self.prompt_len
        return Proposal([self.script(start + i) for i in range(k)], None)


@functools.cache
def smollm_fp32():
    """SmolLM2-135M-Instruct in float32 (model, tokenizer), loaded once per test session."""
    from llm.models import load_causal_lm
    from voice.models import resolve

    return load_causal_lm(str(resolve("smollm2-135m-instruct", "llm").path), dtype="float32", threads=1)


def smollm_engine(settings, context_limit: int = 512):
    """An Engine on SmolLM2 fp32 alone (n-gram drafting or the target alone), with these default settings."""
    from llm.engine import Engine

    model, tok = smollm_fp32()
    return Engine(model, tok, None, mode="ngram", context_limit=context_limit, settings=settings)


def smollm_with_cheap_draft():
    """An Engine: SmolLM2 fp32 target, and as draft a genuinely different model with the same tokenizer (a copy
    with int8 weights and an 8192-token head)."""
    import copy

    from llm.engine import Engine
    from llm.models import frequent_token_ids, quantize_int8, reduce_vocab_head

    model, tok = smollm_fp32()
    draft = copy.deepcopy(model)
    out_ids = frequent_token_ids(tok, 8192)
    reduce_vocab_head(draft, out_ids)
    quantize_int8(draft)
    return Engine(model, tok, draft, mode="draft", draft_out_ids=out_ids)


def chat_ids(tokenizer, user: str, system: str = "You are a helpful assistant. Answer briefly.") -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        add_generation_prompt=True,
        tokenize=True,
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
