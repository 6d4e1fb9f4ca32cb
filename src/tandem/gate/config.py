"""The gate's settings: the deployment file's `gate:` block (pydantic, this edge only) -> GateConfig.

```yaml
gate:
  candidate: fast              # the variant on trial (the deployment's variant name)
  fraction: 0.2                # share of live requests mirrored to it
  auto_promote: true           # on PASS of all three verdicts, switch to it (Controller.use)
  min_samples: {latency: 100, accuracy: 30, errors: 20}
  max_samples: 1000            # still undecided after this many pairs: INCONCLUSIVE, stop shadowing
  deadline_s: 3600             # ... or after this long
  tolerances:
    latency_median: 0.05       # the typical request may be at most 5% slower (TTFT and TPOT)
    latency_p95: 0.10          # the p95 at most 10% slower
    cost: 0.0                  # $ per million output tokens: not dearer at all
    error_rate: 0.02           # candidate errors above 2% of pairs fail the gate
  accuracy: {min_top1_agreement: 0.90, max_logprob_gap: 0.10, lossless: false,
             score_fraction: 0.3}  # share of mirrored pairs scored for accuracy (a random sample)
  confidence: 0.95             # one-sided, for every interval the verdicts read
  tpot_slo_s: 0.1              # the SLO at which each Profile's capacity (and so its cost) is taken
  shadow: {queue: 64, concurrency: 4}
```

Validation errors raise GateConfigError naming the field (`gate.tolerances.latency_p95: ...`).
Inside tandem everything reads the frozen GateConfig.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem.edge.files import describe_errors

__all__ = ["GateConfig", "GateConfigError", "GateSettings", "parse_gate_settings"]


class GateConfigError(ValueError):
    """The gate block is unusable; the message names the field and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MinSamples(_Strict):
    latency: int = Field(100, ge=2)
    accuracy: int = Field(30, ge=1)
    errors: int = Field(20, ge=1)


class Tolerances(_Strict):
    latency_median: float = Field(0.05, ge=0, le=10)
    latency_p95: float = Field(0.10, ge=0, le=10)
    cost: float = Field(0.0, ge=0, le=10)
    error_rate: float = Field(0.02, ge=0, lt=1)


class AccuracySettings(_Strict):
    min_top1_agreement: float = Field(0.90, ge=0, le=1)
    max_logprob_gap: float = Field(0.10, ge=0)  # nats per token
    lossless: bool = False  # the candidate claims the incumbent's greedy output, token for token
    # The share of mirrored pairs scored for accuracy, decided at random on arrival. Scoring costs the
    # serving path (the candidate echoes, the incumbent's replica hands over its kept track); latency
    # and errors need every pair, accuracy tens of them. 0.3: the default minimum of scored pairs (30)
    # comes with the default minimum for latency (100 pairs).
    score_fraction: float = Field(0.3, gt=0, le=1)


class ShadowSettings(_Strict):
    queue: int = Field(64, ge=1)
    concurrency: int = Field(4, ge=1)


class GateSettings(_Strict):
    candidate: str = Field(min_length=1)
    fraction: float = Field(0.2, gt=0, le=1)
    auto_promote: bool = True
    min_samples: MinSamples = MinSamples()
    max_samples: int = Field(1000, ge=1)
    deadline_s: float | None = Field(3600.0, gt=0)
    tolerances: Tolerances = Tolerances()
    accuracy: AccuracySettings = AccuracySettings()
    confidence: float = Field(0.95, ge=0.5, lt=1)
    tpot_slo_s: float = Field(0.1, gt=0)
    shadow: ShadowSettings = ShadowSettings()
    bootstrap_resamples: int = Field(2000, ge=200)
    seed: int = 0

    def to_config(self) -> GateConfig:
        return GateConfig(
            candidate=self.candidate,
            fraction=self.fraction,
            auto_promote=self.auto_promote,
            min_latency_samples=self.min_samples.latency,
            min_accuracy_samples=self.min_samples.accuracy,
            min_error_samples=self.min_samples.errors,
            max_samples=self.max_samples,
            deadline_s=self.deadline_s,
            latency_median_tolerance=self.tolerances.latency_median,
            latency_p95_tolerance=self.tolerances.latency_p95,
            cost_tolerance=self.tolerances.cost,
            max_error_rate=self.tolerances.error_rate,
            min_top1_agreement=self.accuracy.min_top1_agreement,
            max_logprob_gap=self.accuracy.max_logprob_gap,
            lossless=self.accuracy.lossless,
            score_fraction=self.accuracy.score_fraction,
            confidence=self.confidence,
            tpot_slo_s=self.tpot_slo_s,
            shadow_queue=self.shadow.queue,
            shadow_concurrency=self.shadow.concurrency,
            bootstrap_resamples=self.bootstrap_resamples,
            seed=self.seed,
        )


@dataclass(frozen=True)
class GateConfig:
    """What the gate judges by. Tolerances are fractions (0.05: 5% worse is still acceptable)."""

    candidate: str
    fraction: float = 0.2
    auto_promote: bool = True
    min_latency_samples: int = 100
    min_accuracy_samples: int = 30
    min_error_samples: int = 20
    max_samples: int = 1000
    deadline_s: float | None = 3600.0
    latency_median_tolerance: float = 0.05
    latency_p95_tolerance: float = 0.10
    cost_tolerance: float = 0.0
    max_error_rate: float = 0.02
    min_top1_agreement: float = 0.90
    max_logprob_gap: float = 0.10
    lossless: bool = False
    score_fraction: float = 0.3
    confidence: float = 0.95
    tpot_slo_s: float = 0.1
    shadow_queue: int = 64
    shadow_concurrency: int = 4
    bootstrap_resamples: int = 2000
    seed: int = 0


def parse_gate_settings(raw: Any, where: str = "gate") -> GateConfig:
    """The `gate:` block (a mapping) as a GateConfig; GateConfigError names the bad field."""
    if not isinstance(raw, dict):
        raise GateConfigError(f"{where}: must be a mapping of fields (got {type(raw).__name__})")
    try:
        return GateSettings.model_validate(raw).to_config()
    except ValidationError as exc:
        raise GateConfigError("; ".join(describe_errors(exc, GateSettings, within=where))) from None
