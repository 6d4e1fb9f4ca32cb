"""ServedModel: the loaded model, its recipe and the running AsyncEngine the HTTP layer talks to.

`load_served_model(config)` is the one place the layers are wired together for serving: load the
model, apply the recipe through the optimizer registry, start an engine sized by the config.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tandem.edge.settings import Settings
from tandem.engine import AsyncEngine, Engine, EngineConfig
from tandem.serve.plan import ModelLimits

__all__ = ["ServedModel", "load_served_model", "resolve_recipe"]

logger = logging.getLogger("tandem.serve")


@dataclass
class ServedModel:
    name: str  # what clients put in "model"
    recipe: str  # the canonical recipe string the optimizers produced
    path: str
    async_engine: AsyncEngine
    limits: ModelLimits
    created: int  # unix time the model was loaded (GET /v1/models reports it)
    token_text: Callable[[int], str]  # one token id -> its text, for logprobs

    @property
    def engine(self) -> Engine:
        return self.async_engine.engine

    @property
    def sampling_defaults(self) -> Mapping[str, Any]:
        """What omitted request fields become (from generation_config.json; empty: the OpenAI API's)."""
        return self.limits.sampling_defaults

    @property
    def num_slots(self) -> int:
        return self.engine.batcher.num_slots

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def detokenize(self, ids: list[int]) -> str:
        """Token ids -> text, special tokens included (POST /detokenize, as vLLM)."""
        return self.engine.model.tokenizer.decode(ids, skip_special_tokens=False)

    def token_strs(self, ids: list[int]) -> list[str]:
        """Each id's token as the vocabulary spells it (POST /tokenize's token_strs, as vLLM)."""
        tokenizer = self.engine.model.tokenizer
        return [tokenizer.id_to_token(t) or "" for t in ids]

    def shutdown(self) -> None:
        self.async_engine.shutdown()


def resolve_recipe(recipe: str | None) -> str:
    """The recipe to serve: the one asked for, else the bench's current best (read at call time)."""
    from tandem.optimize import defaults

    return defaults.recipe_or_default(recipe)


def _usable(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The generation config's defaults that SamplingParams accepts; the others are logged and skipped
    (a value the engine refuses would otherwise fail every request that omits the field)."""
    from tandem.engine import SamplingParams

    usable = {}
    for name, value in defaults.items():
        try:
            SamplingParams(**{name: value, "max_tokens": value if name == "max_tokens" else 16})
        except ValueError as exc:
            logger.warning("generation_config.json: %s; requests that omit %s get the API's default", exc, name)
        else:
            usable[name] = value
    return usable


def load_served_model(config: Settings, created: int) -> ServedModel:
    """Load, optimize and start the engine. Raises ModelLoadError, RecipeError or ValueError."""
    from tandem.model import load_model
    from tandem.model.generation_config import sampling_defaults
    from tandem.optimize import apply_recipe

    model = load_model(config.model, dtype=config.dtype, max_model_len=config.max_model_len)
    optimized = apply_recipe(model, resolve_recipe(config.recipe))
    engine = Engine(
        optimized,
        EngineConfig(
            max_model_len=config.max_model_len,
            kv_cache_tokens=config.kv_cache_tokens,
            max_num_seqs=config.max_num_seqs,
            max_prefill_tokens=config.max_prefill_tokens,
            num_threads=config.threads,
            enable_prefix_caching=config.enable_prefix_caching,
            max_request_share=config.max_request_share,
        ),
    )
    tokenizer = model.tokenizer
    limits = ModelLimits(
        name=config.served_model_name or model.name,
        max_model_len=engine.max_model_len,
        encode=lambda text, special: tokenizer.encode(text, add_special_tokens=special),
        validate_ids=engine.validate_prompt,
        render_chat=lambda messages, tools=None: tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tools=tools
        ),
        bos_token=tokenizer.bos_token,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        vocab_size=model.config.vocab_size,
        check_grammar=engine.check_grammar,
        tool_call_parser=config.tool_call_parser,
        template_renders_tool_calls="tool_calls" in (tokenizer.chat_template or ""),
        prepare_tables=engine.processor_tables,
        sampling_defaults=_usable(sampling_defaults(model.generation_defaults))
        if config.generation_config == "auto"
        else {},
    )
    # Logprobs name up to 21 tokens per generated token, on the event loop: each id is decoded once.
    token_text = functools.lru_cache(maxsize=model.config.vocab_size)(
        lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False)
    )
    return ServedModel(
        name=limits.name,
        recipe=optimized.recipe,
        path=str(model.path),
        async_engine=AsyncEngine(engine),
        limits=limits,
        created=created,
        token_text=token_text,
    )
