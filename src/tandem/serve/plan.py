"""From a validated request to what the engine runs: tokenized prompts and per-choice SamplingParams.

Everything a request can get wrong that pydantic cannot see (an unknown model, a prompt or
max_tokens beyond the context, token ids outside the vocabulary, unsupported OpenAI options) is
found here, before any engine work starts, and raised as an APIError naming the field. No I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from tandem.edge.errors import APIError
from tandem.engine import GrammarSpec, PromptTooLongError, RequestError, SamplingParams
from tandem.model import ChatTemplateError
from tandem.serve.bounds import check_messages, check_prompt_text, check_sequences, check_stop_token_ids
from tandem.serve.continuation import check_continuable, continued_ids, continued_max_tokens, continued_params
from tandem.serve.parameters import CHAT_NO_OPS, COMPLETION_NO_OPS, refuse_unimplemented
from tandem.serve.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from tandem.serve.structured import check_grammar, requested_grammar
from tandem.serve.tools import ToolPlan, hermes_text, plan_tools

__all__ = [
    "Choice",
    "Plan",
    "ModelLimits",
    "plan_completion",
    "plan_chat",
    "chat_prompt_ids",
    "check_model_name",
]

# Completions default to 16 tokens as in OpenAI's API; chat defaults to the rest of the context.
COMPLETION_DEFAULT_MAX_TOKENS = 16
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class ModelLimits:
    """What planning needs to know about the served model."""

    name: str
    max_model_len: int
    encode: Callable[[str, bool], list[int]]  # (text, add_special_tokens) -> ids
    validate_ids: Callable[[list[int]], list[int]]  # raises RequestError (e.g. ids outside the vocabulary)
    render_chat: Callable[..., str]  # (messages[, tools]) -> text; raises ChatTemplateError
    bos_token: str | None = None
    decode: Callable[[list[int]], str] | None = None  # ids -> text (echo of a token-id prompt)
    vocab_size: int | None = None  # logit_bias and stop_token_ids ids must be below it
    # SamplingParams -> its precomputed logits-processor tables (Engine.processor_tables); raises RequestError
    prepare_tables: Callable[[SamplingParams], Any] | None = None
    # What an omitted sampling field becomes (request field -> value), from the model's
    # generation_config.json unless --generation-config vllm; missing keys: the OpenAI API's defaults.
    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
    # Compiles a grammar spec (cached), raising RequestError naming its problem; None: no checks.
    check_grammar: Callable[[GrammarSpec], None] | None = None
    tool_call_parser: str | None = None  # --tool-call-parser: how tool_choice "auto" reads the model's calls
    template_renders_tool_calls: bool = True  # else an assistant's tool_calls are written into its content


@dataclass(frozen=True)
class Choice:
    index: int  # the choice's index in the response: prompt_index * n + j
    prompt_index: int
    params: SamplingParams


@dataclass(frozen=True)
class Plan:
    prompts: list[list[int]]  # token ids of each distinct prompt
    choices: list[Choice]
    echo: bool = False  # completions: each choice's text (and logprobs) start with its prompt's
    prompt_texts: tuple[str, ...] = ()  # with echo: each prompt as text
    tools: ToolPlan | None = None  # chat with tool_choice other than "none": the output is read as tool calls
    # The choices' logits-processor tables, built once here (off the event loop) and shared by them all
    tables: Any = None
    # A resumed stream (tandem.serve.continuation): the prompt's last `continued` ids are output
    # generated elsewhere, of whose text the client has `released` characters.
    continued: int = 0
    released: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts) - self.continued


def check_model_name(requested: str, served: str) -> None:
    if requested != served:
        raise APIError(
            404,
            f"the model {requested!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )


def _refuse_unsupported(req: CompletionRequest | ChatCompletionRequest) -> None:
    refuse_unimplemented(req, COMPLETION_NO_OPS if isinstance(req, CompletionRequest) else CHAT_NO_OPS)
    unsupported: list[tuple[str, bool]] = []
    if isinstance(req, CompletionRequest):
        unsupported += [
            ("suffix", req.suffix is not None),
            ("best_of", req.best_of is not None and req.best_of != req.n),
        ]
    for name, used in unsupported:
        if used:
            raise APIError(
                400,
                f"{name}: not supported by this server (leave it at its default)",
                param=name,
                code="unsupported_parameter",
            )
    if req.stream_options is not None and not req.stream:
        raise APIError(
            400, "stream_options: only allowed when stream is true", param="stream_options", code="invalid_value"
        )


def _check_prompt(limits: ModelLimits, ids: list[int], param: str) -> list[int]:
    try:
        return limits.validate_ids(ids)
    except PromptTooLongError:
        raise APIError(
            400,
            f"This model's maximum context length is {limits.max_model_len} tokens. However, your {param} has "
            f"{len(ids)} tokens, and at least one token must remain for the output. Please shorten it.",
            param=param,
            code="context_length_exceeded",
        ) from None
    except RequestError as exc:
        raise APIError(400, f"{param}: {exc}", param=param, code="invalid_value") from None


def _max_tokens(
    limits: ModelLimits, requested: int | None, prompt_len: int, default: int | None, param: str, prompt_param: str
) -> int:
    room = limits.max_model_len - prompt_len
    if requested is None:
        return min(default, room) if default is not None else room
    if requested > room:
        raise APIError(
            400,
            f"This model's maximum context length is {limits.max_model_len} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the {prompt_param}, {requested} for the "
            f"completion). Please reduce the {prompt_param} or {param}.",
            param=param,
            code="context_length_exceeded",
        )
    return requested


def _temperature(value: float) -> float:
    # Dividing logits by a tiny temperature overflows them to inf and the sampler to NaN (failing
    # every sequence in that engine step); below vLLM's threshold, sample greedily instead.
    return 0.0 if value < GREEDY_BELOW_TEMPERATURE else value


# An omitted field's value when the model's generation config names none (the OpenAI API's).
_OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
_PARAMS_FIELDS = frozenset(f.name for f in fields(SamplingParams))


def _logit_bias(req: CompletionRequest | ChatCompletionRequest, vocab_size: int | None) -> dict[int, float]:
    bias = {}
    for key, value in (req.logit_bias or {}).items():
        if not (key.isascii() and key.isdigit()):
            raise APIError(
                400, f"logit_bias: keys must be token ids, got {key!r}", param="logit_bias", code="invalid_value"
            )
        token = int(key)
        if vocab_size is not None and token >= vocab_size:
            raise APIError(
                400,
                f"logit_bias: token id {token} is outside the vocabulary [0, {vocab_size})",
                param="logit_bias",
                code="invalid_value",
            )
        bias[token] = value
    return bias


def _sampling_params(
    req: CompletionRequest | ChatCompletionRequest,
    limits: ModelLimits,
    max_tokens: int,
    choice: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    grammar: GrammarSpec | None = None,
) -> SamplingParams:
    seed = req.seed
    if seed is not None and choice:
        seed = (seed + choice) % 2**63  # n choices with one seed must still differ from each other

    def given_or_default(name: str) -> Any:
        value = getattr(req, name)
        return value if value is not None else limits.sampling_defaults.get(name, _OPENAI_DEFAULTS[name])

    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_temperature(given_or_default("temperature")),
            # The sampler compares in float32, where a top_p below ~1e-38 is 0 and keeps no token at all;
            # any top_p this small means "the top token only", as 1e-6 does.
            top_p=max(given_or_default("top_p"), 1e-6),
            top_k=max(given_or_default("top_k"), 0),  # vLLM's -1: no cut
            min_p=given_or_default("min_p"),
            repetition_penalty=given_or_default("repetition_penalty"),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=_logit_bias(req, limits.vocab_size),
            min_tokens=req.min_tokens,
            bad_words=tuple(req.bad_words or ()),
            seed=seed,
            stop=req.stop_list(),
            stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            grammar=grammar,
        )
    except ValueError as exc:  # the schema's ranges catch most; cross-field rules (min_tokens) land here
        name = str(exc).split(" ", 1)[0]
        raise APIError(400, str(exc), param=name if name in _PARAMS_FIELDS else None, code="invalid_value") from None


def _check_fields(req: CompletionRequest | ChatCompletionRequest, limits: ModelLimits) -> None:
    """The bounds tied to the model (tandem.serve.bounds), before any tokenizing."""
    check_stop_token_ids(req.stop_token_ids or (), limits.vocab_size)


def _tables(limits: ModelLimits, choices: list[Choice]) -> Any:
    """The processor tables every choice shares (they differ only in their seed), or None when none applies."""
    params = choices[0].params
    if limits.prepare_tables is None or not params.processes_logits:
        return None
    try:
        return limits.prepare_tables(params)
    except RequestError as exc:
        name = str(exc).split(":", 1)[0].split("[", 1)[0]
        raise APIError(400, str(exc), param=name if name in _PARAMS_FIELDS else None, code="invalid_value") from None


def plan_completion(
    req: CompletionRequest, limits: ModelLimits, *, max_n: int, capacity: int, share: float = 1.0
) -> Plan:
    """`capacity`: the sequences the replica runs or queues at once; one request may hold `share` of them."""
    check_model_name(req.model, limits.name)
    _refuse_unsupported(req)
    _check_fields(req, limits)
    if req.max_tokens == 0 and not req.echo:
        raise APIError(
            400,
            "max_tokens: 0 generates nothing; it is allowed only with echo (to score the prompt)",
            param="max_tokens",
            code="invalid_value",
        )
    prompts = req.prompts()
    check_sequences(req.n, len(prompts), max_n=max_n, capacity=capacity, share=share)
    for p_index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            check_prompt_text(
                prompt, "prompt" if isinstance(req.prompt, str) else f"prompt[{p_index}]", limits.max_model_len
            )
    grammar = _grammar(requested_grammar(req), limits)
    generated = check_continuable(req, grammar, None)
    # echo with logprobs scores the prompt too (teacher forcing, as OpenAI's legacy API and vLLM).
    prompt_logprobs = req.logprobs if req.echo else None
    choices, all_ids, texts = [], [], []
    for p_index, prompt in enumerate(prompts):
        ids = limits.encode(prompt, req.add_special_tokens) if isinstance(prompt, str) else list(prompt)
        ids = _check_prompt(limits, ids, "prompt")
        if req.echo:
            texts.append(prompt if isinstance(prompt, str) else _decode(limits, ids))
        default = limits.sampling_defaults.get("max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)
        max_tokens = _max_tokens(limits, req.max_tokens, len(ids), default, "max_tokens", "prompt")
        if generated:
            max_tokens = continued_max_tokens(max_tokens, generated)
            ids = _check_prompt(limits, continued_ids(req, ids), "tandem_continue")
        all_ids.append(ids)
        for j in range(req.n):
            params = _sampling_params(req, limits, max_tokens, j, req.logprobs, prompt_logprobs, grammar)
            choices.append(Choice(p_index * req.n + j, p_index, continued_params(params, generated)))
    return Plan(
        all_ids, choices, echo=req.echo, prompt_texts=tuple(texts), tables=_tables(limits, choices),
        continued=generated, released=req.tandem_continue.text_sent if generated else 0,
    )  # fmt: skip


def _grammar(requested: tuple[str, GrammarSpec] | None, limits: ModelLimits) -> GrammarSpec | None:
    if requested is None:
        return None
    param, spec = requested
    check_grammar(param, spec, limits.check_grammar)
    return spec


def _decode(limits: ModelLimits, ids: list[int]) -> str:
    if limits.decode is None:
        raise APIError(400, "echo: this server cannot decode token-id prompts", param="echo", code="invalid_value")
    return limits.decode(ids)


def plan_chat(
    req: ChatCompletionRequest, limits: ModelLimits, *, max_n: int, capacity: int, share: float = 1.0
) -> Plan:
    check_model_name(req.model, limits.name)
    _refuse_unsupported(req)
    _check_fields(req, limits)
    check_sequences(req.n, 1, max_n=max_n, capacity=capacity, share=share)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs", code="invalid_value")
    tools, tool_grammar = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, limits.tool_call_parser)
    requested = requested_grammar(req)
    if tool_grammar is not None and requested is not None:
        raise APIError(
            400,
            f"{requested[0]}: one output constraint per request, and tool_choice {json.dumps(req.tool_choice)} is one",
            param=requested[0],
            code="invalid_value",
        )
    grammar = _grammar(tool_grammar or requested, limits)
    generated = check_continuable(req, grammar, tools)
    prompt_ids = chat_prompt_ids(limits, req.messages, req.add_special_tokens, req.tools)
    ids = _check_prompt(limits, prompt_ids, "messages")
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = _max_tokens(limits, requested, len(ids), limits.sampling_defaults.get("max_tokens"), param, "messages")
    if generated:
        max_tokens = continued_max_tokens(max_tokens, generated)
        ids = _check_prompt(limits, continued_ids(req, ids), "tandem_continue")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    choices = [
        Choice(j, 0, continued_params(_sampling_params(req, limits, max_tokens, j, logprobs, None, grammar), generated))
        for j in range(req.n)
    ]
    return Plan(
        [ids], choices, tools=tools, tables=_tables(limits, choices), continued=generated,
        released=req.tandem_continue.text_sent if generated else 0,
    )  # fmt: skip


def _message(m: ChatMessage, limits: ModelLimits) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.name:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = m.tool_calls
        if not limits.template_renders_tool_calls:  # the calls must still reach the model
            out["content"] = "\n".join(t for t in (out["content"], hermes_text(m.tool_calls)) if t)
    return out


def chat_prompt_ids(
    limits: ModelLimits, messages: list[ChatMessage], add_special_tokens: bool | None, tools: list | None = None
) -> list[int]:
    """The token ids chat completions run for `messages` (the template's text with a generation prompt,
    and the tools where given); POST /tokenize counts the same. A ChatTemplateError is a 400 naming messages."""
    check_messages([m.text() for m in messages], limits.max_model_len)  # before rendering: bounded work
    rendered = [_message(m, limits) for m in messages]
    try:
        text = limits.render_chat(rendered, tools) if tools else limits.render_chat(rendered)
    except ChatTemplateError as exc:
        raise APIError(400, f"messages: {exc}", param="messages", code="invalid_value") from None
    if add_special_tokens is None:
        # A template that writes the BOS token itself must not get a second one from the tokenizer.
        add_special_tokens = not (limits.bos_token and text.startswith(limits.bos_token))
    return limits.encode(text, add_special_tokens)
