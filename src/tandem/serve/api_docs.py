"""The server's answers as pydantic models, for its OpenAPI document only (tandem.edge.openapi).

The responses themselves are plain dicts built by tandem.serve.responses (one per token per
client); these models describe the same shapes, and schema fuzzing checks every response against
them. Extra fields are allowed, as OpenAI clients allow them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from tandem.contracts import KV_EVENTS_PATH
from tandem.edge.keep_track import KEPT_TRACK_PATH
from tandem.edge.openapi import Operation

__all__ = [
    "SERVER_OPERATIONS",
    "Completion",
    "ChatCompletion",
    "Detokenized",
    "KeptTrack",
    "ModelCard",
    "ModelList",
    "Tokenized",
    "Usage",
    "Version",
]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str | None = None
    max_model_len: int | None = None
    recipe: str | None = None
    sampling_defaults: dict[str, float | int] | None = None  # omitted request fields -> these


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Status(BaseModel):
    status: str
    model: str | None = None
    recipe: str | None = None
    error: str | None = None


class Load(BaseModel):
    replica_id: str
    region: str
    variant: str
    running: int
    waiting: int
    kv_used: float
    healthy: bool
    source: str = "tandem"
    block_size: int | None = None  # the KV blocks' size in tokens (None while the model loads)
    hash_seed: int | None = None  # the seed of their hash chain (tandem.contracts.kv_block_hash)


class KVEventsAnswer(BaseModel):
    """tandem.contracts.KVEvents: block hashes stored and removed since `since`."""

    seq: int
    block_size: int
    hash_seed: int
    reset: bool
    stored: list[int]
    removed: list[int]


class Tokenized(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class Detokenized(BaseModel):
    prompt: str


class Version(BaseModel):
    version: str


class KeptTrack(BaseModel):
    """A completion's own logprobs, kept for the gateway's gate (tandem.serve.kept_tracks)."""

    text: str
    logprobs: dict[str, Any]


_GET = (401, 404, 500, 503)
_TOKENS = (400, 401, 404, 408, 413, 500, 503)
SERVER_OPERATIONS: dict[tuple[str, str], Operation] = {
    ("/v1/completions", "post"): Operation(Completion, stream=True),
    ("/v1/chat/completions", "post"): Operation(ChatCompletion, stream=True),
    ("/v1/models", "get"): Operation(ModelList, errors=_GET),
    ("/v1/models/{model_id}", "get"): Operation(ModelCard, errors=_GET),
    ("/health", "get"): Operation(Status, errors=(500,)),
    ("/ready", "get"): Operation(Status, errors=(500,), also={503: Status}),
    ("/load", "get"): Operation(Load, errors=(401, 500)),
    ("/metrics", "get"): Operation(ok_media="text/plain", errors=(401, 500)),
    ("/tokenize", "post"): Operation(Tokenized, errors=_TOKENS),
    ("/detokenize", "post"): Operation(Detokenized, errors=_TOKENS),
    ("/version", "get"): Operation(Version, errors=(500,)),
    (KEPT_TRACK_PATH + "/{key}", "get"): Operation(KeptTrack, errors=_GET),
    (KV_EVENTS_PATH, "get"): Operation(KVEventsAnswer, errors=(400, 401, 500, 503)),
}
