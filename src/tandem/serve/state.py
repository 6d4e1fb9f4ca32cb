"""ServerState: what the routes share: config, the served model once loaded, admission, metrics, clocks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tandem.serve.admission import Admission
from tandem.serve.config import ServerConfig
from tandem.serve.errors import APIError
from tandem.serve.metrics import EngineStats, ServerMetrics
from tandem.serve.served import ServedModel

__all__ = ["ServerState"]


@dataclass
class ServerState:
    config: ServerConfig
    clock: Callable[[], float]  # monotonic seconds, for latencies
    wall_clock: Callable[[], float]  # unix seconds, for "created" fields
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    admission: Admission = field(default_factory=lambda: Admission(capacity=0))
    served: ServedModel | None = None
    load_error: str | None = None

    @property
    def ready(self) -> bool:
        return self.served is not None and not self.admission.draining

    def drain(self) -> None:
        """Stop admitting requests (shutdown began); in-flight ones carry on."""
        self.admission.draining = True

    def require_model(self) -> ServedModel:
        """The served model, or a 503 that says why there is none."""
        if self.served is not None:
            return self.served
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}", code="model_load_failed")
        raise APIError(
            503,
            "the model is still loading; GET /ready answers 200 once it is served",
            code="model_loading",
            headers={"Retry-After": "1"},
        )

    def set_served(self, served: ServedModel) -> None:
        self.served = served
        self.admission.capacity = served.num_slots + self.config.max_queue
        self.admission.retry_after_s = self.config.retry_after_s
        engine, async_engine = served.engine, served.async_engine
        self.metrics.bind(
            served.name,
            served.recipe,
            lambda: EngineStats(
                running=async_engine.num_running,
                waiting=async_engine.num_waiting,
                # Prefilled or taken from the prefix cache, as vLLM counts prompt tokens.
                prompt_tokens=engine.num_prompt_tokens + engine.prefix_cache_hits,
                generation_tokens=engine.num_generated_tokens,
                drafted_tokens=engine.num_drafted_tokens,
                accepted_tokens=engine.num_accepted_tokens,
                prefix_cache_queries=engine.prefix_cache_queries,
                prefix_cache_hits=engine.prefix_cache_hits,
            ),
        )
