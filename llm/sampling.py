"""Turning logits into the distribution a token is drawn from, in float32.

One function, used for the target AND the draft, so both see the same temperature / top-k / top-p (a known
bug elsewhere is a temperature applied to one model but not the other). Greedy decoding is temperature 0:
the distribution is then one-hot on the argmax, which is exactly what a greedy draft "samples" from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def is_greedy(temperature: float) -> bool:
    return temperature <= 0.0


def probabilities(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] in float32 after temperature, top-k and top-p.

    Greedy (temperature 0) gives a one-hot on the argmax. top_k = 0 and top_p = 1.0 mean "off".
    """
    logits = logits.float()
    if is_greedy(temperature):
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        # keep the smallest set of most likely tokens whose mass reaches top_p (the top token always stays)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a 1-D distribution (argmax when it is one-hot, so greedy needs no random numbers)."""
    if probs.max() >= 1.0:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=generator))


def uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator))


@dataclass
class SamplingParams:
    """How a token is drawn from the logits, for the target and the draft alike."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return probabilities(logits, self.temperature, self.top_k, self.top_p)
