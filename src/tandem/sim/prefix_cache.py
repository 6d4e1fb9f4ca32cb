"""A simulated replica's prefix caching: what a sequence's prefill skips, and what its KV budget
leaves for cached blocks (tandem.sim.block_cache holds them).

- Admitted: the leading run of the prompt's blocks the cache holds is not prefilled again
  (`cached_tokens`; at least one prompt token is always computed, as engines do for the logits).
- Prefilled: every block of the prompt is kept, most recently used (the prompt's first block
  most of all, so a cut from the tail evicts a conversation's newest turn, not its system prompt).
- Room: the replica's KV budget, in blocks, less what its sequences hold outside the cache (the
  uncached part of prompts being prefilled, and every output token), so a busy replica keeps fewer
  prefixes; the least recently used go first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tandem.schedule.routers import PrefixMatch, RouteRequest
from tandem.sim.block_cache import BlockCache

__all__ = ["PrefixCache", "route_for"]


def route_for(seq, replicas: Sequence) -> RouteRequest:
    """What the router is told of a request (`replicas`: SimReplicas): prefix-affinity's key is its
    first block id; kv-aware's match is what each replica's cache holds of it now, as the gateway's
    index of their KV events would say (without its polling delay)."""
    if not seq.blocks:
        return RouteRequest(prompt_tokens=seq.prompt_tokens)
    held = {r.replica_id: r.prefix.held_tokens(seq.blocks, seq.prompt_tokens) for r in replicas if r.prefix}
    return RouteRequest(
        prefix=str(seq.blocks[0]), kv=PrefixMatch(seq.prompt_tokens, held, frozenset(held)),
        prompt_tokens=seq.prompt_tokens,
    )  # fmt: skip


class PrefixCache:
    def __init__(self, budget_tokens: int, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError("a prefix cache needs block_tokens >= 1")
        self.block_tokens = block_tokens
        self.budget_blocks = budget_tokens // block_tokens
        self.cache = BlockCache(self.budget_blocks)
        self.private_tokens = 0  # held by running sequences outside the cache

    def held_tokens(self, blocks: tuple[int, ...], prompt_tokens: int) -> int:
        """Leading prompt tokens the cache holds now (what a router asks before sending the request)."""
        return min(self.cache.leading(blocks) * self.block_tokens, max(prompt_tokens - 1, 0))

    def admit(self, seq) -> None:
        seq.cached_tokens = self.held_tokens(seq.blocks, seq.prompt_tokens) if seq.blocks else 0
        seq.prefill_left = float(seq.prompt_tokens - seq.cached_tokens)
        self._hold(seq.prompt_tokens - seq.cached_tokens + seq.output_tokens)

    def prefilled(self, seq) -> None:
        self._hold(-(seq.prompt_tokens - seq.cached_tokens))  # its prompt's blocks move into the cache
        if seq.blocks:
            self.cache.use(seq.blocks[::-1])  # the first block ends most recently used

    def finished(self, seq) -> None:
        self._hold(-seq.output_tokens)

    def _hold(self, tokens: int) -> None:
        self.private_tokens += tokens
        self.cache.resize(self.budget_blocks - math.ceil(max(self.private_tokens, 0) / self.block_tokens))
