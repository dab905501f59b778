"""The reference methods `bench llm` runs beside ours: what a user of each engine already has.

On torch, transformers ``generate`` (alone, or with an assistant model); on llama.cpp, llama.cpp's own generation
loop through llama-cpp-python's high-level API. Each returns (tokens, ttft, decode seconds, decode tokens).
"""

from __future__ import annotations

import time
from typing import Any

import torch


class _TokenTimer:
    """A transformers streamer noting when the first generated tokens arrive and how many came at once (its
    first put() is the prompt)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None
        self.first_count = 0

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first, self.first_count = time.monotonic(), int(value.numel())

    def end(self) -> None:
        pass


def hf_generate(
    model, prompt: list[int], max_new: int, stop_ids: set[int], **kwargs: Any
) -> tuple[list[int], float, float, int]:
    """(tokens, ttft, decode seconds, decode tokens) of one transformers generate call."""
    timer = _TokenTimer()
    ids = torch.tensor([prompt], device=model.device)
    start = time.monotonic()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=sorted(stop_ids),
            pad_token_id=sorted(stop_ids)[0],
            streamer=timer,
            **kwargs,
        )
    end = time.monotonic()
    tokens = out[0, len(prompt) :].tolist()
    first = timer.first or end
    return tokens, first - start, end - first, max(len(tokens) - timer.first_count, 0)


class LlamaCppAlone:
    """llama.cpp's own generation loop on the target's GGUF (llama-cpp-python's ``Llama.generate``, greedy),
    with the engine's threads and context: what a CPU user runs today. Every run starts from an empty cache."""

    def __init__(self, gguf: str, threads: int, context_limit: int):
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=gguf,
            n_ctx=context_limit,
            n_threads=threads,
            n_threads_batch=threads,
            use_mmap=False,
            verbose=False,
        )

    def run(self, prompt: list[int], max_new: int, stop_ids: set[int]) -> tuple[list[int], float, float, int]:
        """(tokens, ttft, decode seconds, decode tokens), like ``hf_generate``."""
        self.llm.reset()  # no prefix reuse: a cold prompt, as for the other methods
        tokens: list[int] = []
        start = time.monotonic()
        first = None
        for token in self.llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            first = first or time.monotonic()
            tokens.append(int(token))
            if token in stop_ids or len(tokens) >= max_new:
                break
        end = time.monotonic()
        first = first or end
        return tokens, first - start, end - first, max(len(tokens) - 1, 0)
