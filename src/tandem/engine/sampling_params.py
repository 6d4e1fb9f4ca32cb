"""SamplingParams: how one request is decoded. Validated on construction with errors naming the field."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SamplingParams", "GREEDY_BELOW_TEMPERATURE"]

GREEDY_BELOW_TEMPERATURE = 1e-5


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

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
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

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows float32: the limit is greedy decoding anyway.
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @classmethod
    def greedy_params(cls, max_tokens: int = 16, **kwargs) -> SamplingParams:
        return cls(max_tokens=max_tokens, temperature=0.0, **kwargs)
