"""How many tokens to draft this step: expected output tokens per second, from measured acceptance and costs.

The model (Leviathan et al. 2023, with the batch made explicit): a row whose drafted tokens are each
accepted with probability a gains E(a, k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens from
a step that drafts k tokens. The step costs one target forward over every row's k + 1 tokens (plus
the step's prompt chunks) and k draft forwards over the drafting rows. Both costs are lines fitted
online to the engine's own timings (`CostFit`), so the choice follows the hardware, the model pair
and the batch size: at batch 1 a target forward costs about the same for 1 or 9 tokens, so long
drafts pay; at batch 32 every drafted token is verified at nearly full price, so drafting only pays
for rows that are accepted almost always, and k falls to 0 (plain decoding) otherwise.

Pure functions of frozen inputs, plus two small estimators the speculator updates after each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LinearCost",
    "CostFit",
    "Acceptance",
    "expected_tokens",
    "step_rate",
    "choose_draft_length",
    "row_draft_lengths",
]


@dataclass(frozen=True)
class LinearCost:
    """seconds = base + per_unit * units (units: tokens of a target forward, rows of a draft forward)."""

    base: float
    per_unit: float

    def __call__(self, units: float) -> float:
        return self.base + self.per_unit * units


class CostFit:
    """Exponentially weighted least squares of seconds on units, pulled toward a prior line.

    The prior enters as pseudo-observations at `anchors` (weight `prior_weight` each), so a fit with
    little spread in its units (a steady batch size) keeps the prior's slope instead of a wild one.
    """

    def __init__(
        self,
        prior: LinearCost,
        anchors: tuple[float, float] = (1.0, 64.0),
        prior_weight: float = 2.0,
        decay: float = 0.97,
    ) -> None:
        self.prior, self.anchors, self.prior_weight, self.decay = prior, anchors, prior_weight, decay
        self._sums = [0.0] * 5  # weight, sum x, sum x^2, sum y, sum x*y (decayed)
        self.count = 0

    def add(self, units: float, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.count == 0:  # the first timing sets the scale; the prior keeps its shape (slope / base)
            scale = seconds / self.prior(units)
            self.prior = LinearCost(self.prior.base * scale, self.prior.per_unit * scale)
        s, d = self._sums, self.decay
        for i, value in enumerate((1.0, units, units * units, seconds, units * seconds)):
            s[i] = s[i] * d + value
        self.count += 1

    def estimate(self) -> LinearCost:
        w, sx, sxx, sy, sxy = self._sums
        for x in self.anchors:
            y = self.prior(x)
            w, sx, sxx, sy, sxy = (
                w + self.prior_weight,
                sx + self.prior_weight * x,
                sxx + self.prior_weight * x * x,
                sy + self.prior_weight * y,
                sxy + self.prior_weight * x * y,
            )
        denominator = w * sxx - sx * sx
        slope = (w * sxy - sx * sy) / denominator if denominator > 0 else self.prior.per_unit
        slope = max(slope, 0.0)
        return LinearCost(max((sy - slope * sx) / w, 0.0), slope)


@dataclass
class Acceptance:
    """Per-token acceptance probability from verification outcomes, exponentially weighted.

    A row that accepted `a` of `k` drafted tokens made a + 1 Bernoulli trials (a successes and the
    rejection) if a < k, else k trials and k successes: the maximum-likelihood count for the i.i.d.
    model behind `expected_tokens`. `prior` and `prior_trials` hold the estimate before evidence.
    """

    prior: float = 0.6
    prior_trials: float = 4.0
    decay: float = 0.98
    successes: float = 0.0
    trials: float = 0.0

    def add(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        trials = accepted + (1 if accepted < drafted else 0)
        self.successes = self.successes * self.decay + accepted
        self.trials = self.trials * self.decay + trials

    @property
    def rate(self) -> float:
        return (self.prior * self.prior_trials + self.successes) / (self.prior_trials + self.trials)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a row gains from a step drafting k tokens accepted independently with this probability."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def step_rate(
    acceptances: Sequence[float], k: int, target: LinearCost, draft: LinearCost, other_tokens: int = 0
) -> float:
    """Expected output tokens per second of a step where every row drafts k tokens (k = 0: plain)."""
    rows = len(acceptances)
    tokens = sum(expected_tokens(a, k) for a in acceptances) if k else float(rows)
    seconds = target(other_tokens + rows * (k + 1)) + (k * draft(rows) if k else 0.0)
    return tokens / seconds


def choose_draft_length(
    acceptances: Sequence[float], target: LinearCost, draft: LinearCost, k_max: int, other_tokens: int = 0
) -> tuple[int, float]:
    """(k, expected tokens per second): the draft length in 0..k_max that maximizes the step's rate.

    acceptances: each decoding row's estimated per-token acceptance. other_tokens: the step's prompt
    chunks, which share the target forward."""
    best_k, best_rate = 0, step_rate(acceptances, 0, target, draft, other_tokens)
    for k in range(1, k_max + 1):
        rate = step_rate(acceptances, k, target, draft, other_tokens)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k, best_rate


def row_draft_lengths(acceptances: Sequence[float], k: int, rate: float, seconds_per_token: float) -> list[int]:
    """Each row's share of a step drafting up to k: the j-th drafted token of a row is expected to
    add acceptance^j tokens and costs one verified token (seconds_per_token); it is drafted while that
    beats the step's rate (tokens per second), so rows the target keeps rejecting draft less."""
    threshold = rate * seconds_per_token
    lengths = []
    for a in acceptances:
        j, reach = 0, 1.0
        while j < k and reach * a >= threshold:
            reach *= a
            j += 1
        lengths.append(j)
    return lengths
