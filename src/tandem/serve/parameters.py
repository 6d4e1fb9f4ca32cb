"""Request fields outside the schema: accepted only where they ask for nothing tandem would not do.

The request models (tandem.serve.schemas) keep fields they do not declare (`model_extra`), and
every route runs `refuse_unimplemented` on them before any work: a parameter that OpenAI's or
vLLM's server accepts but tandem does not implement passes only at its no-op value (null, or the
default listed here: `use_beam_search: false`, `skip_special_tokens: true`, what many clients send
explicitly) and is otherwise a 400 naming it; a name neither API knows is a 400 too. Nothing a
client sends is ignored silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from tandem.edge.errors import APIError

__all__ = ["COMPLETION_NO_OPS", "CHAT_NO_OPS", "TOKENIZE_NO_OPS", "refuse_unimplemented"]

# vLLM's sampling and serving extras both endpoints accept, with the values that change nothing here.
_VLLM_SHARED: dict[str, tuple[Any, ...]] = {
    "use_beam_search": (False,),
    "length_penalty": (1.0,),
    "allowed_token_ids": (),
    "prompt_logprobs": (),
    "skip_special_tokens": (True,),  # tandem's text never holds special tokens
    "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (),
    "logits_processors": (),
    "request_id": (),
    "return_tokens_as_token_ids": (False,),
    "return_token_ids": (False,),
    "cache_salt": (),
    "kv_transfer_params": (),
    "vllm_xargs": (),
    "mm_processor_kwargs": (),
}
COMPLETION_NO_OPS: dict[str, tuple[Any, ...]] = {**_VLLM_SHARED, "prompt_embeds": ()}
CHAT_NO_OPS: dict[str, tuple[Any, ...]] = {
    **_VLLM_SHARED,
    "best_of": (1,),
    "echo": (False,),  # vLLM's chat echo (the last message)
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template": (),
    "chat_template_kwargs": (),
    "documents": (),
    # OpenAI's chat fields with no effect on a text-only model without tools or storage.
    "store": (False,),
    "metadata": (),
    "service_tier": ("auto", "default"),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
    "functions": (),
    "function_call": ("none", "auto"),
    "verbosity": (),
    "prompt_cache_key": (),
    "safety_identifier": (),
}
TOKENIZE_NO_OPS: dict[str, tuple[Any, ...]] = {
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template": (),
    "chat_template_kwargs": (),
    "tools": (),
    "mm_processor_kwargs": (),
}


def _same(value: Any, default: Any) -> bool:
    # True == 1 in Python; a JSON true is not the number 1.
    if isinstance(value, bool) or isinstance(default, bool):
        return isinstance(value, bool) and isinstance(default, bool) and value == default
    return value == default


def refuse_unimplemented(request: BaseModel, no_ops: Mapping[str, tuple[Any, ...]]) -> None:
    """400 naming the first field outside the schema that is unknown or asks for something tandem lacks."""
    for name, value in (request.model_extra or {}).items():
        if name not in no_ops:
            raise APIError(400, f"{name}: unknown parameter", param=name, code="unknown_parameter")
        if value is not None and not any(_same(value, default) for default in no_ops[name]):
            raise APIError(
                400,
                f"{name}: not supported by this server (leave it out or at its default)",
                param=name,
                code="unsupported_parameter",
            )
