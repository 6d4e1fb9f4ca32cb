"""Request bodies of the OpenAI API, as strict pydantic models (they are also the OpenAPI schema).

Strict: "5" is not an integer and true is not a number, as in OpenAI's API. Unknown fields are
ignored (clients send newer OpenAI fields), but fields tandem cannot honour with a non-default
value (penalties, logit_bias, tools, suffix...) are refused later with a 400 naming them, rather
than silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "StreamOptions",
    "MAX_STOP_STRINGS",
    "MAX_LOGPROBS",
]

MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20  # the engine returns at most 20 alternatives per token

_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


def _reword(handler: ValidatorFunctionWrapHandler, value: Any, message: str) -> Any:
    # A union's own error lists every member it tried; one sentence says it better.
    try:
        return handler(value)
    except ValidationError:
        raise ValueError(message) from None


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


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


class _SamplingFields(BaseModel):
    """Fields both endpoints share."""

    model_config = _STRICT

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions vLLM also accepts (the openai client passes them through extra_body).
    top_k: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None

    @field_validator("stop", mode="wrap")
    @classmethod
    def _stop(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        value = _reword(handler, value, "must be a string or a list of strings")
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
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
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
