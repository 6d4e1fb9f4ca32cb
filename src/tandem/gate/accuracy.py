"""The accuracy verdict: does the candidate predict what the incumbent predicts?

Evidence per pair (tandem.gate.agreement): top-1 agreement over compared positions and the mean
log-likelihood gap per token, teacher-forced where the servers take `echo`, else on the shared
prefix of the two generations; and, for greedy requests, whether the two outputs are identical.
Pooled over pairs (total agreeing positions / total positions), with one-sided bounds from the
paired bootstrap over pairs (PASS reads a bound at `confidence`, FAIL one Bonferroni-corrected
for the two statistics):
- agreement PASSES when its lower bound reaches `min_top1_agreement`, FAILS when its upper bound
  is below it;
- the gap PASSES when its upper bound is at most `max_logprob_gap`, FAILS when its lower bound
  is above it;
- a candidate declared lossless (speculative decoding, n-gram lookup: `lossless: true`) must
  reproduce every greedy output exactly; one differing greedy output FAILS it.
Anything between is INCONCLUSIVE, as are fewer than `min_accuracy_samples` scored pairs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from tandem.gate.config import GateConfig
from tandem.gate.pairs import Pair
from tandem.gate.stats import fail_confidence, paired_bounds
from tandem.gate.verdict import MetricVerdict, Verdict, worst

__all__ = ["judge_accuracy", "pooled_ratio"]


def pooled_ratio(numerator: np.ndarray, denominator: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(numerator, axis=axis) / np.sum(denominator, axis=axis)


def _exact_match(pairs: Sequence[Pair], config: GateConfig) -> tuple[Verdict | None, str, dict]:
    greedy = [p for p in pairs if p.comparable and p.sampling.greedy]
    same = sum(p.incumbent.text == p.candidate.text for p in greedy)
    stats = {"greedy_pairs": len(greedy), "identical": same, "rate": same / len(greedy) if greedy else None}
    text = f"greedy exact match {same}/{len(greedy)}"
    if not config.lossless:
        return None, text, stats
    if same < len(greedy):
        return Verdict.FAIL, f"{text}: a lossless candidate must reproduce every greedy output", stats
    if len(greedy) < config.min_accuracy_samples:
        return Verdict.INCONCLUSIVE, f"{text}: fewer than the {config.min_accuracy_samples} required", stats
    return Verdict.PASS, f"{text}: lossless as declared", stats


def judge_accuracy(pairs: Sequence[Pair], config: GateConfig, teacher_forcing_off: str | None = None) -> MetricVerdict:
    """`teacher_forcing_off`: why the servers could not score teacher-forced (said in the reasons)."""
    scored = [p for p in pairs if p.comparable and p.agreement is not None and p.agreement.positions > 0]
    methods = Counter(p.agreement.method for p in scored if p.agreement is not None)
    stats: dict = {"methods": dict(methods), "scored_pairs": len(scored)}
    verdicts, reasons = [], []
    if teacher_forcing_off:
        reasons.append(f"fallback: agreement on the generations' shared prefix ({teacher_forcing_off})")
    exact, exact_text, stats["exact_match"] = _exact_match(pairs, config)
    if exact is not None:
        verdicts.append(exact)
    reasons.append(exact_text)
    if len(scored) < config.min_accuracy_samples:
        verdicts.append(Verdict.INCONCLUSIVE)
        reasons.append(
            f"{len(scored)} pairs with token-level evidence, fewer than the {config.min_accuracy_samples} required"
        )
        return MetricVerdict("accuracy", worst(verdicts), tuple(reasons), len(scored), stats)

    fail_at = fail_confidence(config.confidence, 2)  # agreement and the gap
    agree = np.array([p.agreement.agree for p in scored], dtype=float)  # type: ignore[union-attr]
    positions = np.array([p.agreement.positions for p in scored], dtype=float)  # type: ignore[union-attr]
    bound = paired_bounds(
        pooled_ratio, (agree, positions),
        low_confidence=config.confidence, high_confidence=fail_at,  # PASS reads the low bound, FAIL the high
        resamples=config.bootstrap_resamples, seed=config.seed + 10,
    )  # fmt: skip
    total = int(positions.sum())
    stats["top1_agreement"] = {"rate": bound.estimate, "low": bound.low, "high": bound.high, "positions": total,
                               "threshold": config.min_top1_agreement}  # fmt: skip
    text = f"top-1 agreement {bound.estimate:.1%} (bounds {bound.low:.1%}-{bound.high:.1%}) over {total} tokens"
    if bound.low >= config.min_top1_agreement:
        verdicts.append(Verdict.PASS)
        reasons.append(f"{text}: at least {config.min_top1_agreement:.0%}")
    elif bound.high < config.min_top1_agreement:
        verdicts.append(Verdict.FAIL)
        reasons.append(f"{text}: below {config.min_top1_agreement:.0%}")
    else:
        verdicts.append(Verdict.INCONCLUSIVE)
        reasons.append(f"{text}: cannot tell against {config.min_top1_agreement:.0%} yet")

    gapped = [p for p in scored if p.agreement.gap_positions > 0]  # type: ignore[union-attr]
    if len(gapped) < config.min_accuracy_samples:
        verdicts.append(Verdict.INCONCLUSIVE)
        reasons.append(f"log-likelihood gap: {len(gapped)} pairs with logprobs, fewer than required")
    else:
        sums = np.array([p.agreement.gap_sum for p in gapped])  # type: ignore[union-attr]
        counts = np.array([p.agreement.gap_positions for p in gapped], dtype=float)  # type: ignore[union-attr]
        gap = paired_bounds(
            pooled_ratio, (sums, counts),
            low_confidence=fail_at, high_confidence=config.confidence,
            resamples=config.bootstrap_resamples, seed=config.seed + 11,
        )  # fmt: skip
        stats["logprob_gap"] = {"nats_per_token": gap.estimate, "low": gap.low, "high": gap.high,
                                "tokens": int(counts.sum()), "threshold": config.max_logprob_gap}  # fmt: skip
        text = f"log-likelihood gap {gap.estimate:+.4f} nats/token (bounds {gap.low:+.4f} to {gap.high:+.4f})"
        if gap.high <= config.max_logprob_gap:
            verdicts.append(Verdict.PASS)
            reasons.append(f"{text}: within {config.max_logprob_gap}")
        elif gap.low > config.max_logprob_gap:
            verdicts.append(Verdict.FAIL)
            reasons.append(f"{text}: above {config.max_logprob_gap}")
        else:
            verdicts.append(Verdict.INCONCLUSIVE)
            reasons.append(f"{text}: cannot tell against {config.max_logprob_gap} yet")
    return MetricVerdict("accuracy", worst(verdicts), tuple(reasons), len(scored), stats)
