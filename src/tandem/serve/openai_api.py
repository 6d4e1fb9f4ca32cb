"""The OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models.

Each generation request goes: plan (all validation, 4xx before any work) -> admit (429/503) ->
run, then either one JSON body or a server-sent event stream ending in `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tandem.edge.bodies import ParsedBodyRoute
from tandem.edge.errors import APIError, error_body
from tandem.edge.keep_track import COMPLETIONS, KEPT_TRACK_HEADER, keeps_track
from tandem.edge.resume_wire import TOKEN_IDS_HEADER, ids_comment
from tandem.engine.async_engine import EngineStoppedError
from tandem.engine.outputs import RequestOutput
from tandem.serve import responses as R
from tandem.serve.admission import Lease
from tandem.serve.generation import ChoiceResult, Generation, cached_prompt_tokens
from tandem.serve.kept_tracks import keep_key
from tandem.serve.plan import Choice, Plan, plan_chat, plan_completion
from tandem.serve.priority import request_priority
from tandem.serve.schemas import ChatCompletionRequest, CompletionRequest
from tandem.serve.served import ServedModel
from tandem.serve.state import ServerState
from tandem.serve.streaming import SSE_DONE, ClientDisconnected, SSEResponse, sse, until_disconnect
from tandem.serve.tools import ToolCallStream, parse_tool_calls

__all__ = ["build_router"]

logger = logging.getLogger("tandem.serve")

_STOPPED = "the server shut down before the request finished"
# Sent when the shutdown deadline cuts a stream short: an error event the openai client raises, then [DONE].
_FAREWELL = sse(error_body(503, _STOPPED, code="shutting_down")) + SSE_DONE


def _model_card(served: ServedModel) -> dict:
    return {
        "id": served.name,
        "object": "model",
        "created": served.created,
        "owned_by": "tandem",
        "root": served.path,
        "max_model_len": served.max_model_len,
        "recipe": served.recipe,
        # What omitted sampling fields become (from generation_config.json; empty: the OpenAI API's).
        "sampling_defaults": dict(served.sampling_defaults),
    }


def _stream_error(exc: Exception) -> bytes:
    if isinstance(exc, EngineStoppedError):
        return sse(error_body(503, _STOPPED, code="shutting_down"))
    logger.exception("error while streaming a response")
    return sse(
        error_body(500, "internal server error while streaming; the server log has the details", code="internal_error")
    )


def _choice_usage(plan: Plan, choice, out) -> dict:
    """stream_options.continuous_usage_stats: one choice's usage so far, on each of its chunks (vLLM's)."""
    prompt, generated = len(plan.prompts[choice.prompt_index]) - plan.continued, len(out.token_ids) + plan.continued
    return R.usage(prompt, generated, out.num_cached_tokens)


def _computing_top1(plan: Plan) -> Plan:
    """The plan with its one choice computing each token's logprob and top-1 (for a kept track)."""
    (choice,) = plan.choices
    params = dataclasses.replace(choice.params, logprobs=max(choice.params.logprobs or 0, 1))
    return dataclasses.replace(plan, choices=[dataclasses.replace(choice, params=params)])


Keep = Callable[[str, list], None]  # (the completion's text, its TokenLogprobs) -> kept for the gate


ChunkOf = Callable[[Choice, RequestOutput], list[dict]]  # an output -> the events that send it (none: nothing new)


async def _events(
    gen: Generation,
    body: CompletionRequest | ChatCompletionRequest,
    chunk_of: ChunkOf,
    usage: Callable[[dict], dict],
    first: tuple[dict, ...] = (),
    ids: bool = False,
) -> AsyncIterator[bytes]:
    """One answer's server-sent events: `first`, then `chunk_of` each output, then usage if asked, then [DONE].
    With stream_options.continuous_usage_stats every event of a choice carries its usage so far (vLLM's).
    With `ids` (the gateway asked: tandem.edge.resume_wire) a comment names each output's new token ids.
    An error mid-stream is an error event (and [DONE]), never a cut connection."""
    plan = gen.plan
    tokens = {c.index: 0 for c in plan.choices}
    cached: dict[int, int] = {}
    continuous = bool(body.stream_options and body.stream_options.continuous_usage_stats)
    for chunk in first:
        yield sse(chunk)
    try:
        async with aclosing(gen.outputs()) as outputs:
            async for choice, out in outputs:
                tokens[choice.index] = len(out.token_ids)
                cached[choice.index] = out.num_cached_tokens
                if ids and out.new_token_ids:
                    yield ids_comment(choice.index, out.new_token_ids)
                for chunk in chunk_of(choice, out):
                    if continuous:
                        chunk["usage"] = _choice_usage(plan, choice, out)
                    yield sse(chunk)
    except Exception as exc:
        yield _stream_error(exc)
    else:
        if body.stream_options and body.stream_options.include_usage:
            generated = sum(tokens.values()) + plan.continued
            yield sse(usage(R.usage(plan.num_prompt_tokens, generated, cached_prompt_tokens(plan, cached))))
    yield SSE_DONE


