"""The figure of `tandem sim --plot`: replicas over time against demand, one panel per policy.

Demand is drawn in replicas: the replicas the traffic of each minute needs at 100% use within the
TPOT SLO (prefill plus decode work, `sizing.demand_series`). matplotlib is an optional extra
(`pip install 'tandem[plots]'`); it is imported only here, only when a figure is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.plotting import PlotUnavailable, png_bytes, pyplot
from tandem.sim.experiment import PairResult

__all__ = ["PlotUnavailable", "plot_png"]


def plot_png(results: Sequence[PairResult], title: str) -> bytes:
    plt = pyplot()

    policies = list(dict.fromkeys(r.policy for r in results))
    variants = list(dict.fromkeys(r.variant.name for r in results))
    colors = {name: f"C{i}" for i, name in enumerate(variants)}
    fig, axes = plt.subplots(len(policies), 1, figsize=(10, 2.6 * len(policies)), sharex=True, squeeze=False)
    for ax, policy in zip(axes[:, 0], policies, strict=True):
        for r in (r for r in results if r.policy == policy):
            points = [(t, live) for t, live, _ in r.sim.timeline if 0 <= t <= r.sim.duration_s]
            if points:
                ax.step([t / 60 for t, _ in points], [n for _, n in points], where="post",
                        color=colors[r.variant.name], label=f"{r.variant.name}: replicas")  # fmt: skip
            ax.step([t / 60 for t, _ in r.demand], [d for _, d in r.demand], where="post", linestyle="--",
                    color=colors[r.variant.name], alpha=0.6, label=f"{r.variant.name}: demand")  # fmt: skip
        ax.set_title(policy, loc="left")
        ax.set_ylabel("replicas")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize="small", ncol=2)
    axes[-1, 0].set_xlabel("minutes")
    return png_bytes(fig, title)
