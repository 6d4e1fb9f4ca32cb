"""The unit-cost verdict: dollars per million output tokens, from each variant's Profile and price.

One replica's throughput is its capacity at the latency SLO (the capacity policy's own
`slo_capacity`: the largest batch whose per-sequence rate keeps the time-per-output-token SLO,
and the output tokens/s there), so the cost is of tokens served as fast as promised:
$/M = 1e6 x $/replica-hour / (3600 x tokens/s). The candidate PASSES when it is not dearer than
the incumbent (by more than `cost_tolerance`), FAILS otherwise, and also FAILS when it cannot
keep the SLO at all where the incumbent can. Without both Profiles the verdict is INCONCLUSIVE.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tandem.contracts import Profile
from tandem.gate.config import GateConfig
from tandem.gate.sides import Side
from tandem.gate.verdict import MetricVerdict, Verdict
from tandem.pricing import usd_per_million_tokens
from tandem.schedule.policies.capacity import slo_capacity

__all__ = ["VariantCost", "variant_cost", "judge_cost"]


@dataclass(frozen=True)
class VariantCost:
    recipe: str
    hardware: str
    usd_per_hour: float
    batch: int  # concurrent sequences per replica at the SLO
    output_tokens_per_s: float
    meets_slo: bool
    usd_per_million_tokens: float

    def to_dict(self) -> dict:
        return asdict(self)


def variant_cost(profile: Profile, usd_per_hour: float, tpot_slo_s: float) -> VariantCost:
    cap = slo_capacity(profile, tpot_slo_s)
    return VariantCost(
        profile.recipe,
        profile.hardware,
        usd_per_hour,
        cap.batch,
        cap.output_tokens_per_s,
        cap.meets_slo,
        usd_per_million_tokens(usd_per_hour, cap.output_tokens_per_s),
    )


def judge_cost(incumbent: Side, candidate: Side, config: GateConfig) -> MetricVerdict:
    missing = [
        f"no measured Profile for the {role}" + (f" ({side.profile_error})" if side.profile_error else "")
        for role, side in (("incumbent", incumbent), ("candidate", candidate))
        if side.profile is None
    ]
    if missing:
        return MetricVerdict("cost", Verdict.INCONCLUSIVE, tuple(missing), 0)
    assert incumbent.profile is not None and candidate.profile is not None
    inc = variant_cost(incumbent.profile, incumbent.usd_per_hour, config.tpot_slo_s)
    cand = variant_cost(candidate.profile, candidate.usd_per_hour, config.tpot_slo_s)
    ratio = cand.usd_per_million_tokens / inc.usd_per_million_tokens if inc.usd_per_million_tokens > 0 else math.inf
    stats = {"incumbent": inc.to_dict(), "candidate": cand.to_dict(), "ratio": ratio,
             "tolerance": config.cost_tolerance, "tpot_slo_s": config.tpot_slo_s}  # fmt: skip
    text = (
        f"${cand.usd_per_million_tokens:.4f} vs ${inc.usd_per_million_tokens:.4f} per million output tokens "
        f"({ratio:.3f}x; {cand.output_tokens_per_s:.0f} vs {inc.output_tokens_per_s:.0f} tokens/s per replica at "
        f"batch {cand.batch} vs {inc.batch} within the {config.tpot_slo_s * 1000:g} ms/token SLO, "
        f"${cand.usd_per_hour:g} vs ${inc.usd_per_hour:g} per replica-hour)"
    )
    reasons = [text]
    if inc.hardware != cand.hardware:
        reasons.append(f"the Profiles were measured on different hardware ({cand.hardware} vs {inc.hardware})")
    if inc.meets_slo and not cand.meets_slo:
        reasons.append("the candidate cannot keep the SLO even at batch 1; the incumbent can")
        return MetricVerdict("cost", Verdict.FAIL, tuple(reasons), 2, stats)
    if not math.isfinite(ratio) or ratio > 1 + config.cost_tolerance:
        reasons.append(f"dearer than the incumbent beyond the tolerance of {config.cost_tolerance:.0%}")
        return MetricVerdict("cost", Verdict.FAIL, tuple(reasons), 2, stats)
    reasons.append("not dearer than the incumbent")
    return MetricVerdict("cost", Verdict.PASS, tuple(reasons), 2, stats)
