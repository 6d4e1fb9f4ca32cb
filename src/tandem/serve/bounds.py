"""Bounds on request fields: every list, map and long string a request may send has one, checked
before any work (tokenizing, rendering a chat template, the engine), so what a request costs is
bounded by these numbers, not by how much a client managed to fit in a body.

Past a bound the answer is a 400 whose body (tandem.edge.errors, the one builder) names the field
and the bound. The static bounds are checked by the request schema (tandem.serve.schemas); the ones
tied to the served model (its context length, its vocabulary) or to the replica (its slots and
queue) are checked by the planner (tandem.serve.plan) and the token routes, before tokenizing.

| field                                   | bound                                                        |
|-----------------------------------------|--------------------------------------------------------------|
| stop                                    | 16 strings, each 1..1,024 characters                         |
| stop_token_ids                          | at most vocab_size entries, each a token id < vocab_size;    |
|                                         | duplicates are dropped                                       |
| bad_words                               | 256 words, each 1..512 characters and at most 64 tokens      |
| logit_bias                              | 1,024 entries, keys token ids < vocab_size, values [-100, 100]|
| logprobs / top_logprobs                 | 20                                                           |
| n                                       | --max-n (16)                                                 |
| prompt list x n                         | max_request_share x (running slots + --max-queue) sequences  |
| a prompt's text, chat messages' text,   | 32 characters per token of context (65,536 for 2,048 tokens) |
| POST /tokenize text                     |                                                              |
| messages                                | at most max_model_len messages                               |
| a token-id prompt                       | fewer than max_model_len ids                                 |
| POST /detokenize tokens                 | 32 x max_model_len ids                                       |

No token of a real vocabulary is anywhere near 32 characters long on average, so a text over the
character bound could never fit in the context; it is refused with `context_length_exceeded`
before it is tokenized (a 1 MB prompt used to cost ~170 MB of tokenizer memory per request).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tandem.edge.errors import APIError
from tandem.engine.processor_tables import MAX_BAD_WORD_TOKENS

__all__ = [
    "MAX_BAD_WORDS",
    "MAX_BAD_WORD_CHARS",
    "MAX_BAD_WORD_TOKENS",
    "MAX_LOGIT_BIAS",
    "MAX_LOGPROBS",
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "PROMPT_CHARS_PER_TOKEN",
    "check_detokenize_tokens",
    "check_messages",
    "check_prompt_text",
    "check_sequences",
    "check_stop_token_ids",
    "max_prompt_chars",
    "max_request_sequences",
]

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 1024  # text that may start a stop string is held back: a longer one delays every chunk
MAX_BAD_WORDS = 256
MAX_BAD_WORD_CHARS = 512
MAX_LOGIT_BIAS = 1024  # entries; each is applied at every step
MAX_LOGPROBS = 20  # the engine returns at most 20 alternatives per token
PROMPT_CHARS_PER_TOKEN = 32


def max_prompt_chars(max_model_len: int) -> int:
    """The most characters of text a prompt (or a chat's messages, or POST /tokenize) may have."""
    return PROMPT_CHARS_PER_TOKEN * max_model_len


def check_prompt_text(text: str, param: str, max_model_len: int) -> None:
    """400 (context_length_exceeded) for a text that cannot fit in the context, before tokenizing it."""
    _check_chars(len(text), param, max_model_len)


def _check_chars(length: int, param: str, max_model_len: int) -> None:
    limit = max_prompt_chars(max_model_len)
    if length > limit:
        raise APIError(
            400,
            f"{param}: {length} characters; this model's context is {max_model_len} tokens, and a text "
            f"over {limit} characters ({PROMPT_CHARS_PER_TOKEN} per token) cannot fit in it. Please shorten it.",
            param=param,
            code="context_length_exceeded",
        )


def check_messages(texts: Sequence[str], max_model_len: int) -> None:
    """Chat messages (their texts): at most max_model_len of them, their text within the character bound."""
    if len(texts) > max_model_len:
        raise APIError(
            400,
            f"messages: {len(texts)} messages; this model's context is {max_model_len} tokens, so at most "
            f"{max_model_len} messages fit in it",
            param="messages",
            code="context_length_exceeded",
        )
    _check_chars(sum(len(text) for text in texts), "messages", max_model_len)


def check_stop_token_ids(ids: Sequence[int], vocab_size: int | None) -> None:
    """stop_token_ids: at most vocab_size entries, each inside the vocabulary (checked before the engine)."""
    if vocab_size is None:
        return
    if len(ids) > vocab_size:
        raise APIError(
            400,
            f"stop_token_ids: at most {vocab_size} entries (the vocabulary's size), got {len(ids)}",
            param="stop_token_ids",
            code="invalid_value",
        )
    outside = next((t for t in ids if t >= vocab_size), None)
    if outside is not None:
        raise APIError(
            400,
            f"stop_token_ids: token id {outside} is outside the vocabulary [0, {vocab_size})",
            param="stop_token_ids",
            code="invalid_value",
        )


def max_request_sequences(capacity: int, share: float) -> int:
    """The most sequences one request may hold: `share` of the replica's slots plus queue (at least 1)."""
    return max(1, math.floor(share * capacity + 1e-9))


def check_sequences(n: int, num_prompts: int, *, max_n: int, capacity: int, share: float) -> None:
    """n within --max-n, and prompts x n within the request's share of the replica (never a 429 for others)."""
    if n > max_n:
        raise APIError(400, f"n: at most {max_n} choices per prompt, got {n}", param="n", code="invalid_value")
    limit = max_request_sequences(capacity, share)
    needed = n * num_prompts
    if needed > limit:
        share_text = "" if share >= 1 else f"max_request_share {share:g} of "
        raise APIError(
            400,
            f"this request needs {needed} sequences ({num_prompts} prompt(s) x n={n}); one request may hold at "
            f"most {limit} ({share_text}the {capacity} this server runs or queues at once). Send fewer prompts "
            "or a smaller n, or split the request",
            param="n",
            code="invalid_value",
        )


def check_detokenize_tokens(tokens: Sequence[int], max_model_len: int) -> None:
    limit = PROMPT_CHARS_PER_TOKEN * max_model_len
    if len(tokens) > limit:
        raise APIError(
            400,
            f"tokens: at most {limit} token ids ({PROMPT_CHARS_PER_TOKEN} x this model's {max_model_len}-token "
            f"context), got {len(tokens)}",
            param="tokens",
            code="invalid_value",
        )
