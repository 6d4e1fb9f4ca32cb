"""Tenant classes in the simulator (`tandem sim --tenant-mix interactive:0.3,batch:0.7`): each trace
request is drawn into a priority class (seeded), the simulated gateway's buffer admits higher
classes first (as the gateway's fair queue does), and the results report SLO attainment per class,
so a fleet's sizing can be judged for the interactive class and the batch class apart."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tandem.sim.trace import TraceRequest

__all__ = ["TenantClass", "assign_classes", "attainment_by_class", "parse_tenant_mix"]

PRIORITIES = {"interactive": 1, "batch": 0}


@dataclass(frozen=True)
class TenantClass:
    name: str
    priority: int
    share: float


def parse_tenant_mix(text: str) -> tuple[TenantClass, ...]:
    """`NAME:SHARE[:PRIORITY],...`; interactive and batch have their priorities (1, 0); shares sum to 1."""
    classes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        fields = part.split(":")
        if len(fields) not in (2, 3) or not fields[0]:
            raise ValueError(f"--tenant-mix {part!r}: give NAME:SHARE or NAME:SHARE:PRIORITY")
        try:
            share = float(fields[1])
            priority = int(fields[2]) if len(fields) == 3 else PRIORITIES[fields[0]]
        except (ValueError, KeyError):
            raise ValueError(
                f"--tenant-mix {part!r}: SHARE is a number, and a class other than interactive or batch needs "
                "its PRIORITY (an integer, higher first)"
            ) from None
        if share <= 0:
            raise ValueError(f"--tenant-mix {part!r}: the share must be > 0")
        classes.append(TenantClass(fields[0], priority, share))
    if not classes:
        raise ValueError("--tenant-mix is empty")
    if len({c.name for c in classes}) != len(classes):
        raise ValueError("--tenant-mix names a class twice")
    total = sum(c.share for c in classes)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"--tenant-mix shares sum to {total:g}, not 1")
    return tuple(classes)


def assign_classes(trace: Sequence[TraceRequest], classes: Sequence[TenantClass], seed: int = 0) -> list[TraceRequest]:
    rng = random.Random(seed)
    names, weights = [c.name for c in classes], [c.share for c in classes]
    by_name = {c.name: c for c in classes}
    out = []
    for r in trace:
        chosen = by_name[rng.choices(names, weights)[0]]
        out.append(replace(r, tenant_class=chosen.name, priority=chosen.priority))
    return out


def attainment_by_class(requests: Sequence, meets) -> dict[str, float]:
    """Share of each class's requests that met the SLO (`meets(seq)`)."""
    totals: dict[str, list[int]] = {}
    for seq in requests:
        if seq.tenant_class is None:
            continue
        entry = totals.setdefault(seq.tenant_class, [0, 0])
        entry[0] += 1
        entry[1] += 1 if meets(seq) else 0
    return {name: met / n for name, (n, met) in sorted(totals.items())}
