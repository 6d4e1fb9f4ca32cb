"""tandem.gate: shadow traffic and the validation gate (scheduling side: no torch, no engine).

A candidate variant goes live only after it ran on mirrored copies of real requests beside the
incumbent and passed latency, accuracy and unit cost, all three, with statistics. The gate sees
only HTTP responses, Profiles and prices.

- `ShadowMirror` (mirror.py): the gateway's hook; copies requests to the candidate, records Pairs.
- `judge(Evidence, GateConfig) -> GateVerdict` (evidence.py): the pure decision.
- `Gate` (state.py): SHADOWING -> PASSED / FAILED / INCONCLUSIVE -> PROMOTING -> DONE.
- `GateSettings` (config.py): the deployment file's `gate:` block.
- `tandem gate` (cli.py, offline.py): the same judgement offline, on local replicas.

Names are imported on first use, so registering `tandem gate` costs `tandem --help` no scipy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Decision": "tandem.gate.state",
    "Evidence": "tandem.gate.evidence",
    "Gate": "tandem.gate.state",
    "GateConfig": "tandem.gate.config",
    "GateConfigError": "tandem.gate.config",
    "GateSettings": "tandem.gate.config",
    "GateState": "tandem.gate.state",
    "GateVerdict": "tandem.gate.verdict",
    "MetricVerdict": "tandem.gate.verdict",
    "Observation": "tandem.measure.observation",
    "Pair": "tandem.gate.pairs",
    "PairLog": "tandem.gate.pairs",
    "ResponseRecorder": "tandem.measure.observation",
    "Sampling": "tandem.gate.pairs",
    "Scorer": "tandem.gate.scoring",
    "ShadowMirror": "tandem.gate.mirror",
    "Side": "tandem.gate.sides",
    "Ticket": "tandem.gate.mirror",
    "TokenAgreement": "tandem.gate.agreement",
    "Verdict": "tandem.gate.verdict",
    "judge": "tandem.gate.evidence",
    "observe": "tandem.measure.observation",
    "parse_gate_settings": "tandem.gate.config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
