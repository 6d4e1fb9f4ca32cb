"""Run a Plan's choices through the AsyncEngine: merged outputs with metrics, or collected results.

Every choice is one engine request; closing the iterator aborts whatever is still running and
counts it as finished_reason="abort".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from tandem.engine import RequestOutput, TokenLogprob
from tandem.serve.metrics import ServerMetrics
from tandem.serve.plan import Choice, Plan
from tandem.serve.served import ServedModel
from tandem.serve.streaming import merge

__all__ = ["Generation", "ChoiceResult", "cached_prompt_tokens"]


def cached_prompt_tokens(plan: Plan, cached: dict[int, int]) -> int:
    """Prompt tokens served from the prefix cache, counted once per prompt as usage counts prompt
    tokens: the first choice's of each prompt (cached: choice index -> its cached tokens)."""
    first = {}
    for choice in plan.choices:
        first.setdefault(choice.prompt_index, choice.index)
    return sum(cached.get(index, 0) for index in first.values())


@dataclass
class ChoiceResult:
    """A finished choice, for non-streaming responses."""

    choice: Choice
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # when the plan scores prompts (echo)
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served


class Generation:
    def __init__(
        self,
        served: ServedModel,
        metrics: ServerMetrics,
        plan: Plan,
        request_id: str,
        clock: Callable[[], float],
        priority: int = 0,
    ) -> None:
        self.served, self.metrics, self.plan = served, metrics, plan
        self.request_id, self.clock, self.priority = request_id, clock, priority
        self.arrival = clock()

    async def _run(self, choice: Choice) -> AsyncIterator[RequestOutput]:
        timer = self.metrics.timer(self.arrival)
        finished = False
        stream = self.served.async_engine.generate(
            self.plan.prompts[choice.prompt_index],
            choice.params,
            request_id=f"{self.request_id}-{choice.index}",
            group=self.request_id,  # the choices share the KV slots fairly with other requests
            priority=self.priority,
            tables=self.plan.tables,
            # a resumed stream (tandem.serve.continuation)
            **({"continued": self.plan.continued, "released": self.plan.released} if self.plan.continued else {}),
        )
        try:
            async with aclosing(stream) as outputs:
                async for out in outputs:
                    if out.new_token_ids:
                        timer.on_tokens(self.clock())
                    if out.finished:
                        finished = True
                        timer.on_finish(
                            out.finish_reason or "stop",
                            self.clock(),
                            out.metrics,
                            len(out.prompt_token_ids),
                            len(out.token_ids),
                        )
                    yield out
        finally:
            if not finished:
                timer.on_finish("abort", self.clock())

    def outputs(self) -> AsyncIterator[tuple[Choice, RequestOutput]]:
        """(choice, incremental output) in arrival order, across all choices."""
        choices = self.plan.choices

        async def tagged() -> AsyncIterator[tuple[Choice, RequestOutput]]:
            async with aclosing(merge([self._run(c) for c in choices])) as merged:
                async for position, out in merged:
                    yield choices[position], out

        return tagged()

    async def collect(self) -> list[ChoiceResult]:
        """Run every choice to the end; results in choice order."""
        results = {c.index: ChoiceResult(c) for c in self.plan.choices}
        async with aclosing(self.outputs()) as outputs:
            async for choice, out in outputs:
                result = results[choice.index]
                result.text, result.num_tokens = out.text, len(out.token_ids) + self.plan.continued
                result.num_cached_tokens = out.num_cached_tokens
                result.logprobs.extend(out.logprobs or ())
                if out.prompt_logprobs is not None:
                    result.prompt_logprobs = out.prompt_logprobs
                if out.finished:
                    result.finish_reason, result.stop_reason = out.finish_reason, out.stop_reason
        return [results[c.index] for c in self.plan.choices]