def _completion_events(
    gen: Generation, body: CompletionRequest, created: int, rid: str, keep: Keep | None = None, ids: bool = False
) -> AsyncIterator[bytes]:
    served, plan = gen.served, gen.plan
    sends_logprobs = body.logprobs is not None  # a kept track's logprobs are computed, never sent
    kept: list = []
    offsets = {c.index: 0 for c in plan.choices}
    echoed = {c.index: not plan.echo for c in plan.choices}

    def chunk_of(choice: Choice, out: RequestOutput) -> dict | None:
        text, logprobs = out.new_text, None
        if keep is not None:
            kept.extend(out.logprobs or ())
            if out.finished:  # kept before the last chunk leaves: the gate may ask at once
                keep(out.text, kept)
        if not echoed[choice.index]:  # the first chunk echoes the prompt, then the first tokens (as vLLM)
            echoed[choice.index] = True
            prompt_text = plan.prompt_texts[choice.prompt_index]
            text = prompt_text + text
            if sends_logprobs:
                prompt_ids = plan.prompts[choice.prompt_index]
                entries = out.logprobs or []
                logprobs = R.echo_logprobs(prompt_ids, out.prompt_logprobs, entries, served.token_text, prompt_text)
                offsets[choice.index] = len(prompt_text) + sum(len(t) for t in logprobs["tokens"][len(prompt_ids) :])
        elif sends_logprobs:
            logprobs = R.completion_logprobs(out.logprobs or [], served.token_text, offsets[choice.index])
            offsets[choice.index] += sum(len(t) for t in logprobs["tokens"])
        if not (text or out.finished or (logprobs and logprobs["tokens"])):
            return []
        finish = out.finish_reason if out.finished else None
        return [R.completion_chunk(rid, created, served.name, choice.index, text, finish, logprobs, out.stop_reason)]

    usage = lambda use: R.usage_chunk(rid, "text_completion", created, served.name, use)
    return _events(gen, body, chunk_of, usage, ids=ids)


def _chat_events(
    gen: Generation, body: ChatCompletionRequest, created: int, rid: str, ids: bool = False
) -> AsyncIterator[bytes]:
    served, plan = gen.served, gen.plan
    calls = {c.index: ToolCallStream(plan.tools) for c in plan.choices} if plan.tools is not None else None

    def chunk_of(choice: Choice, out: RequestOutput) -> list[dict]:
        logprobs = None
        if choice.params.logprobs is not None:
            logprobs = R.chat_logprobs(out.logprobs or [], served.token_text)
        if calls is not None:  # the text is read as tool calls (tandem.serve.tools)
            stream = calls[choice.index]
            events = [
                R.chat_chunk(rid, created, served.name, choice.index, delta, None, None)
                for delta in stream.deltas(out.new_text, out.finished)
            ]
            if out.finished or (logprobs and logprobs["content"]):
                reason = stream.finish_reason(out.finish_reason) if out.finished else None
                events.append(
                    R.chat_chunk(rid, created, served.name, choice.index, {}, reason, logprobs, out.stop_reason)
                )
            return events
        if not (out.new_text or out.finished or (logprobs and logprobs["content"])):
            return []
        delta = {"content": out.new_text} if out.new_text else {}
        finish = out.finish_reason if out.finished else None
        return [R.chat_chunk(rid, created, served.name, choice.index, delta, finish, logprobs, out.stop_reason)]

    # The role first, as OpenAI does; clients get their first byte at once (a continuation's client has it).
    role = {"role": "assistant", "content": ""}
    first = tuple(R.chat_chunk(rid, created, served.name, c.index, role, None, None) for c in gen.plan.choices)
    usage = lambda use: R.usage_chunk(rid, "chat.completion.chunk", created, served.name, use)
    return _events(gen, body, chunk_of, usage, () if plan.continued else first, ids)


async def _collect(gen: Generation, lease: Lease, request: Request) -> list[ChoiceResult]:
    try:
        return await until_disconnect(gen.collect(), request.receive)
    except (EngineStoppedError, asyncio.CancelledError):
        # A cancellation here is uvicorn's shutdown deadline: answer 503 rather than drop the connection.
        raise APIError(503, _STOPPED, code="shutting_down") from None
    finally:
        lease.release()


