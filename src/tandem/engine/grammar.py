"""Grammars: a request's output constraint (JSON Schema, regex, choice, Lark/GBNF grammar) as a
per-sequence matcher over the model's tokenizer, compiled once per spec. No torch.

The grammar engine is llguidance (Microsoft's Rust library behind Guidance, also a vLLM backend).
Measured against xgrammar on the bundled tokenizer (benchmarks/grammar_engines.py): schema compile
1.4 ms vs 7.4 ms, mask 38 us vs 4 us per token (mean; a decode step of the bundled model is a few
ms); it refuses a schema keyword it does not implement by name ("Unimplemented keys:
[\"uniqueItems\"]") where xgrammar compiles it and ignores it, and it reads tokenizer.json as is.

A GrammarState is one sequence's position in its grammar: the engine asks it for the next-token
mask (tandem.engine.grammar_mask, the torch side), and Sequence.append advances it with every
token it keeps; a grammar that admits nothing more but EOS ends its sequence.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from tandem.engine.errors import RequestError
from tandem.engine.sampling_params import GrammarSpec

__all__ = ["GrammarCompiler", "GrammarError", "GrammarState", "grammar_text"]

CACHE_SIZE = 256  # compiled grammars kept (least recently used dropped first)
# Compact JSON: whitespace the schema does not need is never generated (a small model left free to
# emit whitespace can loop on it until max_tokens).
_JSON_OPTIONS = {"whitespace_flexible": False}


class GrammarError(RequestError):
    """The spec does not compile; the message names the problem (an unknown keyword, a bad regex...)."""


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar for a spec (raises GrammarError on a spec that is not even well-formed)."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if spec.kind in ("json", "json_object"):
        schema = spec.value if spec.kind == "json" else '{"type": "object"}'
        try:
            return LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not a JSON object: {exc}") from None
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.value)
    if spec.kind == "choice":
        choices = json.loads(spec.value)
        # Lark string literals take JSON's escapes.
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    if spec.kind == "grammar":
        try:
            return LLMatcher.grammar_from_lark(any_to_lark(spec.value))  # Lark as is; GBNF (llama.cpp's) converted
        except Exception as exc:  # the converter's own error types
            raise GrammarError(f"the grammar does not parse: {exc}") from None
    raise GrammarError(f"unknown grammar kind {spec.kind!r}")


class GrammarState:
    """One sequence's matcher: the mask of allowed next tokens, and advancing by kept tokens."""

    def __init__(self, matcher, eos_id: int, vocab_size: int) -> None:
        self._matcher = matcher
        self.eos_id = eos_id
        self.vocab_size = vocab_size  # the mask's width in tokens
        # Bitmasks computed since the last kept token, by the draft tokens after it: a speculative
        # step asks for the same positions twice (the draft model's proposals, then verification).
        self.masks: dict[tuple[int, ...], object] = {}

    def write_mask(self, address: int, num_bytes: int) -> None:
        """Write the allowed-token bitmask (bit t of 32-bit word t // 32) into memory at `address`."""
        self._matcher.unsafe_compute_mask_ptr(address, num_bytes)

    def consume(self, token_id: int) -> bool:
        """Advance by a kept token; False when the grammar forbids it (the matcher is then in error)."""
        self.masks.clear()
        return bool(self._matcher.consume_token(token_id))

    def forced_after(self, token_ids: list[int], limit: int) -> list[int]:
        """The tokens the grammar forces after token_ids (its only way on, tokenized canonically: the
        `","age":` between two JSON fields), at most `limit`; [] when token_ids leave the grammar or
        nothing is forced. The state does not change."""
        taken = self.advance(token_ids)
        forced: list[int] = []
        if taken == len(token_ids) and not self.finished:
            forced = list(self._matcher.compute_ff_tokens()[:limit])
            forced = forced[: self.valid_prefix(forced)]
        self.rollback(taken)
        return forced

    def advance(self, token_ids: list[int]) -> int:
        """Consume the longest allowed prefix of token_ids (never entering an error); its length."""
        return int(self._matcher.try_consume_tokens(token_ids)) if token_ids else 0

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of token_ids, in order, the grammar allows from here (the state does not change)."""
        return int(self._matcher.validate_tokens(token_ids)) if token_ids else 0

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)

    @property
    def finished(self) -> bool:
        """Nothing but EOS may follow (the output is complete), or the matcher failed."""
        return self._matcher.is_stopped() or self._matcher.is_error()

    @property
    def accepting(self) -> bool:
        return self._matcher.is_accepting()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None


class GrammarCompiler:
    """Compiles specs against one tokenizer, caching each compiled grammar by its spec (thread-safe:
    the server checks specs on its planning threads while the engine thread builds states)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Iterable[int]) -> None:
        from llguidance import LLTokenizer

        eos = sorted(eos_ids)
        self.vocab_size = vocab_size
        self.eos_id = eos[0]
        self._tokenizer = LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos)
        self._cache: OrderedDict[GrammarSpec, object] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0  # cache misses, for tests and metrics
        self.compile_seconds = 0.0

    def _compiled(self, spec: GrammarSpec):
        with self._lock:
            matcher = self._cache.get(spec)
            if matcher is not None:
                self._cache.move_to_end(spec)
                return matcher
        from llguidance import LLMatcher

        started = time.perf_counter()
        matcher = LLMatcher(self._tokenizer, grammar_text(spec), log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        with self._lock:
            self.num_compiled += 1
            self.compile_seconds += time.perf_counter() - started
            self._cache[spec] = matcher
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher

    def check(self, spec: GrammarSpec) -> None:
        """Raise GrammarError naming what is wrong with the spec (and cache it when it compiles)."""
        self._compiled(spec)

    def state(self, spec: GrammarSpec) -> GrammarState:
        """A fresh matcher for one sequence (a copy of the cached compiled one: microseconds)."""
        return GrammarState(self._compiled(spec).deep_copy(), self.eos_id, self.vocab_size)
