"""What the engine reports back for a request after each step."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TokenLogprob", "RequestMetrics", "RequestOutput"]


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float]  # the n most likely token ids at this position and their logprobs


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_drafted_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # all output tokens so far
    text: str  # all output text released so far
    new_token_ids: list[int]  # tokens produced by the last step
    new_text: str  # text released by the last step
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list[TokenLogprob] | None = None  # for new_token_ids, when requested
    # Every prompt token's logprob given the tokens before it (the first token has none: None), when
    # requested; in the first output after the prompt is prefilled, None in the others.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    metrics: RequestMetrics | None = field(default=None, compare=False)
