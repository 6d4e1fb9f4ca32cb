"""Sampler: logits -> next tokens, per request: greedy, temperature, min-p, top-k, top-p, seed, logprobs.

The logits it gets are already processed (penalties, biases, bans: tandem.engine.processors); the
logprobs it reports are the model's own, from the unprocessed logits (vLLM's default, raw_logprobs).
"""

from __future__ import annotations

import math

import torch

from tandem.engine.outputs import TokenLogprob
from tandem.engine.sampling_params import SamplingParams

__all__ = ["sample", "filtered_probs", "new_generator", "logprob_entries"]


def new_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return generator


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from: softmax(logits / T) cut by min-p, top-k, then top-p
    (vLLM's order: min-p and top-k commute, both keep a most-likely prefix).

    logits: [..., V] float32. Speculative rejection sampling uses the very same function, so the
    verified distribution is exactly the one plain sampling would use.
    """
    logits = logits / params.temperature
    if params.min_p > 0.0:
        # p < min_p * p_max  <=>  logit < max_logit + log(min_p): no softmax needed for the cut.
        floor = logits.max(dim=-1, keepdim=True).values + math.log(params.min_p)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        drop[..., 0] = False  # even a top_p that rounds to 0 in float32 keeps the most likely token
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _logprob_entry(logprobs: torch.Tensor, token: int, n: int) -> TokenLogprob:
    top: dict[int, float] = {}
    if n:
        values, ids = torch.topk(logprobs, n)
        top = {int(i): float(v) for i, v in zip(ids.tolist(), values.tolist(), strict=True)}
    return TokenLogprob(token, float(logprobs[token]), top)


def logprob_entries(logprobs: torch.Tensor, tokens: list[int], n: int) -> list[TokenLogprob]:
    """Row j of logprobs [T, V] scored tokens[j]: its logprob and the row's n most likely ids, for all
    T rows in two tensor ops (prompt logprobs score hundreds of positions at once)."""
    chosen = logprobs.gather(-1, torch.tensor(tokens, dtype=torch.long)[:, None])[:, 0].tolist()
    if not n:
        return [TokenLogprob(t, lp, {}) for t, lp in zip(tokens, chosen, strict=True)]
    values, ids = torch.topk(logprobs, n, dim=-1)
    return [
        TokenLogprob(t, lp, dict(zip(row_ids, row_values, strict=True)))
        for t, lp, row_ids, row_values in zip(tokens, chosen, ids.tolist(), values.tolist(), strict=True)
    ]


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    raw_logits: torch.Tensor | None = None,
) -> tuple[list[int], list[TokenLogprob | None]]:
    """logits: [B, V] float32, processed -> one token per row (and its logprobs where requested,
    from raw_logits: the model's own before any processor; default: logits)."""
    greedy_tokens = logits.argmax(dim=-1).tolist()
    tokens: list[int] = []
    for row, p in enumerate(params):
        if p.greedy:
            tokens.append(greedy_tokens[row])
        else:
            probs = filtered_probs(logits[row], p)
            tokens.append(int(torch.multinomial(probs, 1, generator=generators[row]).item()))
    logprob_out: list[TokenLogprob | None] = [None] * len(params)
    wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
    if wanted:
        # Logprobs of the model's own distribution, before temperature and cuts (as vLLM reports).
        # One log-softmax, one gather and one top-k for every such row (not one per row: 64 rows with
        # 20 alternatives each cost a step as much as one).
        logprobs = torch.log_softmax((logits if raw_logits is None else raw_logits)[wanted], dim=-1)
        chosen = logprobs.gather(-1, torch.tensor([tokens[r] for r in wanted], dtype=torch.long)[:, None])
        chosen_values = chosen[:, 0].tolist()
        k = max(params[r].logprobs for r in wanted)
        top_values, top_ids = ([], []) if not k else (t.tolist() for t in torch.topk(logprobs, k, dim=-1))
        for i, row in enumerate(wanted):
            n = params[row].logprobs
            top = dict(zip(top_ids[i][:n], top_values[i][:n], strict=True)) if n else {}
            logprob_out[row] = TokenLogprob(tokens[row], chosen_values[i], top)
    return tokens, logprob_out
