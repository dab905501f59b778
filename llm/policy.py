"""How many tokens to draft: fixed, chosen from measured costs (adaptive), or until the draft is unsure.

Notation: alpha = per-token acceptance, t_d = one draft step, t_v(m) = a target pass over m tokens. Costs
are measured per device and shared by a whole Engine.

Adaptive k: drafting k gives E(k) = 1 + alpha + ... + alpha^k tokens per target pass at a cost of
k * t_d + t_v(k+1); pick the k in 0..max_k with the highest E(k) / cost(k). alpha is accepted / (accepted +
rejections) over a decaying window (the maximum-likelihood estimate for a geometric run length); t_d and t_v(m)
are moving averages (an unmeasured m takes the nearest measured one, or past the longest one the slope of the
last two: flat where verification is memory-bound, as with bf16 weights, steep where 4-bit weights make a CPU
compute-bound).
Every 16th step tries a neighbour of the best k, so the curve stays measured, unless the neighbour could not beat
the best even at an acceptance of 0.9 (then the try would only cost time).

Confidence stop: one alpha for all tokens wastes draft steps on hard stretches and stops easy ones too early.
The draft's own probability c_i of its token says which is which. After i drafted tokens, P_i (the chance that
all i are accepted) is estimated as the product of kappa * c_j, kappa a live calibration (accepted tokens /
the confidence they were drafted with). Stopping now yields E_i = 1 + P_1 + ... + P_i tokens in T_i = i t_d +
t_v(i+1); one more step adds about P_i * alpha tokens for t_d more. Draft on while that raises the rate:
P_i * alpha * T_i > E_i * t_d, up to max_k (llm.max_draft_length). Every quantity is measured on this device,
as for adaptive k.

Token trees (width > 1): k is the chain depth, the pass verifies k + siblings nodes (``tree_shape``) at the
cost t_v(nodes + 1), and a depth i < k with siblings adds alpha^i * (1 - alpha) * beta tokens, beta being the
live rate at which a sibling was accepted where its chain token was rejected (decayed like alpha).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm.settings import DecodeSettings
from llm.tree import tree_shape

OPTIMISTIC_ALPHA = 0.9  # the acceptance a length is tried at before exploring it (see choose)


@dataclass(frozen=True)
class DraftStep:
    """One draft-and-verify step, as the policy learns from it: what was drafted and kept, and what it cost."""

    drafted: int  # chain tokens proposed (a tree's depth)
    accepted: int  # chain tokens the target accepted (a sibling accepted in a chain token's place is not one)
    draft_s: float  # seconds of the timed draft steps (a catch-up prefill is not one)
    draft_steps: int  # how many draft steps draft_s covers
    verify_s: float  # seconds of the target's verifying pass
    fed: int  # tokens that pass fed: drafted, a tree's siblings, and the last committed token
    sibling_hit: bool | None = None  # None unless a chain token with siblings was rejected: then, was one accepted
    confidence: tuple[float, ...] = ()  # the draft's confidence in each drafted token


class DraftLengthPolicy:
    def __init__(
        self,
        fixed: int | None = None,
        max_k: int = DecodeSettings.max_draft_length,
        prior_alpha: float = 0.7,
        prior_c: float = 0.4,
        decay: float = 0.95,
        width: int = 1,
        max_nodes: int = DecodeSettings.tree_nodes,
        prior_beta: float = 0.3,
        confidence: bool = False,
        threshold: float | None = None,
    ):
        """confidence: stop on the draft's confidence (max_k is then the cap); threshold: stop when the
        estimated chance that all drafted tokens are accepted falls below it, instead of the cost rule (fixed,
        so a seeded run drafts the same way every time)."""
        self.fixed, self.max_k, self.decay = fixed, max_k, decay
        self.width, self.max_nodes = width, max_nodes
        self.confidence, self.threshold = confidence, threshold
        self.accepted, self.rejected = prior_alpha * 4, (1 - prior_alpha) * 4  # a weak prior: 4 pseudo-tokens
        self.sibling_hits, self.sibling_tries = prior_beta * 4, 4.0
        self.calib_hits, self.calib_conf = 4.0, 4.0  # kappa = hits / confidence: prior 1
        self.draft_s: float | None = None
        self.verify_s: dict[int, float] = {}
        self.prior_c = prior_c
        self.steps = 0

    @property
    def alpha(self) -> float:
        return self.accepted / max(self.accepted + self.rejected, 1e-9)

    @property
    def beta(self) -> float:
        return self.sibling_hits / max(self.sibling_tries, 1e-9)

    @property
    def kappa(self) -> float:
        """Calibration of the draft's confidence: accepted tokens per unit of confidence they were drafted with."""
        return self.calib_hits / max(self.calib_conf, 1e-9)

    def _verify_cost(self, m: int) -> float:
        """t_v(m): measured, else the nearest measured one; past the longest measured pass, extended along the
        slope of the last two (flat where verification is memory-bound, steep where it is compute-bound)."""
        if not self.verify_s:
            return 1.0
        known = sorted(self.verify_s)
        if m > known[-1] and len(known) >= 2:
            a, b = known[-2], known[-1]
            slope = max(0.0, (self.verify_s[b] - self.verify_s[a]) / (b - a))
            return self.verify_s[b] + slope * (m - b)
        nearest = min(known, key=lambda k: (abs(k - m), k))
        return self.verify_s[nearest]

    def _draft_cost(self) -> float:
        return self.draft_s if self.draft_s is not None else self.prior_c * self._verify_cost(1)

    def expected_rate(self, k: int, alpha: float | None = None) -> float:
        """Tokens per second of drafting k (as a relative rate), at the live alpha unless one is given."""
        a = min(self.alpha if alpha is None else alpha, 0.999)
        shape = tree_shape(k, self.width, self.max_nodes)
        tokens = (1 - a ** (k + 1)) / (1 - a) + sum(a**i * (1 - a) * self.beta for i, n in enumerate(shape) if n)
        return tokens / (k * self._draft_cost() + self._verify_cost(k + sum(shape) + 1))

    def choose(self, remaining: int) -> int:
        """The most tokens to draft this step (the confidence stop may end it sooner)."""
        limit = max(0, min(self.max_k, remaining - 1))
        if self.fixed is not None or self.confidence:
            return min(self.fixed if self.fixed is not None else self.max_k, limit)
        best = max(range(limit + 1), key=self.expected_rate)
        self.steps += 1
        if self.steps % 16 == 0 and limit > 0:
            other = min(limit, best + 1) if (self.steps // 16) % 2 else max(1, best - 1)
            # a neighbour that could not win even at a high acceptance is not worth a try (a compute-bound
            # device, where verifying two tokens costs two passes, stays at k = 0 with no exploring overhead)
            if self.expected_rate(other, OPTIMISTIC_ALPHA) > self.expected_rate(best):
                best = other
        return best

    def keep_drafting(self, confidence: list[float]) -> bool:
        """Confidence stop: whether to draft one more token after these (see the module docstring)."""
        if not self.confidence:
            return True
        kappa = self.kappa
        all_ok, expected = 1.0, 1.0
        for c in confidence:
            all_ok *= min(1.0, kappa * c)
            expected += all_ok
        if self.threshold is not None:
            return all_ok >= self.threshold
        i, t_d = len(confidence), self._draft_cost()
        spent = i * t_d + self._verify_cost(i + 1)
        return all_ok * self.alpha * spent > expected * t_d

    def update(self, step: DraftStep) -> None:
        """Learn from one step: acceptance (alpha), the confidence calibration (kappa), the sibling rate (beta),
        and the measured draft and verify costs."""
        if step.drafted > 0:
            self.accepted = self.accepted * self.decay + step.accepted
            self.rejected = self.rejected * self.decay + (1 if step.accepted < step.drafted else 0)
        if step.confidence:
            verified = step.confidence[: min(step.accepted + 1, step.drafted)]  # tokens verification reached
            self.calib_hits = self.calib_hits * self.decay + min(step.accepted, step.drafted)
            self.calib_conf = self.calib_conf * self.decay + sum(verified)
        if step.sibling_hit is not None:
            self.sibling_hits = self.sibling_hits * self.decay + step.sibling_hit
            self.sibling_tries = self.sibling_tries * self.decay + 1
        if step.draft_steps > 0:
            per_step = step.draft_s / step.draft_steps
            self.draft_s = per_step if self.draft_s is None else 0.8 * self.draft_s + 0.2 * per_step
        old = self.verify_s.get(step.fed)
        self.verify_s[step.fed] = step.verify_s if old is None else 0.8 * old + 0.2 * step.verify_s
