"""External engines: replicas that are someone else's OpenAI-compatible server (vLLM, SGLang, llama.cpp).

A variant with `engine: external` gives a command template (argv, each string may hold
placeholders), the path that answers 200 once it serves (`ready_path`), and how to read its load
(`metrics`: an adapter over its Prometheus text; tandem.schedule.engine_loads). A backend renders the
template with the port it picked and runs it like a tandem replica, under `tandem.cluster.tether`
so the server still goes when the gateway that started it is gone.

Placeholders (`str.format` fields): PLACEHOLDERS. `{api_key}` is the fleet's secret (the bearer
token the gateway sends every replica): an external replica gets it only where its template asks,
best in `env` (`{VLLM_API_KEY: "{api_key}"}`), since a command line is visible to every user of
the node (the gateway's own log lines carry it as [redacted] either way: tandem.edge.redact).
Without it, an external replica gets no secret at all, and serves unauthenticated on its port
(bind it to loopback, or to a private network).
"""

from __future__ import annotations

import string
import sys
from dataclasses import dataclass

__all__ = [
    "FLEET_SECRET_ENV",
    "METRICS_ADAPTERS",
    "PLACEHOLDERS",
    "ExternalEngine",
    "external_command",
    "render",
    "template_fields",
]

FLEET_SECRET_ENV = "TANDEM_FLEET_SECRET"  # Settings.fleet_secret, read by each tandem replica

PLACEHOLDERS = {
    "port": "the port the backend picked for this replica",
    "host": "the address to bind (the backend's host; on Ray the node's address)",
    "model": "the variant's model (a path or a hub name, as the engine takes it)",
    "threads": "the variant's threads (CPU engines: llama.cpp's --n_threads)",
    "served_model_name": 'the name clients put in "model" (what the gateway serves as)',
    "replica_id": "the gateway's name for this replica",
    "variant": "the variant's name",
    "region": "the replica's region",
    "accelerators": "accelerators (GPUs) per replica, as an integer (vLLM's --tensor-parallel-size)",
    "api_key": "the fleet's secret: the bearer token the gateway sends (best passed in env)",
}

METRICS_ADAPTERS = ("vllm", "sglang", "llamacpp", "none")


def template_fields(text: str) -> list[str]:
    """The placeholder names in one template string (ValueError when it is not a valid template)."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(text):
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(f"{text!r}: write a placeholder as {{name}} (no conversions or formats); a literal "
                             "brace is {{ or }}")  # fmt: skip
        names.append(name)
    return names


@dataclass(frozen=True)
class ExternalEngine:
    """How to run and watch a server tandem did not build (see the module's docstring)."""

    command: tuple[str, ...]  # argv template; the first item is the program
    ready_path: str = "/health"  # GET answers 200 once it serves
    env: tuple[tuple[str, str], ...] = ()  # more environment, values are templates too
    metrics_adapter: str = "none"  # one of METRICS_ADAPTERS
    metrics_path: str = "/metrics"
    served_model_name: str | None = None  # {served_model_name}; None: the variant's model

    def __post_init__(self) -> None:
        if not self.command or not self.command[0]:
            raise ValueError("an external engine needs a command (a list: the program, then its arguments)")
        if self.metrics_adapter not in METRICS_ADAPTERS:
            raise ValueError(f"unknown metrics adapter {self.metrics_adapter!r} (known: {', '.join(METRICS_ADAPTERS)})")
        for path in (self.ready_path, self.metrics_path):
            if not path.startswith("/"):
                raise ValueError(f"a path must start with / (got {path!r})")
        for text in (*self.command, *(value for _, value in self.env)):
            unknown = [name for name in template_fields(text) if name not in PLACEHOLDERS]
            if unknown:
                raise ValueError(f"{text!r}: unknown placeholder {{{unknown[0]}}} (known: {', '.join(PLACEHOLDERS)})")

    @property
    def fields(self) -> set[str]:
        return {name for text in (*self.command, *(v for _, v in self.env)) for name in template_fields(text)}

    @property
    def wants_secret(self) -> bool:
        return "api_key" in self.fields


def render(template: str, values: dict[str, str]) -> str:
    """One template string with its placeholders filled (KeyError names a placeholder without a value)."""
    return template.format_map(values)


def external_command(
    engine: ExternalEngine,
    values: dict[str, str],
    *,
    parent_pid: int | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The argv that runs an external engine: its rendered template, under the tether when the backend
    gives its pid (the server goes when that process does, even after a SIGKILL)."""
    argv = [render(part, values) for part in engine.command]
    if parent_pid is None:
        return argv
    return [python, "-m", "tandem.cluster.tether", "--parent-pid", str(parent_pid), "--", *argv]
