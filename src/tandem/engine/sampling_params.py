"""SamplingParams: how one request is decoded. Validated on construction with errors naming the field."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["GrammarSpec", "SamplingParams", "GREEDY_BELOW_TEMPERATURE", "MAX_LOGIT_BIAS", "REPETITION_PENALTY_RANGE"]

GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on a logit_bias value (either sign)
# Far beyond any useful penalty (1-2), and near enough to 1 that a float32 logit divided or multiplied
# by it stays finite (a penalty of 1e-300 would turn logits into inf and the sampler's input into NaN).
REPETITION_PENALTY_RANGE = (0.01, 100.0)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


GRAMMAR_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint on the output (tandem.engine.grammar compiles it): kind, and its text: a JSON
    schema (json), a regex, a JSON list of strings (choice), a Lark or GBNF grammar; json_object: ""."""

    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16  # 0: score the prompt only (with prompt_logprobs), generate nothing
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return per token (0: only the sampled one)
    include_stop_str_in_output: bool = False
    # Logprobs of every prompt token given the ones before it, with this many top alternatives (vLLM's
    # prompt_logprobs; echo with logprobs in the completions API). Such a request computes its whole
    # prompt: it never takes its prefix from the prefix cache.
    prompt_logprobs: int | None = None
    # Logits processors (tandem.engine.processors), as vLLM and OpenAI define them:
    presence_penalty: float = 0.0  # minus this for every token already generated (OpenAI)
    frequency_penalty: float = 0.0  # minus this times how often each token was generated (OpenAI)
    repetition_penalty: float = 1.0  # tokens in the prompt or output: positive logits / it, negative * it
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit); a mapping is accepted
    min_tokens: int = 0  # EOS and stop_token_ids are impossible (and stop strings unchecked) before this many
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one (after temperature)
    bad_words: tuple[str, ...] = ()  # words never generated (the engine tokenizes them as vLLM does)
    grammar: GrammarSpec | None = None  # structured output: only tokens the grammar allows, EOS once it is complete

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(dict.fromkeys(self.stop_token_ids)))  # deduplicated
        if isinstance(self.bad_words, str):
            object.__setattr__(self, "bad_words", (self.bad_words,))
        object.__setattr__(self, "bad_words", tuple(self.bad_words))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple((token, value) for token, value in bias))
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int) or not 0 <= self.prompt_logprobs <= 20
        ):
            raise ValueError(f"prompt_logprobs must be an integer in [0, 20], got {self.prompt_logprobs!r}")
        self._check_processors()

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2], got {value!r}")
        low, high = REPETITION_PENALTY_RANGE
        if not _number(self.repetition_penalty) or not low <= self.repetition_penalty <= high:
            raise ValueError(f"repetition_penalty must be a number in [{low}, {high}], got {self.repetition_penalty!r}")
        if not _number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be a number in [0, 1], got {self.min_p!r}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        for token, value in self.logit_bias:
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not _number(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for token {token}")
        if any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise ValueError("bad_words must be a list of non-blank strings")

    @property
    def processes_logits(self) -> bool:
        """Whether any logits processor applies (most requests: none, and the engine skips them)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
            or self.bad_words
        )

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows float32: the limit is greedy decoding anyway.
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @classmethod
    def greedy_params(cls, max_tokens: int = 16, **kwargs) -> SamplingParams:
        return cls(max_tokens=max_tokens, temperature=0.0, **kwargs)
