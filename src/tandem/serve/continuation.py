"""Continuing an answer another replica began (a stream the gateway resumes: tandem.edge.resume_wire).

The request is the original one plus `tandem_continue` (the output token ids already generated, and
how many characters of their text the client has). The prompt's ids are followed by the generated
ids, which count as output: `max_tokens` and `min_tokens` shrink by them, the engine decodes their
text as output (so a stop string or a multi-byte character across the break comes out as in one
run: tandem.engine.Engine.add_request), `usage` counts them as completion tokens, and what the
client already has is not sent again. Greedy output is token for token an uninterrupted run's; a
seeded request continues with a valid sample of the same distribution (its generator restarts).

What a continuation cannot carry is refused by name: n > 1, echo, structured output and tools
(their state lives in the replica that began the answer); the gateway does not resume those.
"""

from __future__ import annotations

import dataclasses

from tandem.edge.errors import APIError
from tandem.serve.schemas import ChatCompletionRequest, CompletionRequest

__all__ = ["check_continuable", "continued_ids", "continued_max_tokens", "continued_params"]

_PARAM = "tandem_continue"


def _refuse(message: str) -> APIError:
    return APIError(400, f"{_PARAM}: {message}", param=_PARAM, code="invalid_value")


def check_continuable(req: CompletionRequest | ChatCompletionRequest, grammar: object, tools: object) -> int:
    """How many output tokens the request continues from (0: it is no continuation)."""
    cont = req.tandem_continue
    if cont is None:
        return 0
    if req.n != 1:
        raise _refuse("only a request with n = 1 can be continued")
    if isinstance(req, CompletionRequest) and (req.echo or len(req.prompts()) != 1):
        raise _refuse("only a completion of one prompt, without echo, can be continued")
    if grammar is not None or tools is not None:
        raise _refuse("a request with structured output or tools cannot be continued")
    return len(cont.token_ids)


def continued_max_tokens(max_tokens: int, generated: int) -> int:
    """What is left of `max_tokens` once `generated` tokens were: at least one, or a 400."""
    if generated >= max_tokens:
        raise _refuse(f"{generated} tokens were already generated of max_tokens {max_tokens}: nothing is left")
    return max_tokens - generated


def continued_ids(req: CompletionRequest | ChatCompletionRequest, ids: list[int]) -> list[int]:
    """The prompt's ids followed by the generated ones."""
    return ids + list(req.tandem_continue.token_ids) if req.tandem_continue is not None else ids


def continued_params(params, generated: int):  # type: ignore[no-untyped-def]
    """A choice's SamplingParams with min_tokens counting the generated tokens as output."""
    if not generated or not params.min_tokens:
        return params
    return dataclasses.replace(params, min_tokens=max(0, params.min_tokens - generated))
