"""The figure of `tandem bench --plot`: each row's throughput (with its ratio to baseline) beside its
latency percentiles, from the rows `rows_as_json` makes."""

from __future__ import annotations

from tandem.plotting import png_bytes, pyplot

__all__ = ["bench_png"]


def bench_png(results: list[dict], title: str) -> bytes:
    plt = pyplot()
    names = [r["recipe"] for r in results]
    y = list(range(len(names)))
    fig, (rate, latency) = plt.subplots(1, 2, figsize=(11, 0.6 * len(names) + 2), sharey=True)
    bars = rate.barh(y, [r["output_tokens_per_s"] for r in results], color="C0")
    for bar, r in zip(bars, results, strict=True):
        if "throughput_vs_baseline" in r:
            rate.annotate(f" {r['throughput_vs_baseline']:.2f}x", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                          va="center", fontsize="small")  # fmt: skip
    rate.set_yticks(y, names)
    rate.invert_yaxis()
    rate.set_xlabel("output tokens/s (higher is better)")
    rate.margins(x=0.2)
    height = 0.2
    for k, (key, label) in enumerate(
        [("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99"), ("tpot_p50_s", "TPOT p50"), ("tpot_p99_s", "TPOT p99")]
    ):
        latency.barh([i + (k - 1.5) * height for i in y], [r[key] for r in results], height=height, label=label)
    latency.set_xscale("log")
    latency.set_xlabel("seconds (log; lower is better)")
    latency.legend(fontsize="small", loc="lower right")
    for ax in (rate, latency):
        ax.grid(axis="x", alpha=0.3)
    return png_bytes(fig, title)
