"""vLLM's utility routes: POST /tokenize, POST /detokenize, GET /version (same request and response shapes).

/tokenize counts what the generation routes would run: a prompt tokenized as completions do, or
messages rendered and tokenized as chat completions do (`count` equals those requests'
`usage.prompt_tokens`). `model` may be left out; if given it must be the served one.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

import tandem
from tandem.edge.bodies import ParsedBodyRoute
from tandem.edge.errors import APIError
from tandem.serve.bounds import check_detokenize_tokens, check_prompt_text
from tandem.serve.parameters import TOKENIZE_NO_OPS, refuse_unimplemented
from tandem.serve.plan import chat_prompt_ids, check_model_name
from tandem.serve.schemas import DetokenizeRequest, TokenizeRequest
from tandem.serve.served import ServedModel
from tandem.serve.state import ServerState

__all__ = ["build_tokens_router"]


def _tokenize(served: ServedModel, body: TokenizeRequest) -> dict:
    limits = served.limits
    if body.prompt is not None:
        check_prompt_text(body.prompt, "prompt", limits.max_model_len)  # before tokenizing: bounded work
    if body.messages is not None:
        ids = chat_prompt_ids(limits, body.messages, body.add_special_tokens)
    else:
        ids = limits.encode(body.prompt, True if body.add_special_tokens is None else body.add_special_tokens)
    answer = {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids, "token_strs": None}
    if body.return_token_strs:
        answer["token_strs"] = served.token_strs(ids)
    return answer


def build_tokens_router(state: ServerState) -> APIRouter:
    router = APIRouter(route_class=ParsedBodyRoute)

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        """Token ids of a prompt or of chat messages (as chat completions render them)."""
        served = state.require_model()
        refuse_unimplemented(body, TOKENIZE_NO_OPS)
        if body.model is not None:
            check_model_name(body.model, served.name)
        return await asyncio.to_thread(_tokenize, served, body)  # a long prompt must not stall the loop

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        """The text of token ids (special tokens included, as vLLM)."""
        served = state.require_model()
        refuse_unimplemented(body, {})
        if body.model is not None:
            check_model_name(body.model, served.name)
        check_detokenize_tokens(body.tokens, served.max_model_len)
        vocab = served.limits.vocab_size
        outside = [t for t in body.tokens if vocab is not None and t >= vocab]
        if outside:
            raise APIError(
                400,
                f"tokens: token id {outside[0]} is outside the vocabulary [0, {vocab})",
                param="tokens",
                code="invalid_value",
            )
        return {"prompt": await asyncio.to_thread(served.detokenize, body.tokens)}

    @router.get("/version")
    async def version() -> dict:
        """The tandem version serving."""
        return {"version": tandem.__version__}

    return router