def build_router(state: ServerState) -> APIRouter:
    router = APIRouter(route_class=ParsedBodyRoute)  # the body the edge parsed, not parsed twice

    def start(plan, rid: str, body, request: Request) -> tuple[Generation, Lease]:
        lease = state.admission.admit(len(plan.choices))
        priority = request_priority(request.headers, body.priority)
        return Generation(state.require_model(), state.metrics, plan, rid, state.clock, priority), lease

    async def planned(plan_request: Callable[..., Plan], body, served: ServedModel) -> Plan:
        """All of a request's checks, its tokenizing (and a chat's template) in a worker thread: a long
        prompt must not stall every other request."""
        config = state.config
        return await asyncio.to_thread(
            plan_request, body, served.limits, max_n=config.max_n, capacity=state.admission.capacity,
            share=config.max_request_share,
        )  # fmt: skip

    @router.get("/v1/models")
    async def list_models() -> dict:
        served = state.require_model()
        return {"object": "list", "data": [_model_card(served)]}

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict:
        served = state.require_model()
        if model_id != served.name:
            raise APIError(
                404,
                f"the model {model_id!r} does not exist; this server serves {served.name!r}",
                param="model",
                code="model_not_found",
            )
        return _model_card(served)

    @router.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        served = state.require_model()
        plan = await planned(plan_completion, body, served)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(state.wall_clock())
        keep: Keep | None = None
        key = keep_key(request.headers, state.config.fleet_secret)
        said: dict[str, str] = {}  # tells the gateway this answer's track is kept (it never guesses)
        if key is not None and keeps_track(
            COMPLETIONS, prompt=body.prompt, n=body.n, logprobs=body.logprobs, echo=body.echo
        ):
            plan, said = _computing_top1(plan), {KEPT_TRACK_HEADER: "1"}

            def keep(text: str, entries: list, key: str = key) -> None:
                state.kept.keep(key, text, R.completion_logprobs(entries, served.token_text))

        gen, lease = start(plan, rid, body, request)
        if body.stream:
            events = _completion_events(gen, body, created, rid, keep, request.headers.get(TOKEN_IDS_HEADER) == "1")
            return SSEResponse(events, on_close=lease.release, farewell=_FAREWELL, headers=said)
        try:
            results = await _collect(gen, lease, request)
        except ClientDisconnected:
            return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"
        choices = []
        for r in results:
            text, logprobs = r.text, None
            if plan.echo:  # the prompt, then the completion (OpenAI's legacy echo; vLLM does the same)
                prompt_text = plan.prompt_texts[r.choice.prompt_index]
                text = prompt_text + text
                if body.logprobs is not None:
                    prompt_ids = plan.prompts[r.choice.prompt_index]
                    logprobs = R.echo_logprobs(
                        prompt_ids, r.prompt_logprobs, r.logprobs, served.token_text, prompt_text
                    )
            elif body.logprobs is not None:
                logprobs = R.completion_logprobs(r.logprobs, served.token_text)
            choices.append(R.completion_choice(r.choice.index, text, r.finish_reason, logprobs, r.stop_reason))
        if keep is not None:
            keep(results[0].text, results[0].logprobs)
        cached = cached_prompt_tokens(plan, {r.choice.index: r.num_cached_tokens for r in results})
        use = R.usage(plan.num_prompt_tokens, sum(r.num_tokens for r in results), cached)
        return JSONResponse(R.completion_body(rid, created, served.name, choices, use), headers=said)

    @router.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        served = state.require_model()
        plan = await planned(plan_chat, body, served)  # the template is time-limited (tandem.model.chat_template)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(state.wall_clock())
        gen, lease = start(plan, rid, body, request)
        if body.stream:
            events = _chat_events(gen, body, created, rid, request.headers.get(TOKEN_IDS_HEADER) == "1")
            return SSEResponse(events, on_close=lease.release, farewell=_FAREWELL)
        try:
            results = await _collect(gen, lease, request)
        except ClientDisconnected:
            return Response(status_code=499)
        choices = []
        for r in results:
            logprobs = R.chat_logprobs(r.logprobs, served.token_text) if body.logprobs else None
            content, calls = parse_tool_calls(plan.tools, r.text) if plan.tools is not None else (r.text, [])
            choices.append(R.chat_choice(r.choice.index, content, r.finish_reason, logprobs, r.stop_reason, calls))
        cached = cached_prompt_tokens(plan, {r.choice.index: r.num_cached_tokens for r in results})
        use = R.usage(plan.num_prompt_tokens, sum(r.num_tokens for r in results), cached)
        return JSONResponse(R.chat_body(rid, created, served.name, choices, use))

    return router
