"""ServerState: what the routes share: config, the served model once loaded, admission, metrics, clocks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tandem.contracts import ReplicaLoad
from tandem.edge.errors import APIError
from tandem.edge.settings import Settings
from tandem.serve.admission import Admission
from tandem.serve.kept_tracks import KeptTracks
from tandem.serve.metrics import EngineStats, ServerMetrics
from tandem.serve.served import ServedModel

__all__ = ["ServerState"]


@dataclass
class ServerState:
    config: Settings
    clock: Callable[[], float]  # monotonic seconds, for latencies
    wall_clock: Callable[[], float]  # unix seconds, for "created" fields
    metrics: ServerMetrics = field(init=False)
    admission: Admission = field(default_factory=lambda: Admission(capacity=0))
    served: ServedModel | None = None
    load_error: str | None = None
    kept: KeptTracks = field(default_factory=KeptTracks)  # tracks the gateway's gate asked to keep

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.config.metrics_prefix)

    @property
    def ready(self) -> bool:
        return self.served is not None and not self.admission.draining

    def load(self, default_id: str) -> ReplicaLoad:
        """This replica's report to the scheduling layer (GET /load): what runs, what waits, KV in use.

        The identity is the one the gateway gave it (--replica-id ...); a replica started by hand
        reports `default_id` (its address), the region "local" and its recipe as the variant.
        """
        config, served = self.config, self.served
        engine = served.engine if served is not None else None
        return ReplicaLoad(
            replica_id=config.replica_id or default_id,
            region=config.replica_region,
            variant=config.replica_variant or (served.recipe if served is not None else (config.recipe or "")),
            running=served.async_engine.num_running if served is not None else 0,
            waiting=served.async_engine.num_waiting if served is not None else 0,
            kv_used=engine.kv_used if engine is not None else 0.0,
            healthy=self.ready,
            prefill_tokens=served.async_engine.prefill_tokens if served is not None else 0,
        )

    def kv_scheme(self) -> dict[str, int | None]:
        """How this replica names its KV blocks (tandem.contracts.kv_block_hash): None while loading."""
        engine = self.served.engine if self.served is not None else None
        return {
            "block_size": engine.kv_block_size if engine is not None else None,
            "hash_seed": engine.kv_hash_seed if engine is not None else None,
        }

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
        engine.on_step = self.metrics.bind(
            served.name,
            served.recipe,
            served.max_model_len,
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
                kv_used=engine.kv_used,
                drafts=engine.num_spec_rows,
                accepted_per_position=tuple(engine.accepted_per_position),
            ),
        )
