"""Request bodies of the OpenAI API, as strict pydantic models (they are also the OpenAPI schema).

Strict: "5" is not an integer and true is not a number, as in OpenAI's API. A request body keeps
the fields it does not declare, and the route refuses them with a 400 naming them unless they are
a known no-op (tandem.serve.parameters); declared fields tandem cannot honour with a non-default
value (tools, suffix, ...) are refused the same way. Nothing is ignored silently.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from tandem.serve.bounds import (  # the bounds' table is there
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
)

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "DetokenizeRequest",
    "StreamOptions",
    "TokenizeRequest",
    "MAX_BAD_WORDS",
    "MAX_LOGIT_BIAS",
    "MAX_STOP_STRINGS",
    "MAX_LOGPROBS",
]

_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")
# Request bodies keep undeclared fields for the route to refuse by name (tandem.serve.parameters).
_REQUEST = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


def _reword(handler: ValidatorFunctionWrapHandler, value: Any, message: str) -> Any:
    # A union's own error lists every member it tried; one sentence says it better.
    try:
        return handler(value)
    except ValidationError:
        raise ValueError(message) from None


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage (so far) on every chunk; guidellm always sends it


class ContentPart(BaseModel):
    model_config = _STRICT
    type: str
    text: str | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"content parts of type {value!r} are not supported; this model reads text only")
        return value


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls (tandem.serve.tools)
    tool_call_id: str | None = None  # a tool result: the call it answers

    @field_validator("content", mode="wrap")
    @classmethod
    def _content(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, list):
            return handler(value)  # part errors are already specific
        return _reword(handler, value, "must be a string, a list of text parts, or null")

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


class TandemContinue(BaseModel):
    """A resumed stream's continuation (tandem.edge.resume_wire): output ids already generated elsewhere,
    and how many characters of their text the client already has."""

    model_config = ConfigDict(strict=True, extra="forbid")
    token_ids: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    text_sent: int = Field(0, ge=0)


class _SamplingFields(BaseModel):
    """Fields both endpoints share."""

    model_config = _REQUEST

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # Token id (as a string, OpenAI's form) -> a bias added to its logit.
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(None, max_length=MAX_LOGIT_BIAS)
    user: str | None = None
    # vLLM's: the Batcher admits waiting requests lowest first (ties: arrival); a gateway's x-tandem-priority wins.
    priority: int = Field(0, ge=-(2**31), lt=2**31)
    # Extensions vLLM also accepts (the openai client passes them through extra_body). Omitted
    # sampling fields default to the model's generation_config.json (`--generation-config auto`).
    top_k: int | None = Field(None, ge=-1)  # -1 or 0: no cut
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, ge=0.01, le=100)  # tandem.engine's REPETITION_PENALTY_RANGE
    min_tokens: int = Field(0, ge=0)
    bad_words: list[Annotated[str, Field(max_length=MAX_BAD_WORD_CHARS)]] | None = Field(None, max_length=MAX_BAD_WORDS)
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    include_stop_str_in_output: bool = False
    # Structured output (tandem.serve.structured): OpenAI's response_format, vLLM's structured_outputs
    # and its older guided_* names.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    tandem_continue: TandemContinue | None = None  # a resumed stream (tandem.serve.continuation)

    @field_validator("stop", mode="wrap")
    @classmethod
    def _stop(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        value = _reword(handler, value, "must be a string or a list of strings")
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        longest = max(map(len, stops), default=0)
        if longest > MAX_STOP_STRING_CHARS:
            raise ValueError(f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters, got {longest}")
        return value

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_SamplingFields):
    prompt: Prompt
    max_tokens: int | None = Field(None, ge=0)  # 0 with echo: score the prompt, generate nothing
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
    add_special_tokens: bool = True  # the tokenizer's BOS before a text prompt (vLLM's extra)

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        value = _reword(
            handler, value, "must be a string, a list of strings, a list of token ids, or a list of token-id lists"
        )
        if isinstance(value, list) and (not value or any(isinstance(p, list) and not p for p in value)):
            raise ValueError("must not be empty")
        return value

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (a string or a list of token ids each)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]
        return list(self.prompt)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None  # tandem.serve.tools
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    # The tokenizer's special tokens around the rendered chat; default: a BOS unless the template wrote one.
    add_special_tokens: bool | None = None


class TokenizeRequest(BaseModel):
    """vLLM's POST /tokenize: a text prompt, or chat messages rendered as chat completions would."""

    model_config = _REQUEST
    model: str | None = Field(None, min_length=1)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # default: as completions (prompt) or chat completions (messages)
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    """vLLM's POST /detokenize."""

    model_config = _REQUEST
    model: str | None = Field(None, min_length=1)
    tokens: list[Annotated[int, Field(ge=0)]]
