"""Cost per million tokens, and the pinned default machine price. Standard library only: both layers
use it (`tandem bench` prices recipes, `tandem gate` judges a candidate's unit cost).

The price is an input; the default is pinned with its source so results can be re-priced.
"""

from __future__ import annotations

__all__ = ["DEFAULT_PRICE", "usd_per_million_tokens"]

DEFAULT_PRICE = (0.1026, "AWS EC2 c7a.large on-demand (2 vCPU AMD EPYC, AVX-512), us-east-1 list price")


def usd_per_million_tokens(usd_per_hour: float, tokens_per_s: float) -> float:
    """1e6 x $/hour / (3600 x tokens/s); infinite when nothing is served."""
    return 1e6 * usd_per_hour / (3600 * tokens_per_s) if tokens_per_s > 0 else float("inf")
