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

from typing import TYPE_CHECKING

from tandem.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, each loaded on first use (tandem.lazy)
    from tandem.gate.agreement import TokenAgreement
    from tandem.gate.config import GateConfig, GateConfigError, GateSettings, parse_gate_settings
    from tandem.gate.evidence import Evidence, judge
    from tandem.gate.mirror import ShadowMirror, Ticket
    from tandem.gate.pairs import Pair, PairLog, Sampling
    from tandem.gate.scoring import Scorer
    from tandem.gate.sides import Side
    from tandem.gate.state import Decision, Gate, GateState
    from tandem.gate.verdict import GateVerdict, MetricVerdict, Verdict

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
