"""tandem.engine: one replica's execution: continuous batching over a paged KV cache (shared prefix
blocks), sampling, async serving."""

from tandem.engine.async_engine import AsyncEngine
from tandem.engine.batcher import Batcher, StepPlan
from tandem.engine.engine import Engine, EngineConfig, PromptTooLongError, RequestError
from tandem.engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from tandem.engine.sampling_params import GrammarSpec, SamplingParams

__all__ = [
    "AsyncEngine",
    "Batcher",
    "Engine",
    "EngineConfig",
    "GrammarSpec",
    "PromptTooLongError",
    "RequestError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "StepPlan",
    "TokenLogprob",
]
